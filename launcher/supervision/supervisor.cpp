#include "supervision/supervisor.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "ddp/error.h"
#include "ddp/exit_codes.h"
#include "ddp/live_metrics.h"
#include "ddp/log.h"
#include "ddp/settings.h"
#include "diagnosis/hang_watch.h"
#include "rendezvous/heartbeat.h"
#include "supervision/file_timer.h"
#include "supervision/regroup_offer.h"
#include "supervision/round_state.h"
#include "supervision/worker_output.h"
#include "supervision/worker_process.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kStderrTailLines = 20;
constexpr auto kStepLookFast = std::chrono::milliseconds(20);
constexpr auto kStepLookFastFor = std::chrono::seconds(10);
constexpr auto kStepLookSlow = std::chrono::seconds(1);
constexpr auto kRegroupLook = std::chrono::milliseconds(10);

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
  std::string live_file;      // DDP_LIVE_METRICS_FILE
  std::string abort_file;     // DDP_ABORT_FILE (comm/abort_notice.h)
  std::string regroup_file;   // DDP_REGROUP_FILE (regroup_offer.h); "": the job is not elastic
  std::unique_ptr<WorkerProcess> process;
  std::unique_ptr<WorkerOutput> out;
  std::unique_ptr<WorkerOutput> err;
  bool failed = false;  // it failed on its own (report_failure)
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

// This round's workers, which alone the file-timer watchdog may signal (its own thread asks).
struct Supervisor::WorkerPids {
  std::mutex mutex;
  std::vector<pid_t> pids;
  void forget(pid_t pid) {
    std::lock_guard<std::mutex> lock(mutex);
    pids.erase(std::remove(pids.begin(), pids.end(), pid), pids.end());
  }
  bool contains(pid_t pid) {
    const pid_t group = ::getpgid(pid);
    std::lock_guard<std::mutex> lock(mutex);
    return std::any_of(pids.begin(), pids.end(),
                       [&](pid_t worker) { return worker == pid || worker == group; });
  }
};

std::string Supervisor::start_file_timer(int round) {
  file_timer_.reset();
  if (!config_.file_timer) return config_.timer_file;
  const std::string path =
      !config_.timer_file.empty()
          ? config_.timer_file
          : (std::filesystem::temp_directory_path() /
             ("watchdog_timer_" + std::to_string(::getpid()) + "_" + std::to_string(round)))
                .string();
  worker_pids_ = std::make_shared<WorkerPids>();
  file_timer_ = std::make_unique<FileTimerServer>(
      path, [pids = worker_pids_](pid_t pid) { return pids->contains(pid); });
  return path;
}

std::vector<Supervisor::WorkerResult> Supervisor::results() const {
  std::vector<WorkerResult> results;
  for (const Worker& w : workers_) {
    results.push_back({w.rank, w.local_rank, w.process->pid(), w.process->status().code, w.failed});
  }
  return results;
}

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

void Supervisor::offer_regroup_to(Worker& w, const std::string& dir, EnvMap& env) const {
  if (config_.min_nodes == config_.max_nodes ||
      !ddp::settings::boolean_or_default(ddp::settings::kRegroup)) {
    return;
  }
  w.regroup_file = dir + "/regroup";
  for (const char* suffix : {"", ".able", ".ready"})
    std::filesystem::remove(w.regroup_file + suffix);
  env["DDP_REGROUP_FILE"] = w.regroup_file;
  if (env.count("DDP_REGROUP_WAIT_SEC") == 0) {
    env["DDP_REGROUP_WAIT_SEC"] = std::to_string(regroup_wait_seconds(config_.rdzv));
  }
}

void Supervisor::report_started(const NodeAssignment& node) {
  if (board_ == nullptr) return;
  std::vector<WorkerView> views;
  for (const Worker& w : workers_) {
    views.push_back({w.rank, w.local_rank, WorkerRunState::kRunning, w.live_file});
  }
  board_->workers_started(node.group_rank, node.round, std::move(views));
}

