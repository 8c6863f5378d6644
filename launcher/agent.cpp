#include "agent.h"

#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include "config/python_hook.h"
#include "ddp/error.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "ddp/net/tcp_probe.h"
#include "diagnosis/failure_report.h"
#include "diagnosis/trace_merge.h"
#include "doctor/doctor.h"
#include "metrics/event_log.h"
#include "placement/binding_plan.h"
#include "placement/topology.h"
#include "rendezvous/heartbeat.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/store_rendezvous.h"
#include "supervision/change_timeline.h"
#include "supervision/supervisor.h"
#include "supervision/worker_process.h"

namespace ddprun {
namespace {

// A signal to ddprun while it is not supervising workers (rendezvous, exit barrier).
struct Interrupted {
  int signal;
};

// The workers regrouped in-process for the store's loss (they wait while it moves).
bool store_regrouped(const RoundOutcome& outcome) {
  return outcome.kind == RoundOutcome::Kind::kRegrouped && outcome.root_cause->kind == "store";
}

std::string make_log_root(const LaunchConfig& config, bool& temporary) {
  temporary = config.log_dir.empty();
  if (!temporary) {
    const std::string root = config.log_dir + "/" + config.run_id;
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    if (ec) {
      throw ddp::ConfigError("cannot create the log directory '" + root + "' (" + ec.message() +
                             "); check --log-dir");
    }
    return root;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ddprun-" +
                        config.run_id + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    throw ddp::ConfigError("cannot create a temporary log directory '" + pattern +
                           "'; set --log-dir or TMPDIR to a writable directory");
  }
  return pattern;
}

// This node's workers' --trace-steps timelines of the round, for node 0 to merge.
void publish_timeline(Rendezvous& rendezvous, const NodeAssignment& node, const std::string& dir) {
  try {
    const auto traces = read_local_traces(dir);
    if (!traces.empty()) publish_traces(*rendezvous.round_store(node.round, "trace"), traces);
  } catch (const std::exception& e) {
    ddp::log::warn("could not publish this node's traces for merging: {}", e.what());
  }
}

// Node 0: the round's timeline, when any worker traced steps; true when written (its folder is
// then kept).
bool merge_timeline(Rendezvous& rendezvous, const NodeAssignment& node,
                    const std::string& log_root) {
  try {
    const std::string path = log_root + "/trace.json";
    const int ranks =
        merge_published_traces(*rendezvous.round_store(node.round, "trace"), node.world_size, path);
    if (ranks == 0) return false;
    ddp::log::info("timeline of {} ranks: {} (open it in ui.perfetto.dev or chrome://tracing)",
                   ranks, path);
    return true;
  } catch (const std::exception& e) {
    ddp::log::warn("could not merge the ranks' traces: {}", e.what());
    return false;
  }
}

void print_summary(const FailureReport& root, const std::string& error_file) {
  std::istringstream lines(root.summary());
  std::string line;
  while (std::getline(lines, line)) ddp::log::error("{}", line);
  ddp::log::error("error file: {}", error_file);
}

// --numa-binding: this node's plan, one line per worker. Without it, a hint where torchrun's
// OMP_NUM_THREADS=1 for several workers leaves most of the node's CPUs idle.
std::vector<RankPlacement> place_workers(const LaunchConfig& config, const HostFacts& host,
                                         const EnvMap& env) {
  const auto user_threads = env.find("OMP_NUM_THREADS");
  const int nproc = config.nproc_per_node;
  if (!config.numa_binding) {
    const std::string hint = binding_hint(nproc, host.usable_cpus);
    if (user_threads == env.end() && !hint.empty()) ddp::log::info("{}", hint);
    return {};
  }
  const CpuTopology topology = read_topology("/", current_affinity());
  std::vector<RankPlacement> plan = plan_binding(topology, nproc, *config.numa_binding);
  // On one node the global ranks are the local ones; on several they are known only after each
  // round's rendezvous, and may change from round to round.
  const std::string who = config.max_nodes == 1 ? "rank " : "local rank ";
  for (std::size_t lr = 0; lr < plan.size(); ++lr) {
    ddp::log::info("{}", describe_placement(who + std::to_string(lr), plan[lr]));
  }
  if (user_threads != env.end()) {
    ddp::log::info("OMP_NUM_THREADS={} from the environment wins over the plan's thread counts",
                   user_threads->second);
  }
  return plan;
}

// One agent's run: its settings and logs, then round after round of workers, each ending in a
// decision (decide_after_round, round_state.h) that this class carries out.
class Agent {
 public:
  Agent(const LaunchConfig& config, const HostFacts& host, const EnvMap& env, SignalInbox& inbox);
  int run();

