#include "supervisor.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "ddp/error.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "hang_watch.h"
#include "heartbeat.h"
#include "round_state.h"
#include "worker_output.h"
#include "worker_process.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kStderrTailLines = 20;

// Reads what is available on `fd` into `sink`; closes it and sets it to -1 at end of stream.
void pump(int& fd, WorkerOutput& sink) {
  char buffer[65536];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      sink.write(buffer, static_cast<std::size_t>(n));
      if (static_cast<std::size_t>(n) < sizeof(buffer)) return;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    sink.finish();
    close(fd);
    fd = -1;
    return;
  }
}

}  // namespace

struct Supervisor::Worker {
  int local_rank = 0;
  int rank = 0;
  std::string error_file;
  std::string recorder_file;  // DDP_FLIGHT_RECORDER_FILE: the worker's flight recorder
  std::string live_file;      // DDP_LIVE_METRICS_FILE, with --metrics-port; else ""
  std::string abort_file;     // DDP_ABORT_FILE (comm/abort_notice.h)
  std::unique_ptr<WorkerProcess> process;
  std::unique_ptr<WorkerOutput> out;
  std::unique_ptr<WorkerOutput> err;
};

Supervisor::Supervisor(const LaunchConfig& config, const EnvMap& agent_env, std::string program,
                       std::string log_root, SignalInbox& inbox, std::string hostname)
    : config_(config),
      agent_env_(agent_env),
      program_(std::move(program)),
      log_root_(std::move(log_root)),
      inbox_(inbox),
      hostname_(std::move(hostname)) {}

Supervisor::~Supervisor() = default;

std::string Supervisor::worker_dir(int round, int local_rank) const {
  return log_root_ + "/attempt_" + std::to_string(round) + "/" + std::to_string(local_rank);
}

std::string Supervisor::trace_dir(int round) const {
  if (agent_env_.count("DDP_TRACE_DIR") != 0) return "";
  return log_root_ + "/attempt_" + std::to_string(round);
}

bool Supervisor::started_for(const NodeAssignment& node) const {
  return started_ && started_->round == node.round && started_->group_rank == node.group_rank &&
         started_->group_world_size == node.group_world_size &&
         started_->rank_offset == node.rank_offset && started_->world_size == node.world_size;
}

void Supervisor::discard() {
  workers_.clear();  // each WorkerProcess kills its group and reaps it
  started_.reset();
}

void Supervisor::start(const NodeAssignment& node, const std::string& store_host, int store_port) {
  discard();
  std::vector<std::string> argv = config_.command;
  argv[0] = program_;
  for (int lr = 0; lr < config_.nproc_per_node; ++lr) {
    Worker w;
    w.local_rank = lr;
    w.rank = node.rank_offset + lr;
    const std::string dir = worker_dir(node.round, lr);
    std::filesystem::create_directories(dir);
    w.error_file = dir + "/error.json";
    std::filesystem::remove(w.error_file);  // a stale file would be taken for this run's error
    w.recorder_file = dir + "/flight_recorder.bin";
    std::filesystem::remove(w.recorder_file);
    w.abort_file = dir + "/abort";
    std::filesystem::remove(w.abort_file);
    if (config_.metrics_port != 0) {
      w.live_file = dir + "/live_metrics.bin";
      std::filesystem::remove(w.live_file);
    }
    const unsigned redirected = config_.redirects.for_rank(lr);
    const unsigned to_file = redirected | config_.tee.for_rank(lr);
    const bool shown = !config_.local_ranks_filter || config_.local_ranks_filter->count(lr) != 0;
    w.out = std::make_unique<WorkerOutput>(w.rank,
                                           shown && !(redirected & kStdout) ? STDOUT_FILENO : -1,
                                           to_file & kStdout ? dir + "/stdout.log" : "", 0);
    w.err = std::make_unique<WorkerOutput>(
        w.rank, shown && !(redirected & kStderr) ? STDERR_FILENO : -1,
        to_file & kStderr ? dir + "/stderr.log" : "", kStderrTailLines);
    EnvMap env =
        worker_environment(agent_env_, config_, node, {lr, w.error_file}, store_host, store_port);
    env["DDP_FLIGHT_RECORDER_FILE"] = w.recorder_file;
    env["DDP_ABORT_FILE"] = w.abort_file;
    if (!w.live_file.empty()) env["DDP_LIVE_METRICS_FILE"] = w.live_file;
    if (const std::string traces = trace_dir(node.round); !traces.empty()) {
      env["DDP_TRACE_DIR"] = traces;
    }
    w.process = std::make_unique<WorkerProcess>(argv, env);
    workers_.push_back(std::move(w));
  }
  started_ = node;
  if (board_ != nullptr) {
    std::vector<WorkerView> views;
    for (const Worker& w : workers_) {
      views.push_back({w.rank, w.local_rank, WorkerRunState::kRunning, w.live_file});
    }
    board_->workers_started(node.group_rank, node.round, std::move(views));
  }
}