void Supervisor::discard() {
  workers_.clear();  // each WorkerProcess kills its group and reaps it
  started_.reset();
  awaiting_place_ = false;
}

void Supervisor::place(const NodeAssignment& node, const WorkerStore& store) {
  for (Worker& w : workers_) {
    w.rank = node.rank_offset + w.local_rank;
    const bool placed = w.local_rank < static_cast<int>(placement_.size());
    const int threads = placed ? placement_[w.local_rank].threads : 0;
    const EnvMap env =
        worker_environment(agent_env_, config_, node, {w.local_rank, w.error_file, threads}, store);
    std::error_code ignored;
    // The notice is over before the place comes (abort_notice.h); the new world's trainer
    // begins a live metrics file of its own, whose first step is the new world's.
    std::filesystem::remove(w.abort_file, ignored);
    std::filesystem::remove(w.live_file, ignored);
    write_place(w.regroup_file, env);
  }
  started_ = node;
  awaiting_place_ = false;
  report_started(node);
}

// The round's files of --duplicate-std{out,err}-filters, none for a stream without filters.
Supervisor::FilteredCopies Supervisor::filtered_copies(int round) const {
  const std::string dir = log_root_ + "/attempt_" + std::to_string(round);
  FilteredCopies copies;
  if (!config_.duplicate_stdout_filters.empty() || !config_.duplicate_stderr_filters.empty()) {
    std::filesystem::create_directories(dir);
  }
  if (!config_.duplicate_stdout_filters.empty()) {
    copies.out = std::make_shared<FilteredCopy>(dir + "/filtered_stdout.log",
                                                config_.duplicate_stdout_filters);
  }
  if (!config_.duplicate_stderr_filters.empty()) {
    copies.err = std::make_shared<FilteredCopy>(dir + "/filtered_stderr.log",
                                                config_.duplicate_stderr_filters);
  }
  return copies;
}

// Console, files and tail of a worker's two streams, routed as torchrun routes them
// (route_stream): a stream neither tee'd nor redirected reaches the console as written, a tee'd
// one prefixed, and the filtered copies take the tee'd streams of the ranks shown on the console.
void Supervisor::open_outputs(Worker& w, const std::string& dir,
                              const FilteredCopies& copies) const {
  const int lr = w.local_rank;
  const unsigned redirected = config_.redirects.for_rank(lr);
  const unsigned teed = config_.tee.for_rank(lr);
  const bool shown = !config_.local_ranks_filter || config_.local_ranks_filter->count(lr) != 0;
  const std::string prefix =
      worker_line_prefix(config_.log_line_prefix_template, config_.role, w.rank, lr);
  const auto make_output = [&](unsigned bit, int console_fd, const char* file, std::size_t tail,
                               const std::shared_ptr<FilteredCopy>& copy) {
    const StreamRoute route = route_stream((redirected & bit) != 0, (teed & bit) != 0, shown);
    ConsoleCopy console;
    if (route.console != StreamRoute::Console::kNone) console.fd = console_fd;
    if (route.console == StreamRoute::Console::kPrefixed) console.prefix = prefix;
    auto output = std::make_unique<WorkerOutput>(std::move(console),
                                                 route.to_file ? dir + "/" + file : "", tail);
    if (route.filtered && copy) output->duplicate_to(copy);
    return output;
  };
  w.out = make_output(kStdout, STDOUT_FILENO, "stdout.log", 0, copies.out);
  w.err = make_output(kStderr, STDERR_FILENO, "stderr.log", kStderrTailLines, copies.err);
}