 private:
  // The workers of `node`'s round, from start to the decision carried out: the exit code, or
  // nullopt for the next round.
  std::optional<int> run_round(Supervisor& supervisor, Rendezvous& rendezvous,
                               const NodeAssignment& node);
  std::optional<int> end_round(Rendezvous& rendezvous, const NodeAssignment& node,
                               RoundOutcome outcome);
  // The exit barrier after this node's workers all succeeded: 0, or the group's failure.
  std::optional<FailureReport> exit_barrier(Rendezvous& rendezvous, const NodeAssignment& node);
  void report(const FailureReport& root) const;
  // --event-log-handler: the rendezvous, and at the end each worker's and the agent's result.
  void record_rendezvous(const NodeAssignment& node, std::chrono::steady_clock::duration took);
  void record_end(const Supervisor& supervisor, int exit_code);
  // The workers' PYTHONPATH: ddprun's hook first (DDP_PYTHON_HOOK), and ddprun_torch beside
  // this ddprun last, or, with --collectives ddprun, right after the hook.
  void install_python_path();
  // The change timeline (change_timeline.h): a change that ended this round, detected when its
  // workers began to stop; the round that follows a change, agreed; its
  // workers, started (the line is logged at their first step); the round, over without one.
  void begin_change(const std::string& cause, const RoundOutcome& outcome);
  void note_agreed(const NodeAssignment& node);
  void watch_first_step(Supervisor& supervisor);
  void note_round_over();

