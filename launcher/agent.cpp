#include "agent.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <sstream>

#include "ddp/error.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "doctor.h"
#include "failure_report.h"
#include "heartbeat.h"
#include "rendezvous.h"
#include "store_rendezvous.h"
#include "supervisor.h"
#include "trace_merge.h"
#include "worker_process.h"

namespace ddprun {
namespace {

// A signal to ddprun while it is not supervising workers (rendezvous, exit barrier).
struct Interrupted {
  int signal;
};

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

// A port free a moment ago, for a --standalone store whose workers start before it is up.
// (torchrun picks its workers' port the same way.)
int free_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    throw ddp::StoreError("cannot find a free TCP port for the --standalone store");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

void print_summary(const FailureReport& root, const std::string& error_file) {
  std::istringstream lines(root.summary());
  std::string line;
  while (std::getline(lines, line)) ddp::log::error("{}", line);
  ddp::log::error("error file: {}", error_file);
}

}  // namespace

int run_agent(const LaunchConfig& config, const HostFacts& host, const EnvMap& env,
              SignalInbox& inbox) {
  // Orphans of the workers (daemonized grandchildren) become ours to reap, not init's.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  LaunchConfig effective = config;
  // One node needs no rendezvous to know its ranks: its workers start before the store is up,
  // so a --standalone store's free port is picked now (as torchrun picks its workers' port).
  const bool doctor_first = config.doctor || config.preflight;
  const bool start_early = config.max_nodes == 1 && !doctor_first;
  if (config.max_nodes == 1 && effective.store_port == 0) effective.store_port = free_tcp_port();
  const std::string program =
      config.command.empty() ? std::string() : find_program(config.command.front(), env);
  for (const auto& notice : config.notices) ddp::log::warn("{}", notice);
  ddp::log::info("{}", effective.describe());

  bool temporary_logs = false;
  const std::string log_root = make_log_root(config, temporary_logs);
  bool writes_log_files = false;
  for (int lr = 0; lr < config.nproc_per_node; ++lr) {
    writes_log_files =
        writes_log_files || (config.redirects.for_rank(lr) | config.tee.for_rank(lr));
  }
  if (temporary_logs && writes_log_files) ddp::log::info("worker logs go to {}", log_root);
  auto agent_error_file = env.find("TORCHELASTIC_ERROR_FILE");
  const std::string error_file =
      agent_error_file != env.end() ? agent_error_file->second : log_root + "/error.json";

  const auto poll_interrupt = [&inbox] {
    if (int s = inbox.take_termination()) throw Interrupted{s};
  };
  try {
    Supervisor supervisor(effective, env, program, log_root, inbox, host.hostname);
    MetricsBoard board;
    std::unique_ptr<MetricsServer> metrics;
    if (config.metrics_port != 0) {
      metrics =
          std::make_unique<MetricsServer>(config.metrics_port, [&board] { return board.render(); });
      supervisor.report_to(&board);
    }
    if (start_early) {
      supervisor.start(NodeAssignment{0, 0, 1, 0, config.nproc_per_node}, effective.store_host,
                       effective.store_port);
    }
    StoreRendezvous rendezvous(effective, host, poll_interrupt);
    for (;;) {
      const NodeAssignment node = rendezvous.join();
      ddp::log::info("round {}: node {} of {}, ranks {}..{} of {}", node.round, node.group_rank,
                     node.group_world_size, node.rank_offset,
                     node.rank_offset + config.nproc_per_node - 1, node.world_size);
      if (doctor_first && node.round == 0) {  // (no worker starts early then)
        const int code =
            run_doctor(effective, host, env, rendezvous, node, log_root, poll_interrupt);
        if (config.doctor || code != ddp::exit_code::kSuccess) {
          if (temporary_logs && !writes_log_files) std::filesystem::remove_all(log_root);
          return code;
        }
      }
      if (!supervisor.started_for(node)) {
        supervisor.start(node, rendezvous.store_host(), rendezvous.store_port());
      }
      RoundOutcome outcome = supervisor.supervise(node, rendezvous);
      if (outcome.kind == RoundOutcome::Kind::kSucceeded) {
        try {  // this node stops beating: it finished, it is not lost (heartbeat.h)
          rendezvous.beat(node.round, node.group_rank, HeartbeatMonitor::kFinished);
        } catch (const ddp::StoreError&) {
        }
        publish_timeline(rendezvous, node, supervisor.trace_dir(node.round));
        if (auto failure = rendezvous.finish(node.round, node.group_world_size)) {
          ddp::log::error("this node's workers finished, but the group failed: {}",
                          failure->headline());
          outcome.kind = RoundOutcome::Kind::kFailed;
          outcome.root_cause = failure;
        } else {
          ddp::log::info("all {} workers of {} nodes finished", node.world_size,
                         node.group_world_size);
          const bool merged = node.group_rank == 0 && merge_timeline(rendezvous, node, log_root);
          if (temporary_logs && !writes_log_files && !merged) std::filesystem::remove_all(log_root);
          return ddp::exit_code::kSuccess;
        }
      }
      if (outcome.kind == RoundOutcome::Kind::kStoreLost) {
        ddp::log::error("the rendezvous store stopped answering: {}", outcome.detail);
        return ddp::exit_code::kRendezvous;
      }
      rendezvous.acknowledge_stop(node.round, outcome.kind == RoundOutcome::Kind::kInterrupted);
      // A lost node will not acknowledge or read anything: the others do not wait for it.
      const int answering = node.group_world_size -
                            (outcome.root_cause && outcome.root_cause->kind == "lost" ? 1 : 0);
      const bool elastic = config.min_nodes < config.max_nodes;
      if (outcome.kind == RoundOutcome::Kind::kFailed && elastic &&
          outcome.root_cause->is_membership_change()) {
        // A node joins or left: the group goes on with the nodes it has, without using a restart.
        ddp::log::info("round {} ended for a change of members ({}); the group moves to round {}",
                       node.round, outcome.root_cause->headline(), node.round + 1);
        rendezvous.advance(node.round, node.restarts);
        continue;
      }
      if (outcome.kind == RoundOutcome::Kind::kInterrupted) {
        // This node is going away (its pod is being deleted): report and leave promptly.
        print_summary(*outcome.root_cause, error_file);
        write_error_file(error_file, *outcome.root_cause);
        rendezvous.linger_until_stopped(node.round, answering);
        return outcome.exit_code;
      }
      if (node.restarts >= config.max_restarts) {
        const FailureReport root =
            rendezvous.settle_failure(node.round, answering, *outcome.root_cause);
        print_summary(root, error_file);
        write_error_file(error_file, root);
        if (config.max_restarts > 0) {
          ddp::log::error("no restarts left ({} used)", config.max_restarts);
        }
        rendezvous.linger_until_settled(node.round, answering);
        return root.exit_code;
      }
      print_summary(*outcome.root_cause, error_file);
      write_error_file(error_file, *outcome.root_cause);
      ddp::log::warn("restarting the group: restart {} of {}", node.restarts + 1,
                     config.max_restarts);
      rendezvous.advance(node.round, node.restarts + 1);
    }
  } catch (const Interrupted& i) {
    // Outside supervision (joining, exit barrier): any workers are killed as the stack unwinds.
    ddp::log::warn("received {} while not supervising workers; exiting", signal_name(i.signal));
    return 128 + i.signal;
  }
}

}  // namespace ddprun