void Supervisor::start(const NodeAssignment& node, const WorkerStore& store) {
  discard();
  std::vector<std::string> argv = config_.command;
  argv[0] = program_;
  const FilteredCopies copies = filtered_copies(node.round);
  const std::string timer_file = start_file_timer(node.round);
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
    // Always: the trainer's live figures feed --metrics-port and the change timeline's first
    // step (change_timeline.h); writing them is a few atomic stores, and nothing without a reader.
    w.live_file = dir + "/live_metrics.bin";
    std::filesystem::remove(w.live_file);
    open_outputs(w, dir, copies);
    const bool placed = lr < static_cast<int>(placement_.size());
    const int threads = placed ? placement_[lr].threads : 0;
    EnvMap env = worker_environment(agent_env_, config_, node, {lr, w.error_file, threads}, store);
    if (!timer_file.empty()) env["TORCHELASTIC_TIMER_FILE"] = timer_file;
    env["DDP_FLIGHT_RECORDER_FILE"] = w.recorder_file;
    env["DDP_ABORT_FILE"] = w.abort_file;
    offer_regroup_to(w, dir, env);
    if (!w.live_file.empty()) env["DDP_LIVE_METRICS_FILE"] = w.live_file;
    if (const std::string traces = trace_dir(node.round); !traces.empty()) {
      env["DDP_TRACE_DIR"] = traces;
    }
    w.process =
        std::make_unique<WorkerProcess>(argv, env, placed ? placement_[lr].cpus : std::set<int>{});
    if (worker_pids_) {
      std::lock_guard<std::mutex> lock(worker_pids_->mutex);
      worker_pids_->pids.push_back(w.process->pid());
    }
    workers_.push_back(std::move(w));
  }
  started_ = node;
  report_started(node);
}

// One supervised round: its state, and one method per event source (the workers' pipes and
// exits, signals to ddprun, heartbeats, the group's store). Every transition goes through the
// round's state machine (round_state.h); this class does the I/O around it.
//
// A collective that failed (a worker's exit 70, here or on another node) may be the echo of a
// node that vanished without closing its connections: a worker whose op timeout is shorter
// than the heartbeat limit gives up first. So the agent that watches heartbeats keeps watching
// after such a failure, until every other node has stopped on purpose (marked its counter), a
// node is declared lost (its loss then becomes the root cause), or the heartbeat limit has
// passed: the round's root cause names the lost node whichever timeout fires first.
class Supervisor::Round {
 public:
  Round(Supervisor& supervisor, const NodeAssignment& node, Rendezvous& rendezvous);
  RoundOutcome run();

 private:
  using Clock = std::chrono::steady_clock;

  bool any_running() const;
  std::vector<pollfd> poll_set() const;
  // Waits for output or a signal until the state machine's next wake; copies the output.
  void wait_and_pump(std::vector<pollfd>& fds);
  void take_signals();
  void collect_exits();
  void report_failure(Worker& w);
  // The state machine's timers (the stop signal, SIGKILL) and the hang watch.
  void tick(bool any_running);
  // Heartbeats, other nodes' failures and nodes waiting to join; a store that stopped answering.
  void watch_store(bool any_running);
  // Until a worker reports its first step (Supervisor::on_first_step): looks at their live
  // metrics, every 20 ms for the round's first 10 s (a new world's first step comes within
  // those), then every second.
  void look_for_first_step(Clock::time_point now);
  Clock::time_point next_wake() const;
  void watch_heartbeats(Clock::time_point now, bool any_running);
  // The hang watch (hang_watch.h), while the workers run.
  void watch_hangs(Clock::time_point now);
  void watch_group(Clock::time_point now);
  void declare_lost(const std::vector<int>& lost, Clock::time_point now);
  // Whether the round waits for the heartbeats' verdict on the other nodes before it ends.
  bool awaiting_verdict(Clock::time_point now) const;
  // Notes the group's root cause so far: a collective failure opens the wait for the verdict.
  void note_root_cause(const FailureReport& root, Clock::time_point now);
  void act(RoundAction action);
  void abort_collectives(const std::string& reason);
  // Writes `text` into every worker's DDP_ABORT_FILE at once (a rename): a reason or a notice.
  void write_abort_files(const std::string& text);
  // In-process regrouping (regroup_offer.h): for a membership change whose workers all offer
  // it, the notice goes out instead of the stop; true when it did (or one is in flight).
  bool offer_regroup(const FailureReport& cause, Clock::time_point now);
  // Until every worker answered (the round ends, its workers running), or falls back.
  void watch_regroup(Clock::time_point now);
  // One log line, then the stop the change would have had without the offer.
  void fall_back(const std::string& why, Clock::time_point now);
  // The store's loss as a change to regroup for (an elastic job moves its store): kind "store".
  FailureReport store_lost_report(const std::string& detail) const;
  FailureReport base_report() const;
  // Tells the other nodes; returns the group's first failure as the store holds it.
  FailureReport publish(const FailureReport& mine);
  RoundOutcome conclude();
  static std::vector<WatchedWorker> watched(const std::vector<Worker>& workers);

