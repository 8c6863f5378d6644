#include "supervisor.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <memory>
#include <vector>

#include "ddp/error.h"
#include "ddp/log.h"
#include "worker_output.h"
#include "worker_process.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kStderrTailLines = 20;
// After the last worker is reaped, how long to keep reading output that is still in the pipes.
constexpr auto kDrainTime = std::chrono::seconds(2);
// How long workers may take to exit on their own after a collective failure (see stop_all).
constexpr auto kConsequenceGrace = std::chrono::seconds(2);

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
    const unsigned redirected = config_.redirects.for_rank(lr);
    const unsigned to_file = redirected | config_.tee.for_rank(lr);
    const bool shown = !config_.local_ranks_filter || config_.local_ranks_filter->count(lr) != 0;
    w.out = std::make_unique<WorkerOutput>(w.rank,
                                           shown && !(redirected & kStdout) ? STDOUT_FILENO : -1,
                                           to_file & kStdout ? dir + "/stdout.log" : "", 0);
    w.err = std::make_unique<WorkerOutput>(
        w.rank, shown && !(redirected & kStderr) ? STDERR_FILENO : -1,
        to_file & kStderr ? dir + "/stderr.log" : "", kStderrTailLines);
    const EnvMap env =
        worker_environment(agent_env_, config_, node, {lr, w.error_file}, store_host, store_port);
    w.process = std::make_unique<WorkerProcess>(argv, env);
    workers_.push_back(std::move(w));
  }
  started_ = node;
}