RoundOutcome Supervisor::supervise(const NodeAssignment& node, Rendezvous& rendezvous) {
  std::vector<Worker>& workers = workers_;
  const bool elastic = config_.min_nodes < config_.max_nodes;
  RoundStateMachine round(
      {config_.shutdown_timeout, std::max(config_.monitor_interval, rendezvous.monitor_floor())},
      Clock::now());

  const auto act = [&](RoundAction action) {
    if (action == RoundAction::kNone) return;
    const int sig = action == RoundAction::kKillWorkers ? SIGKILL : round.stop_signal();
    for (auto& w : workers) w.process->signal_group(sig);
  };
  // A cause the workers cannot see (a node that vanished without closing its connections, or
  // the store's host gone so): their collectives give up now rather than at their timeout.
  bool aborted = false;
  const auto abort_collectives = [&](const std::string& reason) {
    if (aborted) return;
    aborted = true;
    for (auto& w : workers) {
      const std::string partial = w.abort_file + ".partial";
      std::ofstream(partial) << reason << "\n";
      std::error_code ignored;
      std::filesystem::rename(partial, w.abort_file, ignored);
    }
  };
  const auto base_report = [&]() {
    FailureReport r;
    r.node_rank = node.group_rank;
    r.hostname = hostname_;
    r.timestamp = static_cast<long long>(std::time(nullptr));
    return r;
  };
  // Tells the other nodes; returns the group's first failure as the store holds it.
  const auto publish = [&](const FailureReport& mine) {
    try {
      return rendezvous.publish_failure(node.round, mine);
    } catch (const ddp::StoreError& e) {
      ddp::log::warn("could not tell the other nodes about the failure: {}", e.what());
      return mine;
    }
  };

  std::vector<WatchedWorker> watched;
  for (const auto& w : workers) {
    watched.push_back({w.rank, w.local_rank, static_cast<int>(w.process->pid()), w.recorder_file});
  }
  HangWatch::Options hang_options;
  hang_options.period = std::max(hang_options.period, config_.monitor_interval);
  HangWatch hangs(rendezvous.monitor_store(node.round, "hang"), node.group_rank,
                  node.group_world_size, hostname_, std::move(watched), hang_options);

  HeartbeatMonitor heartbeat(node.group_world_size, config_.rdzv.keep_alive_interval,
                             config_.rdzv.keep_alive_max_attempt, Clock::now());
  const bool watches_heartbeats = rendezvous.watches_heartbeats() && node.group_world_size > 1;
  // Heartbeats (heartbeat.h): this node's beat, and on the store's agent the others' check.
  const auto watch_heartbeats = [&](Clock::time_point now, bool any_running) {
    if (round.state() != RoundState::kRunning || !any_running) return;
    if (node.group_world_size > 1 && heartbeat.beat_due(now)) {
      rendezvous.beat(node.round, node.group_rank, 1);
    }
    if (!watches_heartbeats || !heartbeat.check_due(now)) return;
    const auto lost =
        heartbeat.observe(rendezvous.beats(node.round, node.group_world_size), Clock::now());
    if (lost.empty()) return;
    FailureReport r = base_report();
    r.kind = "lost";
    r.node_rank = lost.front();
    r.hostname = rendezvous.node_host(node.round, lost.front());
    r.exit_code = ddp::exit_code::kComm;
    r.message = fmt::format(
        "no heartbeat for {:.1f} s: its pod vanished without closing its connections "
        "(deleted, powered off, or cut off from the network)",
        std::chrono::duration<double>(heartbeat.limit()).count());
    const FailureReport root = publish(r);
    ddp::log::error("{}; stopping this node's workers", root.headline());
    if (root.kind == "lost") abort_collectives(root.headline());
    round.other_node_failed(root, now);
  };

  for (;;) {
    bool pipes_open = false;
    std::vector<pollfd> fds = {{inbox_.fd(), POLLIN, 0}};
    for (auto& w : workers) {
      for (int* fd : {&w.process->stdout_fd(), &w.process->stderr_fd()}) {
        if (*fd >= 0) {
          fds.push_back({*fd, POLLIN, 0});
          pipes_open = true;
        }
      }
    }
    const bool any_running = std::any_of(workers.begin(), workers.end(),
                                         [](const Worker& w) { return w.process->running(); });
    if (round.finished(any_running, pipes_open, Clock::now())) break;

    const auto wait_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(round.next_wake() - Clock::now());
    const int rc =
        poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(0, wait_ms.count())));
    if (rc < 0 && errno != EINTR) throw ddp::Error("poll failed: " + std::string(strerror(errno)));

    for (auto& w : workers) {
      if (w.process->stdout_fd() >= 0) pump(w.process->stdout_fd(), *w.out);
      if (w.process->stderr_fd() >= 0) pump(w.process->stderr_fd(), *w.err);
    }

    for (int s = inbox_.take(); s != 0; s = inbox_.take()) {
      if (s == SIGCHLD) continue;  // exits are collected below in any case
      if (round.signal_kills_now()) {
        ddp::log::warn("received {} while stopping: killing the workers now", signal_name(s));
        act(round.signalled_again());
        continue;
      }
      ddp::log::warn("received {}: forwarding it to the workers (SIGKILL in {:.1f} s)",
                     signal_name(s), config_.shutdown_timeout.count() / 1000.0);
      FailureReport r = base_report();
      r.kind = "agent";
      r.signal = s;
      r.exit_code = 128 + s;
      r.message = "the node was asked to stop";
      round.agent_signalled(s, r, publish(r), Clock::now());
    }

    std::vector<pid_t> pids;
    for (auto& w : workers) {
      pids.push_back(w.process->pid());
      if (!w.process->try_reap()) continue;
      const ExitStatus& st = w.process->status();
      if (w.process->stderr_fd() >= 0) pump(w.process->stderr_fd(), *w.err);
      if (board_ != nullptr) {
        board_->worker_exited(w.local_rank, st.code == 0 ? WorkerRunState::kSucceeded
                                            : round.reports_worker_failures()
                                                ? WorkerRunState::kFailed
                                                : WorkerRunState::kStopped);
      }
      if (st.code == 0) {
        ddp::log::debug("rank {} finished", w.rank);
        continue;
      }
      if (!round.reports_worker_failures()) continue;  // a consequence of the stop
      FailureReport r = base_report();
      r.rank = w.rank;
      r.local_rank = w.local_rank;
      r.pid = w.process->pid();
      r.exit_code = st.code;
      r.signal = st.signal;
      r.stderr_tail.assign(w.err->tail().begin(), w.err->tail().end());
      if (auto file = read_worker_error_file(w.error_file)) {
        r.message = file->first;
        r.worker_error_json = file->second.substr(0, 256 * 1024);
      }
      r.hang_diagnosis = hangs.diagnosis();
      const FailureReport root_cause = publish(r);
      if (root_cause.to_json() == r.to_json()) {
        ddp::log::error("{}; stopping this node's workers", r.headline());
      } else {
        ddp::log::error("{}, after the group failed: {}", r.headline(), root_cause.headline());
      }
      round.worker_failed(root_cause, Clock::now());
    }
    reap_orphans(pids);

    const auto now = Clock::now();
    const RoundAction due = round.tick(now);
    if (due == RoundAction::kKillWorkers) {
      ddp::log::warn("workers still running {:.1f} s after the stop signal: sending SIGKILL",
                     round.kill_after().count() / 1000.0);
    }
    act(due);
    if (round.state() == RoundState::kRunning && any_running) hangs.tick(now);
    try {
      watch_heartbeats(now, any_running);
      if (round.monitor_due(now, any_running)) {
        if (auto f = rendezvous.failure(node.round)) {
          if (elastic && f->is_membership_change()) {
            ddp::log::info("stopping this node's workers for the next round: {}", f->headline());
          } else {
            ddp::log::error("stopping this node's workers: {}", f->headline());
          }
          if (f->kind == "lost") abort_collectives(f->headline());
          round.other_node_failed(*f, now);
        } else if (node.group_world_size < config_.max_nodes) {
          if (const int waiting = rendezvous.nodes_waiting(node.round); waiting > 0) {
            FailureReport r = base_report();
            r.kind = "membership";
            r.exit_code = 0;
            r.message = std::to_string(waiting) + " node" + (waiting == 1 ? "" : "s") +
                        " waiting to join the " + std::to_string(node.group_world_size) +
                        " running; the group grows at its next round";
            const FailureReport first = publish(r);
            ddp::log::info("stopping this node's workers for the next round: {}", first.headline());
            round.other_node_failed(first, now);
          }
        }
      }
    } catch (const ddp::StoreError& e) {
      ddp::log::error("lost the rendezvous store ({}); stopping this node's workers", e.what());
      abort_collectives(e.what());
      round.store_lost(e.what(), now);
    }
  }

  std::vector<ExitStatus> statuses;
  for (const auto& w : workers) statuses.push_back(w.process->status());
  if (auto revision = round.settle(statuses)) {
    try {
      rendezvous.revise_failure(node.round, revision->first, revision->second);
      round.set_root_cause(revision->second);
    } catch (const ddp::StoreError& e) {
      ddp::log::warn("could not tell the other nodes the workers' exit code: {}", e.what());
    }
  }
  started_.reset();
  RoundOutcome outcome = round.outcome();
  if (outcome.root_cause && outcome.root_cause->hang_diagnosis.empty()) {
    outcome.root_cause->hang_diagnosis = hangs.diagnosis();
  }
  return outcome;
}

}  // namespace ddprun