  Supervisor& s_;
  const NodeAssignment& node_;
  Rendezvous& rendezvous_;
  const bool elastic_;
  RoundStateMachine round_;
  HangWatch hangs_;
  HeartbeatMonitor heartbeat_;
  const bool watches_heartbeats_;
  // A cause the workers cannot see was written to their DDP_ABORT_FILE.
  bool aborted_ = false;
  // Since when the group's root cause is a collective failure that a lost node may explain.
  std::optional<Clock::time_point> verdict_since_;
  struct RegroupOffer {
    FailureReport cause;
    Clock::time_point offered;
  };
  std::optional<RegroupOffer> regroup_;  // the regroup in flight
  bool regrouped_ = false;               // every worker answered it
  bool store_gone_ = false;              // regrouping for the store's loss: it is not asked again
  const Clock::time_point started_ = Clock::now();
  Clock::time_point next_step_look_ = started_;
};

namespace {

HangWatch::Options hang_options(const LaunchConfig& config) {
  HangWatch::Options options;
  options.period = std::max(options.period, config.monitor_interval);
  return options;
}

}  // namespace

Supervisor::Round::Round(Supervisor& supervisor, const NodeAssignment& node, Rendezvous& rendezvous)
    : s_(supervisor),
      node_(node),
      rendezvous_(rendezvous),
      elastic_(supervisor.config_.min_nodes < supervisor.config_.max_nodes),
      round_({supervisor.config_.shutdown_timeout,
              std::max(supervisor.config_.monitor_interval, rendezvous.monitor_floor())},
             Clock::now()),
      hangs_(rendezvous.monitor_store(node.round, "hang"), node.group_rank, node.group_world_size,
             supervisor.hostname_, watched(supervisor.workers_), hang_options(supervisor.config_)),
      heartbeat_(node.group_world_size, supervisor.config_.rdzv.keep_alive_interval,
                 supervisor.config_.rdzv.keep_alive_max_attempt, Clock::now()),
      watches_heartbeats_(rendezvous.watches_heartbeats() && node.group_world_size > 1) {}

RoundOutcome Supervisor::Round::run() {
  for (;;) {
    std::vector<pollfd> fds = poll_set();
    const bool pipes_open = fds.size() > 1;
    const bool running = any_running();
    const auto now = Clock::now();
    if (round_.finished(running, pipes_open, now) && !awaiting_verdict(now)) break;
    wait_and_pump(fds);
    if (s_.health_ != nullptr) s_.health_->progress();
    take_signals();
    collect_exits();
    tick(running);
    watch_store(running);
    watch_regroup(Clock::now());
    if (regrouped_) break;
  }
  return conclude();
}

bool Supervisor::Round::any_running() const {
  return std::any_of(s_.workers_.begin(), s_.workers_.end(),
                     [](const Worker& w) { return w.process->running(); });
}