RoundOutcome Supervisor::supervise(const NodeAssignment& node, Rendezvous& rendezvous) {
  std::vector<Worker>& workers = workers_;
  RoundOutcome outcome;
  std::optional<FailureReport> own_agent_record;  // published when ddprun was signalled
  bool stopping = false;                          // the round is over for this node
  bool signalled = false;  // the stop signal went out: later exits are its consequences
  bool killed = false;
  int stop_signal = SIGTERM;
  Clock::time_point signal_at{};
  Clock::time_point kill_at{};
  std::optional<Clock::time_point> all_reaped_at;
  auto next_monitor = Clock::now() + config_.monitor_interval;

  // `grace`: the failure so far is a collective failure, most likely the echo of a worker that
  // is dying more slowly; let workers exit on their own for a moment so that the real cause is
  // reported, not masked by the stop signal.
  const auto stop_all = [&](int signal, bool grace) {
    const auto now = Clock::now();
    const auto when =
        grace ? now + std::min<Clock::duration>(kConsequenceGrace, config_.shutdown_timeout) : now;
    if (!stopping) {
      stopping = true;
      stop_signal = signal;
      signal_at = when;
    } else if (!signalled) {
      stop_signal = signal;
      signal_at = std::min(signal_at, when);
    }
  };
  const auto send_stop_signal = [&]() {
    signalled = true;
    const int sig = config_.shutdown_timeout.count() == 0 ? SIGKILL : stop_signal;
    for (auto& w : workers) w.process->signal_group(sig);
    killed = sig == SIGKILL;
    kill_at = Clock::now() + config_.shutdown_timeout;
  };
  const auto base_report = [&]() {
    FailureReport r;
    r.node_rank = node.group_rank;
    r.hostname = hostname_;
    r.timestamp = static_cast<long long>(std::time(nullptr));
    return r;
  };
  const auto publish = [&](const FailureReport& mine) {
    try {
      return rendezvous.publish_failure(node.round, mine);
    } catch (const ddp::StoreError& e) {
      ddp::log::warn("could not tell the other nodes about the failure: {}", e.what());
      return mine;
    }
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
    if (!any_running) {
      if (!all_reaped_at) all_reaped_at = Clock::now();
      if (!pipes_open || Clock::now() - *all_reaped_at > kDrainTime) break;
    }

    auto wake = next_monitor;
    if (stopping && !signalled) wake = std::min(wake, signal_at);
    if (signalled && !killed) wake = std::min(wake, kill_at);
    if (!any_running) wake = std::min(wake, *all_reaped_at + kDrainTime);
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now());
    const int rc =
        poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(0, wait_ms.count())));
    if (rc < 0 && errno != EINTR) throw ddp::Error("poll failed: " + std::string(strerror(errno)));

    for (auto& w : workers) {
      if (w.process->stdout_fd() >= 0) pump(w.process->stdout_fd(), *w.out);
      if (w.process->stderr_fd() >= 0) pump(w.process->stderr_fd(), *w.err);
    }

    for (int s = inbox_.take(); s != 0; s = inbox_.take()) {
      if (s == SIGCHLD) continue;  // exits are collected below in any case
      if (signalled) {
        ddp::log::warn("received {} while stopping: killing the workers now", signal_name(s));
        for (auto& w : workers) w.process->signal_group(SIGKILL);
        killed = true;
        continue;
      }
      ddp::log::warn("received {}: forwarding it to the workers (SIGKILL in {:.1f} s)",
                     signal_name(s), config_.shutdown_timeout.count() / 1000.0);
      outcome.kind = RoundOutcome::Kind::kInterrupted;
      outcome.signal = s;
      FailureReport r = base_report();
      r.kind = "agent";
      r.signal = s;
      r.exit_code = 128 + s;
      r.message = "the node was asked to stop";
      outcome.root_cause = publish(r);
      if (outcome.root_cause->to_json() == r.to_json()) own_agent_record = r;
      stop_all(s, false);
    }

    std::vector<pid_t> pids;
    for (auto& w : workers) {
      pids.push_back(w.process->pid());
      if (!w.process->try_reap()) continue;
      const ExitStatus& st = w.process->status();
      if (w.process->stderr_fd() >= 0) pump(w.process->stderr_fd(), *w.err);
      if (st.code == 0) {
        ddp::log::debug("rank {} finished", w.rank);
        continue;
      }
      // Exits after the stop signal are its consequences; before it, a worker's exit is its
      // own doing and is reported even while stopping for another node's failure (it may be
      // the real cause, only slower to exit than the peer whose collective it broke).
      if (signalled || outcome.kind == RoundOutcome::Kind::kInterrupted) continue;
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
      outcome.kind = RoundOutcome::Kind::kFailed;
      outcome.root_cause = publish(r);
      if (outcome.root_cause->to_json() == r.to_json()) {
        ddp::log::error("{}; stopping this node's workers", r.headline());
      } else {
        ddp::log::error("{}, after the group failed: {}", r.headline(),
                        outcome.root_cause->headline());
      }
      stop_all(SIGTERM, outcome.root_cause->is_consequence());
    }
    reap_orphans(pids);

    const auto now = Clock::now();
    if (stopping && !signalled && now >= signal_at) send_stop_signal();
    if (signalled && !killed && now >= kill_at) {
      ddp::log::warn("workers still running {:.1f} s after the stop signal: sending SIGKILL",
                     config_.shutdown_timeout.count() / 1000.0);
      for (auto& w : workers) w.process->signal_group(SIGKILL);
      killed = true;
    }
    if (now >= next_monitor) {
      next_monitor = now + config_.monitor_interval;
      if (!stopping && any_running) {
        try {
          if (auto f = rendezvous.failure(node.round)) {
            outcome.kind = RoundOutcome::Kind::kFailed;
            outcome.root_cause = *f;
            ddp::log::error("stopping this node's workers: {}", f->headline());
            stop_all(SIGTERM, f->is_consequence());
          }
        } catch (const ddp::StoreError& e) {
          outcome.kind = RoundOutcome::Kind::kStoreLost;
          outcome.detail = e.what();
          ddp::log::error("lost the rendezvous store ({}); stopping this node's workers", e.what());
          stop_all(SIGTERM, false);
        }
      }
    }
  }

  if (outcome.kind == RoundOutcome::Kind::kInterrupted) {
    outcome.exit_code = 128 + outcome.signal;
    for (const auto& w : workers) {
      const ExitStatus& st = w.process->status();
      if (st.signal == 0 && st.code != 0) {
        outcome.exit_code = st.code;  // the worker's own answer to the signal, e.g. 75
        break;
      }
    }
    if (own_agent_record && outcome.exit_code != own_agent_record->exit_code) {
      // Every node exits with the root cause's code: make it the workers' answer.
      FailureReport revised = *own_agent_record;
      revised.exit_code = outcome.exit_code;
      revised.message += "; its workers exited with code " + std::to_string(outcome.exit_code);
      try {
        rendezvous.revise_failure(node.round, *own_agent_record, revised);
        outcome.root_cause = revised;
      } catch (const ddp::StoreError& e) {
        ddp::log::warn("could not tell the other nodes the workers' exit code: {}", e.what());
      }
    }
  }
  started_.reset();
  return outcome;
}

}  // namespace ddprun
