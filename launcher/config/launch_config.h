#pragma once
// Everything one ddprun agent needs to run its node, resolved from the command line, the
// environment and the host. Precedence, per value: explicit flag > PET_<FLAG> > DDP_NNODES (node
// count) > MASTER_ADDR/MASTER_PORT > Kubernetes pod placement (kubernetes.h) > torchrun's
// default. Resolution is a pure function; every bad or contradictory value throws
// ddp::ConfigError naming the variable or flag and the fix.
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "config/command_line.h"
#include "config/host_facts.h"
#include "placement/binding_plan.h"

namespace ddprun {

// static: node 0's agent serves the store; c10d: the endpoint's agent serves it; etcd: an etcd
// cluster at the endpoint holds the rendezvous, and each round's node 0 serves its workers' store.
enum class RdzvBackend { kStatic, kC10d, kEtcd };
// torchrun's name of the backend: "static", "c10d" or "etcd-v2".
const char* to_string(RdzvBackend backend);

// Which of a worker's output streams a setting applies to: bit 1 stdout, bit 2 stderr.
enum StreamBits : unsigned { kNoStreams = 0, kStdout = 1, kStderr = 2, kBothStreams = 3 };

struct StreamSelection {
  unsigned all = kNoStreams;         // for every local rank not listed below
  std::map<int, unsigned> per_rank;  // "0:1,1:2" form
  unsigned for_rank(int local_rank) const;
};

// --event-log-handler: where torchelastic's events go (metrics/event_log.h).
struct EventLogHandler {
  enum class Kind { kNull, kConsole, kFile };
  Kind kind = Kind::kNull;
  std::string path;  // kFile
};
// --event-log-handler's value: throws ddp::ConfigError for an unknown handler, naming `what`.
EventLogHandler parse_event_log_handler(const std::string& what, const std::string& value);

struct RendezvousSettings {
  std::chrono::milliseconds join_timeout = std::chrono::seconds(600);
  std::chrono::milliseconds last_call_timeout = std::chrono::seconds(30);
  std::chrono::milliseconds read_timeout = std::chrono::seconds(60);
  std::chrono::milliseconds exit_barrier_timeout = std::chrono::seconds(300);
  bool exit_barrier_timeout_given = false;  // by rdzv-conf: TORCH_ELASTIC_* must not override it
  std::optional<bool> is_host;  // c10d: force hosting (true) or joining (false) the store
  // Agents beat through the store every keep_alive_interval while their workers run; a node
  // whose beat stops for keep_alive_max_attempt intervals is declared lost (torchrun's names
  // and defaults: 5 s, 3).
  std::chrono::milliseconds keep_alive_interval = std::chrono::seconds(5);
  int keep_alive_max_attempt = 3;
  // The job's join token (from token_file= or DDPRUN_RDZV_TOKEN_FILE): agents present it, the
  // store admits other hosts only once they did. Empty: no check. Never logged.
  std::string token_file;
  std::string join_token;
  // Where a moved store may be (store_peers=HOST;HOST;..., or the Indexed Job's pod names
  // <job>-<i>.<subdomain>): an agent that would serve the store, or cannot reach the endpoint,
  // first looks there for the job's live store (rendezvous.h, "Store failover").
  std::vector<std::string> store_peers;
  // etcd (torchrun's rdzv-conf keys): where the job's keys live, and TLS.
  std::string etcd_prefix = "/ddprun";
  std::string etcd_protocol = "http";
  std::string etcd_cacert, etcd_cert, etcd_key;
};

struct LaunchConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc_per_node = 1;
  // Unset only with the c10d backend and nothing naming the node: then the host name decides
  // (rendezvous/member_order.h).
  std::optional<int> node_rank;
  RdzvBackend rdzv_backend = RdzvBackend::kStatic;
  std::string store_host = "127.0.0.1";  // the agent store every agent and worker connects to
  int store_port = 29500;                // 0 with --standalone: a free port
  // etcd: store_host:store_port is etcd; the round's node 0 serves its workers' store on this
  // port (--master-port; 0: a free one).
  int worker_store_port = 0;
  // Each round's node 0 serves its workers' store (true), or worker rank 0 does, on a port that
  // node 0's agent picks (false: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as torchrun).
  bool share_worker_store = true;
  bool standalone = false;
  std::string run_id = "none";
  RendezvousSettings rdzv;
  int max_restarts = 0;
  std::chrono::milliseconds monitor_interval = std::chrono::milliseconds(100);
  std::chrono::milliseconds shutdown_timeout = std::chrono::seconds(30);
  std::string role = "default";
  std::string log_dir;  // empty: a temporary directory
  StreamSelection redirects;
  StreamSelection tee;
  std::optional<std::set<int>> local_ranks_filter;
  std::string local_addr;
  std::vector<int> signals_to_handle;
  // As given: the workers' TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun's agent exports it.
  std::string signals_to_handle_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // --virtual-local-rank: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES of one device per worker.
  bool virtual_local_rank = false;
  // --numa-binding (PET_NUMA_BINDING): each worker bound to CPUs of the plan the agent makes
  // from the machine's topology (placement/binding_plan.h); none: no binding, torchrun's
  // OMP_NUM_THREADS=1 for several workers.
  std::optional<BindingPolicy> numa_binding;
  // --collectives ddprun (PET_COLLECTIVES, DDP_TORCH_COLLECTIVES): Python workers' gloo CPU
  // collectives take the library's "ddprun" backend (python_hook.h).
  bool ddprun_collectives = false;
  // DDP_PYTHON_HOOK (on by default): Python workers get ddprun's sitecustomize hook
  // (python_hook.h); off leaves PYTHONPATH as torchrun's but for ddprun_torch's folder, last.
  bool python_hook = true;
  // Set by the agent: with ddprun_collectives, the hook's folder and ddprun_torch's, first on
  // the workers' PYTHONPATH; without, ddprun_torch's folder beside ddprun, last.
  std::vector<std::string> python_path_prepend;
  std::vector<std::string> python_path_append;
  // --duplicate-std{out,err}-filters: tee'd lines holding any of these also go to
  // attempt_N/filtered_std{out,err}.log.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: each tee'd line's prefix, from ${role_name},
  // ${rank} and ${local_rank} (worker_line_prefix()); unset: torchrun's "[<role><local rank>]:".
  std::optional<std::string> log_line_prefix_template;
  EventLogHandler event_log;
  // What each worker executes: argv[0] is a program name or path (PATH is searched at spawn).
  // Empty only for the doctor without a program.
  std::vector<std::string> command;
  bool doctor = false;        // `ddprun doctor`: check the nodes, run no program (doctor.h)
  int metrics_port = 0;       // --metrics-port: the Prometheus endpoint's; 0: none
  int health_check_port = 0;  // TORCHELASTIC_HEALTH_CHECK_PORT (health_endpoint.h); 0: none
  // TORCHELASTIC_ENABLE_FILE_TIMER=1: the file-timer watchdog (file_timer.h) on the named pipe
  // TORCHELASTIC_TIMER_FILE (default: a new one in the temporary directory per round). A path
  // given without the switch still reaches the workers, as under torchrun.
  bool file_timer = false;
  std::string timer_file;
  bool preflight = false;  // --preflight: the doctor first, then the program if every node passed
  // Where the values came from, for the one-line summary.
  std::string platform;
  std::string node_rank_source;
  std::string nnodes_source;
  std::string store_source;
  // Things the user should know (ignored compatibility flags, unknown rdzv-conf keys).
  std::vector<std::string> notices;

  // One line: node, workers, rendezvous, where each came from.
  std::string describe() const;
};

LaunchConfig resolve_launch_config(const CommandLine& cli, const EnvMap& env,
                                   const HostFacts& host);

// torchrun's comma_separated_list: "a,b" -> {"a", "b"}, ",," is a comma inside an item.
std::vector<std::string> split_filter_list(const std::string& text);

// "SIGTERM" / "TERM" / "15" -> 15. Throws ConfigError for unknown or uncatchable signals.
int parse_signal(const std::string& what, const std::string& text);
std::string signal_name(int signal);

}  // namespace ddprun