std::vector<pollfd> Supervisor::Round::poll_set() const {
  std::vector<pollfd> fds = {{s_.inbox_.fd(), POLLIN, 0}};
  for (const auto& w : s_.workers_) {
    for (const int fd : {w.process->stdout_fd(), w.process->stderr_fd()}) {
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
  }
  return fds;
}

Supervisor::Round::Clock::time_point Supervisor::Round::next_wake() const {
  auto wake = round_.next_wake();
  if (regroup_) wake = std::min(wake, Clock::now() + kRegroupLook);
  return s_.first_step_ ? std::min(wake, next_step_look_) : wake;
}

void Supervisor::Round::wait_and_pump(std::vector<pollfd>& fds) {
  const auto wait_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(next_wake() - Clock::now());
  const int rc = poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(0, wait_ms.count())));
  if (rc < 0 && errno != EINTR) throw ddp::Error("poll failed: " + std::string(strerror(errno)));
  for (auto& w : s_.workers_) {
    if (w.process->stdout_fd() >= 0) pump(w.process->stdout_fd(), *w.out);
    if (w.process->stderr_fd() >= 0) pump(w.process->stderr_fd(), *w.err);
  }
}

void Supervisor::Round::take_signals() {
  for (int s = s_.inbox_.take(); s != 0; s = s_.inbox_.take()) {
    if (s == SIGCHLD) continue;  // exits are collected in any case
    if (round_.signal_kills_now()) {
      ddp::log::warn("received {} while stopping: killing the workers now", signal_name(s));
      act(round_.signalled_again());
      continue;
    }
    ddp::log::warn("received {}: forwarding it to the workers (SIGKILL in {:.1f} s)",
                   signal_name(s), s_.config_.shutdown_timeout.count() / 1000.0);
    FailureReport r = base_report();
    r.kind = "agent";
    r.signal = s;
    r.exit_code = 128 + s;
    r.message = "the node was asked to stop";
    round_.agent_signalled(s, r, publish(r), Clock::now());
  }
}

void Supervisor::Round::collect_exits() {
  std::vector<pid_t> pids;
  for (auto& w : s_.workers_) {
    pids.push_back(w.process->pid());
    if (!w.process->try_reap()) continue;
    if (s_.worker_pids_) s_.worker_pids_->forget(w.process->pid());  // its pid may be reused
    const ExitStatus& st = w.process->status();
    if (w.process->stderr_fd() >= 0) pump(w.process->stderr_fd(), *w.err);
    if (s_.board_ != nullptr) {
      s_.board_->worker_exited(w.local_rank, st.code == 0 ? WorkerRunState::kSucceeded
                                             : round_.reports_worker_failures()
                                                 ? WorkerRunState::kFailed
                                                 : WorkerRunState::kStopped);
    }
    if (st.code == 0) {
      ddp::log::debug("rank {} finished", w.rank);
      continue;
    }
    if (round_.reports_worker_failures()) report_failure(w);  // else a consequence of the stop
  }
  reap_orphans(pids);
}

void Supervisor::Round::report_failure(Worker& w) {
  w.failed = true;
  const ExitStatus& st = w.process->status();
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
  if (s_.file_timer_ && r.message.empty()) {
    if (auto expired = s_.file_timer_->reason_for(r.pid)) r.message = *expired;
  }
  r.hang_diagnosis = hangs_.diagnosis();
  const FailureReport root_cause = publish(r);
  if (root_cause.to_json() == r.to_json()) {
    ddp::log::error("{}; stopping this node's workers", r.headline());
  } else {
    ddp::log::error("{}, after the group failed: {}", r.headline(), root_cause.headline());
  }
  const auto now = Clock::now();
  round_.worker_failed(root_cause, now);
  note_root_cause(root_cause, now);
}