  const LaunchConfig& config_;
  const HostFacts& host_;
  const EnvMap& env_;
  SignalInbox& inbox_;
  LaunchConfig effective_;
  std::string program_;
  bool temporary_logs_ = false;
  std::string log_root_;
  bool writes_log_files_ = false;
  std::string error_file_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::optional<NodeAssignment> last_node_;    // the round the agent is in, for the events
  std::optional<FailureReport> last_failure_;  // the root cause it ended with
  // The membership change in progress, until the new world's first step states its timeline.
  std::optional<ChangeTimeline> change_;
  std::unique_ptr<EventLog> events_;
  std::vector<RankPlacement> placement_;  // --numa-binding's plan, by local rank
  std::optional<PythonHook> hook_;        // DDP_PYTHON_HOOK (python_hook.h)
  // TORCHELASTIC_HEALTH_CHECK_PORT's answer: unhealthy once this loop stalls for torchelastic's
  // 60 s, or for the store's read timeout and 10 s more (one slow store call is no stall).
  AgentHealth health_{std::max<std::chrono::milliseconds>(
      std::chrono::seconds(60), config_.rdzv.read_timeout + std::chrono::seconds(10))};
};

Agent::Agent(const LaunchConfig& config, const HostFacts& host, const EnvMap& env,
             SignalInbox& inbox)
    : config_(config), host_(host), env_(env), inbox_(inbox), effective_(config) {
  // One node needs no rendezvous to know its ranks: its workers start before the store is up,
  // so a --standalone store's free port is picked now (as torchrun picks its workers' port).
  if (config.max_nodes == 1 && effective_.store_port == 0) {
    effective_.store_port = ddp::net::free_tcp_port();
  }
  program_ = config.command.empty() ? std::string() : find_program(config.command.front(), env);
  for (const auto& notice : config.notices) ddp::log::warn("{}", notice);
  ddp::log::info("{}", effective_.describe());
  if (!config.doctor) placement_ = place_workers(config, host, env);
  log_root_ = make_log_root(config, temporary_logs_);
  install_python_path();
  for (int lr = 0; lr < config.nproc_per_node; ++lr) {
    writes_log_files_ =
        writes_log_files_ || (config.redirects.for_rank(lr) | config.tee.for_rank(lr));
  }
  if (temporary_logs_ && writes_log_files_) ddp::log::info("worker logs go to {}", log_root_);
  auto agent_error_file = env.find("TORCHELASTIC_ERROR_FILE");
  error_file_ =
      agent_error_file != env.end() ? agent_error_file->second : log_root_ + "/error.json";
  events_ = std::make_unique<EventLog>(config.event_log,
                                       EventContext{config.run_id, config.role, host.fqdn(),
                                                    to_string(config.rdzv_backend), program_});
}

void Agent::install_python_path() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const auto packages = ddprun_torch_dirs(ec ? std::string() : self.string());
  if (config_.python_hook) {
    try {
      hook_.emplace(config_.ddprun_collectives);
    } catch (const ddp::ConfigError& e) {
      if (config_.ddprun_collectives) throw;
      ddp::log::warn("{}; Python workers start without ddprun's hook", e.what());
    }
  }
  if (!config_.ddprun_collectives) {
    effective_.python_path_append = packages;
    if (hook_) effective_.python_path_prepend = {hook_->path()};
    return;
  }
  effective_.python_path_prepend = {hook_->path()};
  effective_.python_path_prepend.insert(effective_.python_path_prepend.end(), packages.begin(),
                                        packages.end());
  ddp::log::info(
      "--collectives ddprun: Python workers' gloo CPU collectives take the library's 'ddprun' "
      "backend (ddprun_torch from {})",
      packages.empty() ? std::string("the workers' own PYTHONPATH") : packages.front());
}

void Agent::record_rendezvous(const NodeAssignment& node,
                              std::chrono::steady_clock::duration took) {
  last_node_ = node;
  if (!events_->enabled()) return;
  EventFields f;
  f.state = "RENDEZVOUS";
  f.group_rank = node.group_rank;
  f.group_world_size = node.group_world_size;
  f.agent_restarts = node.restarts;
  f.total_run_time =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count();
  f.duration_ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
  events_->record(f);
}

void Agent::record_end(const Supervisor& supervisor, int exit_code) {
  if (!events_->enabled() || !last_node_) return;
  const bool succeeded = exit_code == ddp::exit_code::kSuccess;
  EventFields agent;
  agent.state = succeeded ? "SUCCEEDED" : "FAILED";
  agent.group_rank = last_node_->group_rank;
  agent.group_world_size = last_node_->group_world_size;
  agent.agent_restarts = last_node_->restarts;
  agent.total_run_time =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count();
  for (const auto& w : supervisor.results()) {
    EventFields f = agent;
    f.worker = true;
    f.state = succeeded ? "SUCCEEDED" : w.failed ? "FAILED" : "TERMINATED";
    f.global_rank = w.rank;
    f.worker_id = std::to_string(w.pid);
    f.local_rank = w.local_rank;
    f.role_rank = w.rank;
    f.role_world_size = last_node_->world_size;
    if (w.failed) {
      f.exit_code = w.exit_code;
      f.worker_pid = w.pid;
      if (last_failure_ && last_failure_->rank == w.rank) f.raw_error = last_failure_->to_json();
    }
    events_->record(f);
  }
  if (!succeeded && last_failure_) agent.raw_error = last_failure_->headline();
  events_->record(agent);
}

int Agent::run() {
  const bool doctor_first = config_.doctor || config_.preflight;
  const auto poll_interrupt = [this] {
    health_.progress();
    if (int s = inbox_.take_termination()) throw Interrupted{s};
  };
  try {
    std::unique_ptr<HealthServer> health_server;
    if (config_.health_check_port != 0) {
      health_server = std::make_unique<HealthServer>(config_.health_check_port, health_);
    }
    Supervisor supervisor(effective_, env_, program_, log_root_, inbox_, host_.hostname);
    supervisor.bind_workers(placement_);
    supervisor.report_progress_to(&health_);
    MetricsBoard board;
    std::unique_ptr<MetricsServer> metrics;
    if (config_.metrics_port != 0) {
      metrics = std::make_unique<MetricsServer>(config_.metrics_port,
                                                [&board] { return board.render(); });
      supervisor.report_to(&board);
    }
    if (config_.max_nodes == 1 && !doctor_first) {
      // Round 0's workers use the agents' store (rendezvous.h).
      supervisor.start(NodeAssignment{0, 0, 1, 0, config_.nproc_per_node},
                       WorkerStore{effective_.store_host, effective_.store_port, true});
    }
    StoreRendezvous rendezvous(effective_, host_, poll_interrupt);
    rendezvous.on_wait([this] { health_.progress(); });
    for (;;) {
      health_.progress(AgentPhase::kRendezvous);
      const auto joining = std::chrono::steady_clock::now();
      const NodeAssignment node = rendezvous.join();
      record_rendezvous(node, std::chrono::steady_clock::now() - joining);
      note_agreed(node);
      ddp::log::info("round {}: node {} of {}, ranks {}..{} of {}", node.round, node.group_rank,
                     node.group_world_size, node.rank_offset,
                     node.rank_offset + config_.nproc_per_node - 1, node.world_size);
      if (doctor_first && node.round == 0) {  // (no worker starts early then)
        const int code =
            run_doctor(effective_, host_, env_, rendezvous, node, log_root_, poll_interrupt);
        if (config_.doctor || code != ddp::exit_code::kSuccess) {
          if (temporary_logs_ && !writes_log_files_) std::filesystem::remove_all(log_root_);
          return code;
        }
      }
      if (auto code = run_round(supervisor, rendezvous, node)) {
        record_end(supervisor, *code);
        return *code;
      }
    }
  } catch (const Interrupted& i) {
    // Outside supervision (joining, exit barrier): any workers are killed as the stack unwinds.
    ddp::log::warn("received {} while not supervising workers; exiting", signal_name(i.signal));
    return 128 + i.signal;
  }
}

std::optional<int> Agent::run_round(Supervisor& supervisor, Rendezvous& rendezvous,
                                    const NodeAssignment& node) {
  health_.progress(AgentPhase::kRunning);
  if (!supervisor.started_for(node)) {
    if (supervisor.awaiting_place()) {
      supervisor.place(node, rendezvous.worker_store());  // regrouped in-process
    } else {
      supervisor.start(node, rendezvous.worker_store());
    }
    watch_first_step(supervisor);
  }
  RoundOutcome outcome = supervisor.supervise(node, rendezvous);
  note_round_over();
  if (outcome.kind != RoundOutcome::Kind::kStoreLost && !store_regrouped(outcome)) {
    try {  // this node stops beating: it finished or stopped, it is not lost (heartbeat.h)
      rendezvous.beat(node.round, node.group_rank, HeartbeatMonitor::kFinished);
    } catch (const ddp::StoreError&) {
    }
  }
  if (outcome.kind == RoundOutcome::Kind::kSucceeded) {
    publish_timeline(rendezvous, node, supervisor.trace_dir(node.round));
    if (auto failure = exit_barrier(rendezvous, node)) {
      outcome.kind = RoundOutcome::Kind::kFailed;
      outcome.root_cause = failure;
    } else {
      const bool merged = node.group_rank == 0 && merge_timeline(rendezvous, node, log_root_);
      if (temporary_logs_ && !writes_log_files_ && !merged) std::filesystem::remove_all(log_root_);
      return ddp::exit_code::kSuccess;
    }
  }
  return end_round(rendezvous, node, std::move(outcome));
}

std::optional<FailureReport> Agent::exit_barrier(Rendezvous& rendezvous,
                                                 const NodeAssignment& node) {
  health_.progress(AgentPhase::kExitBarrier);
  auto failure = rendezvous.finish(node.round, node.group_world_size);
  if (failure) {
    ddp::log::error("this node's workers finished, but the group failed: {}", failure->headline());
  } else {
    ddp::log::info("all {} workers of {} nodes finished", node.world_size, node.group_world_size);
  }
  return failure;
}

namespace {

// How many of the round's nodes remain after a loss (FailureReport::is_loss): one fewer. A join
// is growth: none, and the next round waits for its last call.
std::optional<int> survivors_after(const FailureReport& cause, const NodeAssignment& node) {
  if (cause.is_loss()) return node.group_world_size - 1;
  return std::nullopt;
}

// A growth whose workers regrouped in-process: they wait idle, so the next round closes as soon
// as this round's nodes and those waiting to join are in (0: at its last call, as any growth).
int members_after(const RoundOutcome& outcome, const NodeAssignment& node, Rendezvous& rendezvous,
                  int max_nodes) {
  if (outcome.kind != RoundOutcome::Kind::kRegrouped || outcome.root_cause->is_loss()) return 0;
  try {
    return std::min(max_nodes, node.group_world_size + rendezvous.nodes_waiting(node.round));
  } catch (const ddp::StoreError&) {
    return 0;  // the round's own join then says what is wrong with the store
  }
}

// A node lost by its heartbeat may instead be this side of a partition: the next round needs at
// least half of this one's nodes (the store's side; the other side, which moves the store, needs
// more than half: rendezvous.h). A node that left said so: none.
int quorum_after(const FailureReport& cause, const NodeAssignment& node) {
  return cause.kind == "lost" ? (node.group_world_size + 1) / 2 : 0;
}

}  // namespace

std::optional<int> Agent::end_round(Rendezvous& rendezvous, const NodeAssignment& node,
                                    RoundOutcome outcome) {
  const bool elastic = config_.min_nodes < config_.max_nodes;
  const AfterRound decision =
      decide_after_round(outcome, elastic, node.restarts, config_.max_restarts);
  if (decision == AfterRound::kStoreLost || store_regrouped(outcome)) {
    // An elastic group moves its store to a surviving node and goes on (rendezvous.h).
    if (elastic && rendezvous.fail_over(node.restarts)) {
      begin_change("the rendezvous store's host was lost", outcome);
      return std::nullopt;
    }
    ddp::log::error("the rendezvous store stopped answering: {}",
                    outcome.detail.empty() && outcome.root_cause ? outcome.root_cause->message
                                                                 : outcome.detail);
    return ddp::exit_code::kRendezvous;
  }
  rendezvous.acknowledge_stop(node.round, decision == AfterRound::kLeave);
  switch (decision) {
    case AfterRound::kNextRound:
      ddp::log::info("round {} ended for a change of members ({}); the group moves to round {}",
                     node.round, outcome.root_cause->headline(), node.round + 1);
      begin_change(outcome.root_cause->headline(), outcome);
      if (rendezvous.move_store_from_leaving_host(*outcome.root_cause, node.restarts)) {
        return std::nullopt;
      }
      rendezvous.advance(node.round, node.restarts, survivors_after(*outcome.root_cause, node),
                         quorum_after(*outcome.root_cause, node),
                         members_after(outcome, node, rendezvous, config_.max_nodes));
      return std::nullopt;
    case AfterRound::kLeave:
      // This node is going away (its pod is being deleted): report and leave promptly.
      last_failure_ = outcome.root_cause;
      report(*outcome.root_cause);
      rendezvous.linger_until_stopped(node.round, node.group_world_size);
      return outcome.exit_code;
    case AfterRound::kRestart:
      report(*outcome.root_cause);
      ddp::log::warn("restarting the group: restart {} of {}", node.restarts + 1,
                     config_.max_restarts);
      rendezvous.advance(node.round, node.restarts + 1, std::nullopt, 0);
      return std::nullopt;
    default:
      break;
  }
  const FailureReport root =
      rendezvous.settle_failure(node.round, node.group_world_size, *outcome.root_cause);
  last_failure_ = root;
  report(root);
  if (config_.max_restarts > 0) ddp::log::error("no restarts left ({} used)", config_.max_restarts);
  rendezvous.linger_until_settled(node.round, node.group_world_size);
  return root.exit_code;
}

void Agent::begin_change(const std::string& cause, const RoundOutcome& outcome) {
  const auto now = std::chrono::steady_clock::now();
  change_.emplace(cause, outcome.stop_began.value_or(now), now);
  change_->in_process = outcome.kind == RoundOutcome::Kind::kRegrouped;
}

void Agent::note_agreed(const NodeAssignment& node) {
  if (!change_ || change_->agreed) return;
  change_->agreed = std::chrono::steady_clock::now();
  change_->round = node.round;
  change_->nodes = node.group_world_size;
  change_->world_size = node.world_size;
}

void Agent::watch_first_step(Supervisor& supervisor) {
  if (!change_ || !change_->agreed) return;
  change_->started = std::chrono::steady_clock::now();
  supervisor.on_first_step([this] {
    change_->first_step = std::chrono::steady_clock::now();
    ddp::log::info("{}", change_->line());
    change_.reset();
  });
}

void Agent::note_round_over() {
  if (!change_ || !change_->started) return;  // (a change that ended this round stays)
  ddp::log::info("{}", change_->line(/*round_ended=*/true));
  change_.reset();
}

void Agent::report(const FailureReport& root) const {
  print_summary(root, error_file_);
  write_error_file(error_file_, root);
}

}  // namespace

int run_agent(const LaunchConfig& config, const HostFacts& host, const EnvMap& env,
              SignalInbox& inbox) {
  // Orphans of the workers (daemonized grandchildren) become ours to reap, not init's.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  return Agent(config, host, env, inbox).run();
}

}  // namespace ddprun