void Supervisor::Round::tick(bool any_running) {
  const auto now = Clock::now();
  const RoundAction due = round_.tick(now);
  if (due == RoundAction::kKillWorkers) {
    ddp::log::warn("workers still running {:.1f} s after the stop signal: sending SIGKILL",
                   round_.kill_after().count() / 1000.0);
  }
  act(due);
  if (round_.state() == RoundState::kRunning && any_running) look_for_first_step(now);
}

void Supervisor::Round::watch_hangs(Clock::time_point now) {
  // On the monitoring connection: a request unanswered for the heartbeat limit is the store's
  // host vanishing, said as the rendezvous says it.
  within_heartbeat_limit(rendezvous_.store_host(), rendezvous_.store_port(), heartbeat_.limit(),
                         [&] { hangs_.tick(now); });
}

void Supervisor::Round::look_for_first_step(Clock::time_point now) {
  if (!s_.first_step_ || now < next_step_look_) return;
  next_step_look_ = now + (now - started_ < kStepLookFastFor ? kStepLookFast : kStepLookSlow);
  for (const Worker& w : s_.workers_) {
    const auto live = ddp::live::read(w.live_file);  // (removed at a regroup: place())
    if (!live || live->steps == 0) continue;
    auto fn = std::move(s_.first_step_);
    s_.first_step_ = nullptr;
    fn();
    return;
  }
}

void Supervisor::Round::watch_store(bool any_running) {
  if (store_gone_ || round_.outcome().kind == RoundOutcome::Kind::kStoreLost) return;
  const auto now = Clock::now();
  try {
    watch_heartbeats(now, any_running);
    if (round_.state() == RoundState::kRunning && any_running) watch_hangs(now);
    if (round_.monitor_due(now, any_running)) watch_group(now);
  } catch (const ddp::StoreError& e) {
    // (The request may have waited the heartbeat limit: the time is taken again.)
    if (offer_regroup(store_lost_report(e.what()), Clock::now())) {
      store_gone_ = true;
      ddp::log::error("lost the rendezvous store ({}); this node's workers wait in-process",
                      e.what());
      return;
    }
    ddp::log::error("lost the rendezvous store ({}); stopping this node's workers", e.what());
    abort_collectives(e.what());
    round_.store_lost(e.what(), Clock::now());  // the request may have waited the heartbeat limit
    verdict_since_.reset();
  }
}

void Supervisor::Round::watch_heartbeats(Clock::time_point now, bool any_running) {
  if (node_.group_world_size < 2) return;
  // This node beats as long as it supervises, stopping or not: a node slow to stop is not lost.
  if (heartbeat_.beat_due(now)) rendezvous_.beat(node_.round, node_.group_rank, 1);
  const bool checking =
      (round_.state() == RoundState::kRunning && any_running) || awaiting_verdict(now);
  if (!watches_heartbeats_ || !checking || !heartbeat_.check_due(now)) return;
  const auto lost =
      heartbeat_.observe(rendezvous_.beats(node_.round, node_.group_world_size), Clock::now());
  if (!lost.empty()) return declare_lost(lost, now);
  if (!verdict_since_) return;
  // Another node may have published the real cause meanwhile: then there is nothing to wait for.
  const auto root = rendezvous_.failure(node_.round);
  if (root && !root->is_consequence()) verdict_since_.reset();
}

void Supervisor::Round::declare_lost(const std::vector<int>& lost, Clock::time_point now) {
  for (const int g : lost) rendezvous_.stand_in_for_lost(node_.round, g);
  FailureReport r = base_report();
  r.kind = "lost";
  r.node_rank = lost.front();
  r.hostname = rendezvous_.node_host(node_.round, lost.front());
  r.exit_code = ddp::exit_code::kComm;
  r.message = fmt::format(
      "no heartbeat for {:.1f} s: its pod vanished without closing its connections "
      "(deleted, powered off, or cut off from the network)",
      std::chrono::duration<double>(heartbeat_.limit()).count());
  const FailureReport root = publish(r);
  verdict_since_.reset();
  if (offer_regroup(root, now)) return;
  ddp::log::error("{}; stopping this node's workers", root.headline());
  if (root.kind == "lost") abort_collectives(root.headline());
  round_.other_node_failed(root, now);
}

bool Supervisor::Round::awaiting_verdict(Clock::time_point now) const {
  if (!watches_heartbeats_ || !verdict_since_) return false;
  // By then a node silent since before the failure has been declared lost.
  if (now - *verdict_since_ > heartbeat_.limit() + 2 * heartbeat_.check_period()) return false;
  return !heartbeat_.all_stopped_but(node_.group_rank);
}

void Supervisor::Round::note_root_cause(const FailureReport& root, Clock::time_point now) {
  if (root.is_consequence() && !verdict_since_) verdict_since_ = now;
}

void Supervisor::Round::watch_group(Clock::time_point now) {
  if (auto f = rendezvous_.failure(node_.round)) {
    if (offer_regroup(*f, now)) return;
    if (elastic_ && f->is_membership_change()) {
      ddp::log::info("stopping this node's workers for the next round: {}", f->headline());
    } else {
      ddp::log::error("stopping this node's workers: {}", f->headline());
    }
    if (f->kind == "lost") abort_collectives(f->headline());
    round_.other_node_failed(*f, now);
    note_root_cause(*f, now);
    return;
  }
  if (node_.group_world_size >= s_.config_.max_nodes) return;
  if (const int waiting = rendezvous_.nodes_waiting(node_.round); waiting > 0) {
    FailureReport r = base_report();
    r.kind = "membership";
    r.exit_code = 0;
    r.message = std::to_string(waiting) + " node" + (waiting == 1 ? "" : "s") +
                " waiting to join the " + std::to_string(node_.group_world_size) +
                " running; the group grows at its next round";
    const FailureReport first = publish(r);
    if (offer_regroup(first, now)) return;
    ddp::log::info("stopping this node's workers for the next round: {}", first.headline());
    round_.other_node_failed(first, now);
  }
}

void Supervisor::Round::act(RoundAction action) {
  if (action == RoundAction::kNone) return;
  const int sig = action == RoundAction::kKillWorkers ? SIGKILL : round_.stop_signal();
  for (auto& w : s_.workers_) w.process->signal_group(sig);
}

void Supervisor::Round::abort_collectives(const std::string& reason) {
  // A cause the workers cannot see (a node that vanished without closing its connections, or
  // the store's host gone so): their collectives give up now rather than at their timeout.
  if (aborted_) return;
  aborted_ = true;
  write_abort_files(reason);
}

void Supervisor::Round::write_abort_files(const std::string& text) {
  for (const Worker& w : s_.workers_) {
    const std::string partial = w.abort_file + ".partial";
    std::ofstream(partial) << text << "\n";
    std::error_code ignored;
    std::filesystem::rename(partial, w.abort_file, ignored);
  }
}

bool Supervisor::Round::offer_regroup(const FailureReport& cause, Clock::time_point now) {
  if (regroup_) return true;
  if (!elastic_ || !regroups_for(cause) || round_.state() != RoundState::kRunning) return false;
  for (const Worker& w : s_.workers_) {
    if (w.regroup_file.empty()) return false;  // DDPRUN_REGROUP=0
    if (!w.process->running() || !offers_regroup(w.regroup_file)) {
      ddp::log::info(
          "the workers restart for the next round: rank {} does not regroup in-process (only a "
          "Trainer built on the library's process group does)",
          w.rank);
      return false;
    }
  }
  write_abort_files(regroup_notice(cause));
  regroup_.emplace(RegroupOffer{cause, now});
  ddp::log::info("regrouping this node's workers in-process for the next round: {}",
                 cause.headline());
  return true;
}

void Supervisor::Round::watch_regroup(Clock::time_point now) {
  if (!regroup_ || regrouped_) return;
  if (round_.state() != RoundState::kRunning) {
    // Another cause stops the round: the workers waiting for a place end on the abort.
    abort_collectives(round_.outcome().root_cause ? round_.outcome().root_cause->headline()
                                                  : regroup_->cause.headline());
    regroup_.reset();
    return;
  }
  for (const Worker& w : s_.workers_) {
    if (!w.process->running()) {
      return fall_back(fmt::format("rank {} exited before it answered", w.rank), now);
    }
  }
  regrouped_ = std::all_of(s_.workers_.begin(), s_.workers_.end(),
                           [](const Worker& w) { return answered_regroup(w.regroup_file); });
  if (!regrouped_ && now - regroup_->offered > kRegroupAnswerWithin) {
    fall_back(fmt::format("not every worker answered the notice within {} s",
                          std::chrono::seconds(kRegroupAnswerWithin).count()),
              now);
  }
}

void Supervisor::Round::fall_back(const std::string& why, Clock::time_point now) {
  const FailureReport cause = regroup_->cause;
  regroup_.reset();
  ddp::log::warn("regrouping in-process fell back to restarting the workers: {}", why);
  if (store_gone_) {
    round_.store_lost(cause.message, now);
  } else {
    round_.other_node_failed(cause, now);
    note_root_cause(cause, now);
  }
  abort_collectives(cause.headline());  // a plain reason over the notice: the workers end
}

FailureReport Supervisor::Round::store_lost_report(const std::string& detail) const {
  FailureReport r = base_report();
  r.kind = "store";
  r.exit_code = ddp::exit_code::kRendezvous;
  r.message = detail;
  return r;
}

FailureReport Supervisor::Round::base_report() const {
  FailureReport r;
  r.node_rank = node_.group_rank;
  r.hostname = s_.hostname_;
  r.timestamp = static_cast<long long>(std::time(nullptr));
  return r;
}

FailureReport Supervisor::Round::publish(const FailureReport& mine) {
  try {
    return rendezvous_.publish_failure(node_.round, mine);
  } catch (const ddp::StoreError& e) {
    ddp::log::warn("could not tell the other nodes about the failure: {}", e.what());
    return mine;
  }
}

RoundOutcome Supervisor::Round::conclude() {
  if (regrouped_) {
    s_.started_.reset();
    s_.awaiting_place_ = true;
    RoundOutcome outcome;
    outcome.kind = RoundOutcome::Kind::kRegrouped;
    outcome.root_cause = regroup_->cause;
    outcome.stop_began = regroup_->offered;
    return outcome;
  }
  std::vector<ExitStatus> statuses;
  for (const auto& w : s_.workers_) statuses.push_back(w.process->status());
  if (auto revision = round_.settle(statuses)) {
    try {
      rendezvous_.revise_failure(node_.round, revision->first, revision->second);
      round_.set_root_cause(revision->second);
    } catch (const ddp::StoreError& e) {
      ddp::log::warn("could not tell the other nodes the workers' exit code: {}", e.what());
    }
  }
  s_.started_.reset();
  RoundOutcome outcome = round_.outcome();
  if (outcome.root_cause && outcome.root_cause->hang_diagnosis.empty()) {
    outcome.root_cause->hang_diagnosis = hangs_.diagnosis();
  }
  return outcome;
}

RoundOutcome Supervisor::supervise(const NodeAssignment& node, Rendezvous& rendezvous) {
  RoundOutcome outcome = Round(*this, node, rendezvous).run();
  first_step_ = nullptr;  // no step in this round: the caller says so
  return outcome;
}

std::vector<WatchedWorker> Supervisor::Round::watched(const std::vector<Worker>& workers) {
  std::vector<WatchedWorker> watched;
  for (const auto& w : workers) {
    watched.push_back({w.rank, w.local_rank, static_cast<int>(w.process->pid()), w.recorder_file});
  }
  return watched;
}

}  // namespace ddprun
