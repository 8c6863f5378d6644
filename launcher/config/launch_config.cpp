#include "config/launch_config.h"

#include <cctype>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "config/kubernetes.h"
#include "ddp/env_vars.h"
#include "ddp/error.h"
#include "ddp/settings.h"

namespace ddprun {
namespace {

using ddp::ConfigError;
constexpr long kMaxNodes = 1 << 20;
constexpr int kDefaultC10dPort = 29400;
constexpr int kDefaultEtcdPort = 2379;

std::optional<std::string> env_value(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

// The explicit flag, else its PET_* environment default.
std::optional<Sourced<std::string>> pick(const CommandLine& cli, const EnvMap& env,
                                         const std::string& flag) {
  if (auto it = cli.given.find(flag); it != cli.given.end()) {
    return Sourced<std::string>{it->second, "--" + flag};
  }
  const std::string pet = pet_env_name(flag);
  if (auto value = env_value(env, pet)) return Sourced<std::string>{*value, pet};
  return std::nullopt;
}

bool pick_switch(const CommandLine& cli, const EnvMap& env, const std::string& flag) {
  auto v = pick(cli, env, flag);
  return v && ddp::env::parse_bool(v->source, v->value);
}

int to_int(const Sourced<std::string>& v, long lo, long hi) {
  return static_cast<int>(ddp::env::parse_int(v.source, v.value, lo, hi));
}

std::chrono::milliseconds to_seconds(const std::string& what, const std::string& text, double lo,
                                     double hi) {
  char* end = nullptr;
  const double seconds = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(seconds) || seconds < lo ||
      seconds > hi) {
    std::ostringstream range;
    range << "[" << lo << ", " << hi << "]";
    throw ConfigError(what + "='" + text + "' is not a number of seconds in " + range.str());
  }
  return std::chrono::milliseconds(static_cast<long>(std::llround(seconds * 1000)));
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

void parse_nnodes(const Sourced<std::string>& v, int& min_nodes, int& max_nodes) {
  const auto colon = v.value.find(':');
  if (colon == std::string::npos) {
    min_nodes = max_nodes = to_int(v, 1, kMaxNodes);
    return;
  }
  min_nodes = to_int({v.value.substr(0, colon), v.source + " (minimum)"}, 1, kMaxNodes);
  max_nodes = to_int({v.value.substr(colon + 1), v.source + " (maximum)"}, 1, kMaxNodes);
  if (min_nodes > max_nodes) {
    throw ConfigError(v.source + "=" + v.value +
                      ": the minimum node count is above the maximum; use MIN:MAX with MIN <= MAX");
  }
}

int parse_nproc(const Sourced<std::string>& v, const HostFacts& host) {
  if (v.value == "cpu") return std::max(1, host.usable_cpus);
  if (v.value == "auto") return host.gpus > 0 ? host.gpus : std::max(1, host.usable_cpus);
  if (v.value == "gpu") {
    if (host.gpus == 0) {
      throw ConfigError(v.source + "=gpu but this node has no GPUs; use a number, 'cpu' or 'auto'");
    }
    return host.gpus;
  }
  char* end = nullptr;
  const long n = std::strtol(v.value.c_str(), &end, 10);
  if (end == v.value.c_str() || *end != '\0' || n < 1 || n > 4096) {
    throw ConfigError(v.source + "='" + v.value +
                      "' is not a worker count; use a number in [1, 4096], 'cpu', 'gpu' or 'auto'");
  }
  return static_cast<int>(n);
}

unsigned parse_stream_bits(const std::string& what, const std::string& text) {
  if (text.size() == 1 && text[0] >= '0' && text[0] <= '3')
    return static_cast<unsigned>(text[0] - '0');
  throw ConfigError(
      what + "='" + text +
      "' is not a stream selection; use 0 (none), 1 (stdout), 2 (stderr) or 3 (both)");
}

StreamSelection parse_streams(const std::optional<Sourced<std::string>>& v) {
  StreamSelection s;
  if (!v) return s;
  if (v->value.find(':') == std::string::npos) {
    s.all = parse_stream_bits(v->source, v->value);
    return s;
  }
  for (const auto& item : split(v->value, ',')) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) {
      throw ConfigError(v->source + "='" + v->value + "': '" + item +
                        "' is not LOCAL_RANK:STREAMS; write e.g. 0:3,1:2");
    }
    const int rank = to_int({item.substr(0, colon), v->source + " local rank"}, 0, 4095);
    s.per_rank[rank] = parse_stream_bits(v->source, item.substr(colon + 1));
  }
  return s;
}

// "host", "host:port", "[v6]:port".
void parse_endpoint(const Sourced<std::string>& v, int default_port, std::string& host, int& port) {
  std::string text = v.value;
  port = default_port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos) {
      throw ConfigError(v.source + "='" + v.value + "': missing ']' in the IPv6 address");
    }
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':')
        throw ConfigError(v.source + "='" + v.value + "' is not [ADDR]:PORT");
      port = to_int({text.substr(close + 2), v.source + " port"}, 0, 65535);
    }
  } else if (auto colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    port = to_int({text.substr(colon + 1), v.source + " port"}, 0, 65535);
  } else {
    host = text;
  }
  if (host.empty())
    throw ConfigError(v.source + "='" + v.value + "' names no host; use HOST[:PORT]");
}

void parse_rdzv_conf(const Sourced<std::string>& v, LaunchConfig& c) {
  for (const auto& item : split(v.value, ',')) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw ConfigError(v.source + "='" + v.value + "': '" + item + "' is not KEY=VALUE");
    }
    const std::string key = item.substr(0, eq);
    const std::string value = item.substr(eq + 1);
    const std::string what = v.source + " " + key;
    if (key == "join_timeout" || key == "timeout") {
      c.rdzv.join_timeout = to_seconds(what, value, 0.001, 7 * 24 * 3600);
    } else if (key == "last_call_timeout") {
      c.rdzv.last_call_timeout = to_seconds(what, value, 0, 24 * 3600);
    } else if (key == "read_timeout") {
      c.rdzv.read_timeout = to_seconds(what, value, 0.001, 24 * 3600);
    } else if (key == "exit_barrier_timeout") {
      c.rdzv.exit_barrier_timeout = to_seconds(what, value, 0, 24 * 3600);
      c.rdzv.exit_barrier_timeout_given = true;
    } else if (key == "keep_alive_interval") {
      c.rdzv.keep_alive_interval = to_seconds(what, value, 0.01, 3600);
    } else if (key == "keep_alive_max_attempt") {
      c.rdzv.keep_alive_max_attempt = to_int({value, what}, 1, 1000);
    } else if (key == "is_host") {
      c.rdzv.is_host = ddp::env::parse_bool(what, value);
    } else if (key == "token_file") {
      c.rdzv.token_file = value;
    } else if (key == "store_peers") {
      c.rdzv.store_peers.clear();
      for (const auto& peer : split(value, ';')) {
        if (!peer.empty()) c.rdzv.store_peers.push_back(peer);
      }
    } else if (key == "etcd_prefix") {
      if (value.empty() || value.front() != '/') {
        throw ConfigError(what + "='" + value + "' must start with '/', e.g. /torchelastic/p2p");
      }
      c.rdzv.etcd_prefix = value;
    } else if (key == "protocol") {
      if (value != "http" && value != "https") {
        throw ConfigError(what + "='" + value + "' is not http or https");
      }
      c.rdzv.etcd_protocol = value;
    } else if (key == "cacert") {
      c.rdzv.etcd_cacert = value;
    } else if (key == "cert") {
      c.rdzv.etcd_cert = value;
    } else if (key == "key") {
      c.rdzv.etcd_key = value;
    } else {
      c.notices.push_back(v.source + ": ignoring rendezvous option '" + key + "'");
    }
  }
}

// The token file's content less trailing whitespace (a Secret's value often ends in a newline).
std::string read_join_token(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) {
    throw ConfigError("cannot read the join token file '" + path +
                      "'; mount the job's token Secret there or fix --rdzv-conf token_file");
  }
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) {
    throw ConfigError("the join token file '" + path +
                      "' is empty or missing; mount the job's token Secret there or fix "
                      "--rdzv-conf token_file");
  }
  return token;
}

struct SignalName {
  const char* name;
  int number;
};
constexpr SignalName kSignals[] = {
    {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT}, {"SIGILL", SIGILL},
    {"SIGTRAP", SIGTRAP}, {"SIGABRT", SIGABRT}, {"SIGBUS", SIGBUS},   {"SIGFPE", SIGFPE},
    {"SIGKILL", SIGKILL}, {"SIGUSR1", SIGUSR1}, {"SIGSEGV", SIGSEGV}, {"SIGUSR2", SIGUSR2},
    {"SIGPIPE", SIGPIPE}, {"SIGALRM", SIGALRM}, {"SIGTERM", SIGTERM}, {"SIGCHLD", SIGCHLD},
    {"SIGCONT", SIGCONT}, {"SIGSTOP", SIGSTOP}, {"SIGTSTP", SIGTSTP}, {"SIGTTIN", SIGTTIN},
    {"SIGTTOU", SIGTTOU}, {"SIGXCPU", SIGXCPU}, {"SIGXFSZ", SIGXFSZ}, {"SIGPWR", SIGPWR},
};

}  // namespace

unsigned StreamSelection::for_rank(int local_rank) const {
  auto it = per_rank.find(local_rank);
  return it != per_rank.end() ? it->second : all;
}

std::string signal_name(int signal) {
  for (const auto& s : kSignals) {
    if (s.number == signal) return s.name;
  }
  return "signal " + std::to_string(signal);
}

int parse_signal(const std::string& what, const std::string& text) {
  int number = 0;
  if (!text.empty() && std::isdigit(static_cast<unsigned char>(text[0]))) {
    number = static_cast<int>(ddp::env::parse_int(what, text, 1, 64));
  } else {
    const std::string name = text.rfind("SIG", 0) == 0 ? text : "SIG" + text;
    for (const auto& s : kSignals) {
      if (name == s.name) number = s.number;
    }
    if (number == 0) {
      throw ConfigError(what + ": unknown signal '" + text + "'; use names like SIGTERM,SIGINT");
    }
  }
  if (number == SIGKILL || number == SIGSTOP || number == SIGCHLD) {
    throw ConfigError(what + ": " + signal_name(number) + " cannot be handled; remove it");
  }
  return number;
}

namespace {

// The steps of resolve_launch_config, each one concern; every value comes from its flag, else
// its PET_ variable (pick), else where noted from the pod (kubernetes.h), else a default.

// The program and how it is run: Python scripts and modules through $PYTHON_EXEC -u.
void resolve_program(const CommandLine& cli, const EnvMap& env, LaunchConfig& c) {
  c.doctor = cli.doctor;
  c.preflight = pick_switch(cli, env, "preflight");
  if (c.doctor && c.preflight) {
    throw ConfigError(
        "--preflight runs the doctor before the program; 'doctor' runs it instead: "
        "drop one of them");
  }
  if (cli.program.empty()) {
    if (c.doctor) return;  // the doctor runs no program
    throw ConfigError("no program to run; usage: ddprun [OPTION...] PROGRAM [ARG...]");
  }
  const bool module = pick_switch(cli, env, "module");
  const bool no_python = pick_switch(cli, env, "no-python");
  if (module && no_python) {
    throw ConfigError("--module and --no-python exclude each other; a module needs Python");
  }
  const std::string& program = cli.program.front();
  const bool python_script =
      program.size() > 3 && program.compare(program.size() - 3, 3, ".py") == 0;
  if (!no_python && (module || python_script)) {
    c.command = {env_value(env, "PYTHON_EXEC").value_or("python3"), "-u"};
    if (module) c.command.push_back("-m");
  }
  c.command.insert(c.command.end(), cli.program.begin(), cli.program.end());
}

// The node count: --nnodes, PET_NNODES, DDP_NNODES or the pod's job; --standalone is one node.
// Returns what the pod says, for the later steps.
PodPlacement resolve_node_count(const CommandLine& cli, const EnvMap& env, const HostFacts& host,
                                LaunchConfig& c) {
  c.standalone = pick_switch(cli, env, "standalone");
  const bool derive_master = !pick(cli, env, "master-addr") && !env_value(env, "MASTER_ADDR") &&
                             !pick(cli, env, "rdzv-endpoint") && !c.standalone;
  PodPlacement pod = detect_pod_placement(env, host, derive_master);
  c.platform = pod.platform;

  std::optional<Sourced<std::string>> nnodes = pick(cli, env, "nnodes");
  if (auto ddp_nnodes = env_value(env, ddp::settings::kNnodes.name)) {
    if (!nnodes) {
      nnodes = Sourced<std::string>{*ddp_nnodes, ddp::settings::kNnodes.name};
    } else if (nnodes->source == "PET_NNODES" && nnodes->value != *ddp_nnodes) {
      throw ConfigError("PET_NNODES=" + nnodes->value + " and DDP_NNODES=" + *ddp_nnodes +
                        " disagree; set only one of them");
    }
  }
  if (!nnodes && pod.nnodes) {
    nnodes = Sourced<std::string>{std::to_string(pod.nnodes->value), pod.nnodes->source};
  }
  if (c.standalone) {
    if (nnodes && nnodes->value != "1" && nnodes->value != "1:1") {
      throw ConfigError(nnodes->source + "=" + nnodes->value +
                        " contradicts --standalone, which runs one node; drop one of them");
    }
    nnodes.reset();
  }
  if (!nnodes && pod.needs_node_count) {
    throw ConfigError(pod.platform + " detected (" +
                      (pod.node_rank ? pod.node_rank->source : std::string("JOBSET_NAME")) +
                      " is set) but the node count is unknown; pass --nnodes N or set DDP_NNODES "
                      "to the number of pods (the Job's completions)");
  }
  if (nnodes) {
    parse_nnodes(*nnodes, c.min_nodes, c.max_nodes);
    c.nnodes_source = nnodes->source;
  } else {
    c.nnodes_source = c.standalone ? "--standalone" : "default";
  }
  finish_jobset_node_rank(pod, c.max_nodes, c.nnodes_source);
  return pod;
}

// static or c10d (the store's protocol either way), or etcd; an elastic range needs c10d or etcd.
void resolve_rendezvous_backend(const CommandLine& cli, const EnvMap& env, LaunchConfig& c) {
  const auto backend = pick(cli, env, "rdzv-backend");
  if (c.standalone) {
    c.rdzv_backend = RdzvBackend::kC10d;
  } else if (!backend || backend->value == "static") {
    c.rdzv_backend = RdzvBackend::kStatic;
  } else if (backend->value == "c10d") {
    c.rdzv_backend = RdzvBackend::kC10d;
  } else if (backend->value == "etcd-v2" || backend->value == "etcd") {
    // torchrun's two names; both are etcd's v3 API here (etcd 3.4 and newer).
    c.rdzv_backend = RdzvBackend::kEtcd;
    if (!pick(cli, env, "rdzv-endpoint")) {
      throw ConfigError(backend->source + "=" + backend->value +
                        " needs --rdzv-endpoint HOST[:PORT] naming the etcd cluster (e.g. "
                        "etcd-service:2379)");
    }
  } else {
    throw ConfigError(backend->source + "='" + backend->value +
                      "' is not supported; use 'c10d', 'etcd-v2' or 'static'");
  }
  if (c.rdzv_backend == RdzvBackend::kStatic && c.min_nodes != c.max_nodes) {
    throw ConfigError(c.nnodes_source + "=" + std::to_string(c.min_nodes) + ":" +
                      std::to_string(c.max_nodes) +
                      " is an elastic range, which the static rendezvous cannot do; add "
                      "--rdzv-backend c10d (or etcd-v2) or give one node count");
  }
}

// The node rank: the flag, else the pod's index, else 0 (static) or the order of joining (c10d).
void resolve_node_rank(const CommandLine& cli, const EnvMap& env, const PodPlacement& pod,
                       LaunchConfig& c) {
  const auto node_rank_flag = pick(cli, env, "node-rank");
  if (node_rank_flag) {
    c.node_rank = to_int(*node_rank_flag, 0, kMaxNodes);
    c.node_rank_source = node_rank_flag->source;
    if (node_rank_flag->source == "PET_NODE_RANK" && pod.node_rank &&
        pod.node_rank->value != *c.node_rank) {
      throw ConfigError("PET_NODE_RANK=" + node_rank_flag->value + " disagrees with " +
                        pod.node_rank->source + " (node rank " +
                        std::to_string(pod.node_rank->value) +
                        "); remove PET_NODE_RANK or fix "
                        "the pod spec");
    }
  } else if (pod.node_rank && !c.standalone) {
    c.node_rank = pod.node_rank->value;
    c.node_rank_source = pod.node_rank->source;
  } else if (c.rdzv_backend == RdzvBackend::kStatic || c.max_nodes == 1) {
    c.node_rank = 0;
    c.node_rank_source = "default";
  } else {
    c.node_rank_source = "host name order";
  }
  if (c.standalone) {
    c.node_rank = 0;
    c.node_rank_source = "--standalone";
  }
  if (c.node_rank && *c.node_rank >= c.max_nodes) {
    throw ConfigError("node rank " + std::to_string(*c.node_rank) + " (from " + c.node_rank_source +
                      ") is not below the node count " + std::to_string(c.max_nodes) + " (from " +
                      c.nnodes_source +
                      "); node ranks run from 0 to nnodes-1, so raise --nnodes/DDP_NNODES or fix "
                      "the rank");
  }
}

// Where the store is: --rdzv-endpoint, else --master-addr/--master-port, else the pod's master.
void resolve_store_endpoint(const CommandLine& cli, const EnvMap& env, const PodPlacement& pod,
                            LaunchConfig& c) {
  if (c.standalone) {
    c.store_host = "127.0.0.1";
    c.store_port = 0;
    c.store_source = "--standalone (free port)";
  } else {
    const auto endpoint = pick(cli, env, "rdzv-endpoint");
    if (endpoint) {
      const int default_port = c.rdzv_backend == RdzvBackend::kC10d   ? kDefaultC10dPort
                               : c.rdzv_backend == RdzvBackend::kEtcd ? kDefaultEtcdPort
                                                                      : 29500;
      parse_endpoint(*endpoint, default_port, c.store_host, c.store_port);
      c.store_source = endpoint->source;
      if (c.rdzv_backend == RdzvBackend::kEtcd) {
        if (auto port = pick(cli, env, "master-port"))
          c.worker_store_port = to_int(*port, 1, 65535);
      }
    } else {
      if (auto addr = pick(cli, env, "master-addr")) {
        c.store_host = addr->value;
        c.store_source = addr->source;
      } else if (pod.master_addr) {
        c.store_host = pod.master_addr->value;
        c.store_source = pod.master_addr->source;
      } else if (!pod.master_problem.empty() && c.max_nodes > 1) {
        throw ConfigError("cannot find the master for the " + pod.platform + ": " +
                          pod.master_problem);
      } else {
        c.store_source = "default";
      }
      std::string port_source = "default";
      if (auto port = pick(cli, env, "master-port")) {
        c.store_port = to_int(*port, 1, 65535);
        port_source = port->source;
      } else if (pod.master_port) {
        c.store_port = pod.master_port->value;
        port_source = pod.master_port->source;
      }
      if (port_source != c.store_source) c.store_source += ", port from " + port_source;
    }
  }
}

// Run id, rendezvous options and join token, restarts, monitoring, signals, role.
void resolve_supervision(const CommandLine& cli, const EnvMap& env, const HostFacts& host,
                         LaunchConfig& c) {
  if (c.standalone) {
    c.run_id = host.unique_id;
  } else if (auto id = pick(cli, env, "rdzv-id")) {
    c.run_id = id->value;
  }
  if (auto conf = pick(cli, env, "rdzv-conf")) parse_rdzv_conf(*conf, c);
  if (c.rdzv.token_file.empty()) {
    if (auto it = env.find(ddp::settings::kRdzvTokenFile.name); it != env.end())
      c.rdzv.token_file = it->second;
  }
  if (!c.rdzv.token_file.empty()) c.rdzv.join_token = read_join_token(c.rdzv.token_file);
  // torchrun's opt-out of sharing its store with the workers: exactly "1" turns it on.
  c.share_worker_store = env_value(env, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1";
  if (auto v = pick(cli, env, "max-restarts")) c.max_restarts = to_int(*v, 0, 1 << 20);
  if (auto v = pick(cli, env, "metrics-port")) c.metrics_port = to_int(*v, 1, 65535);
  if (auto port = env_value(env, "TORCHELASTIC_HEALTH_CHECK_PORT")) {
    c.health_check_port = to_int({*port, "TORCHELASTIC_HEALTH_CHECK_PORT"}, 1, 65535);
  }
  c.file_timer = env_value(env, "TORCHELASTIC_ENABLE_FILE_TIMER") == "1";
  c.timer_file = env_value(env, "TORCHELASTIC_TIMER_FILE").value_or("");
  if (auto v = pick(cli, env, "monitor-interval")) {
    c.monitor_interval = to_seconds(v->source, v->value, 0.001, 3600);
  }
  const auto signals = pick(cli, env, "signals-to-handle")
                           .value_or(Sourced<std::string>{c.signals_to_handle_text, ""});
  for (const auto& name : split(signals.value, ',')) {
    c.signals_to_handle.push_back(parse_signal(signals.source, name));
  }
  c.signals_to_handle_text = signals.value;
  if (auto v = pick(cli, env, "role")) c.role = v->value;
}

// The flag, else its PET_ form, else torchrun's own variable (TORCH_ELASTIC_*).
std::optional<Sourced<std::string>> pick_or_variable(const CommandLine& cli, const EnvMap& env,
                                                     const std::string& flag,
                                                     const std::string& variable) {
  if (auto v = pick(cli, env, flag)) return v;
  if (auto value = env_value(env, variable)) return Sourced<std::string>{*value, variable};
  return std::nullopt;
}

// How long workers get to stop, and nodes wait for each other at the end. Runs after
// --rdzv-conf, whose exit_barrier_timeout the flag overrides and the variable does not.
void resolve_timeouts(const CommandLine& cli, const EnvMap& env, LaunchConfig& c) {
  if (auto v = pick_or_variable(cli, env, "shutdown-timeout", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT")) {
    c.shutdown_timeout = to_seconds(v->source, v->value, 0, 24 * 3600);
  }
  auto barrier = pick(cli, env, "exit-barrier-timeout");
  if (!barrier && !c.rdzv.exit_barrier_timeout_given) {
    if (auto value = env_value(env, "TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT")) {
      barrier = Sourced<std::string>{*value, "TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT"};
    }
  }
  if (barrier)
    c.rdzv.exit_barrier_timeout = to_seconds(barrier->source, barrier->value, 0, 24 * 3600);
}

// Flags torchrun has that ddprun accepts without acting on them, saying so.
void resolve_compatibility(const CommandLine& cli, const EnvMap& env, LaunchConfig& c) {
  if (auto v = pick(cli, env, "logs-specs")) {
    throw ConfigError(v->source + "='" + v->value +
                      "': a torchrun.logs_specs entry point is Python code, which ddprun cannot "
                      "load; drop the flag for torchrun's default layout (--log-dir, --tee, "
                      "--redirects)");
  }
  if (auto v = pick(cli, env, "start-method")) {
    if (v->value != "spawn" && v->value != "fork" && v->value != "forkserver") {
      throw ConfigError(v->source + "='" + v->value + "' is not spawn, fork or forkserver");
    }
    if (v->value != "spawn") {
      c.notices.push_back(v->source + "=" + v->value +
                          " has no effect: workers are always new processes (fork+exec)");
    }
  }
  if (pick_switch(cli, env, "run-path")) {
    c.notices.push_back("--run-path has no effect: the script runs in its own interpreter");
  }
}

// Where the workers' output goes.
void resolve_output(const CommandLine& cli, const EnvMap& env, LaunchConfig& c) {
  if (auto v = pick(cli, env, "log-dir")) c.log_dir = v->value;
  c.redirects = parse_streams(pick(cli, env, "redirects"));
  c.tee = parse_streams(pick(cli, env, "tee"));
  if (auto v = pick(cli, env, "local-ranks-filter")) {
    std::set<int> ranks;
    for (const auto& item : split(v->value, ',')) {
      const int r = to_int({item, v->source}, 0, 4095);
      if (r >= c.nproc_per_node) {
        throw ConfigError(v->source + "=" + v->value + ": local rank " + item +
                          " is not below the workers per node (" +
                          std::to_string(c.nproc_per_node) + ")");
      }
      ranks.insert(r);
    }
    c.local_ranks_filter = ranks;
  }
  if (auto v = pick(cli, env, "local-addr")) c.local_addr = v->value;
  c.log_line_prefix_template = env_value(env, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
  if (auto v = pick(cli, env, "duplicate-stdout-filters")) {
    c.duplicate_stdout_filters = split_filter_list(v->value);
  }
  if (auto v = pick(cli, env, "duplicate-stderr-filters")) {
    c.duplicate_stderr_filters = split_filter_list(v->value);
  }
  if (auto v = pick(cli, env, "event-log-handler")) {
    c.event_log = parse_event_log_handler(v->source, v->value);
  }
}

// What each worker is told about its place on the node.
void resolve_worker_view(const CommandLine& cli, const EnvMap& env, LaunchConfig& c) {
  if (auto v = pick_or_variable(cli, env, "collectives", ddp::settings::kTorchCollectives.name)) {
    if (v->value != "torch" && v->value != "ddprun") {
      throw ConfigError(v->source + "=" + v->value + ": 'torch' (the script's own backend) or " +
                        "'ddprun' (gloo becomes the library's backend)");
    }
    c.ddprun_collectives = v->value == "ddprun";
  }
  if (auto hook = env.find(ddp::settings::kPythonHook.name); hook != env.end()) {
    if (hook->second != "on" && hook->second != "off") {
      throw ConfigError(std::string(ddp::settings::kPythonHook.name) + "=" + hook->second +
                        ": 'on' (ddprun's sitecustomize hook for Python workers) or 'off'");
    }
    c.python_hook = hook->second == "on";
  }
  if (c.ddprun_collectives && !c.python_hook) {
    throw ConfigError(
        std::string("--collectives ddprun works through ddprun's Python hook, which ") +
        ddp::settings::kPythonHook.name + "=off turns off; drop one of the two");
  }
  if (auto v = pick(cli, env, "numa-binding")) {
    c.numa_binding = parse_binding_policy(v->source, v->value);
  }
  c.virtual_local_rank = pick_switch(cli, env, "virtual-local-rank");
  if (!c.virtual_local_rank) return;
  const auto devices = env_value(env, "CUDA_VISIBLE_DEVICES");
  if (devices && static_cast<int>(split(*devices, ',').size()) < c.nproc_per_node) {
    throw ConfigError("--virtual-local-rank: CUDA_VISIBLE_DEVICES=" + *devices + " lists " +
                      std::to_string(split(*devices, ',').size()) + " devices for " +
                      std::to_string(c.nproc_per_node) +
                      " workers; list one per worker or lower --nproc-per-node");
  }
}

}  // namespace

std::vector<std::string> split_filter_list(const std::string& text) {
  std::vector<std::string> items(1);
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      items.back() += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      items.back() += ',';
      ++i;
    } else {
      items.emplace_back();
    }
  }
  return items;
}

namespace {

// An elastic c10d job in an Indexed Job whose master came from the pod names: the store may move
// to any of its pods, so each of their names is a place to look for it (store_peers).
void derive_store_peers(const PodPlacement& pod, LaunchConfig& c) {
  if (!c.rdzv.store_peers.empty() || pod.pod_prefix.empty()) return;
  if (c.rdzv_backend != RdzvBackend::kC10d || c.min_nodes == c.max_nodes) return;
  for (int i = 0; i < c.max_nodes; ++i) {
    c.rdzv.store_peers.push_back(pod.pod_prefix + std::to_string(i) + pod.pod_domain);
  }
}

}  // namespace

LaunchConfig resolve_launch_config(const CommandLine& cli, const EnvMap& env,
                                   const HostFacts& host) {
  LaunchConfig c;
  resolve_program(cli, env, c);
  const PodPlacement pod = resolve_node_count(cli, env, host, c);
  c.nproc_per_node = parse_nproc(
      pick(cli, env, "nproc-per-node").value_or(Sourced<std::string>{"1", "default"}), host);
  resolve_rendezvous_backend(cli, env, c);
  resolve_node_rank(cli, env, pod, c);
  resolve_store_endpoint(cli, env, pod, c);
  resolve_supervision(cli, env, host, c);
  derive_store_peers(pod, c);
  resolve_timeouts(cli, env, c);
  resolve_compatibility(cli, env, c);
  resolve_output(cli, env, c);
  resolve_worker_view(cli, env, c);
  return c;
}

const char* to_string(RdzvBackend backend) {
  switch (backend) {
    case RdzvBackend::kStatic:
      return "static";
    case RdzvBackend::kC10d:
      return "c10d";
    case RdzvBackend::kEtcd:
      return "etcd-v2";
  }
  return "unknown";
}

std::string LaunchConfig::describe() const {
  std::ostringstream out;
  const std::string nodes = min_nodes == max_nodes
                                ? std::to_string(max_nodes)
                                : std::to_string(min_nodes) + ".." + std::to_string(max_nodes);
  out << "node " << (node_rank ? std::to_string(*node_rank) : std::string("?")) << " of " << nodes
      << " (rank from " << node_rank_source << ", count from " << nnodes_source;
  if (!platform.empty()) out << "; " << platform;
  out << "), " << nproc_per_node << " worker" << (nproc_per_node == 1 ? "" : "s") << " per node, "
      << to_string(rdzv_backend) << " rendezvous at " << store_host << ":" << store_port
      << " (from " << store_source << "), run id '" << run_id << "', max restarts " << max_restarts
      << ":";
  if (!share_worker_store) out << " worker rank 0 serves the workers' store;";
  if (numa_binding)
    out << " workers bound to CPUs by --numa-binding " << to_string(*numa_binding) << ";";
  if (doctor) out << " doctor (the program is not run)";
  if (preflight) out << " doctor, then";
  if (!doctor) {
    for (const auto& arg : command) out << " " << arg;
  }
  return out.str();
}

EventLogHandler parse_event_log_handler(const std::string& what, const std::string& value) {
  EventLogHandler handler;
  if (value == "null" || value == "dynamic_rendezvous") return handler;
  if (value == "console") {
    handler.kind = EventLogHandler::Kind::kConsole;
  } else if (value.rfind("file:", 0) == 0 && value.size() > 5) {
    handler.kind = EventLogHandler::Kind::kFile;
    handler.path = value.substr(5);
  } else {
    throw ddp::ConfigError(what + "='" + value +
                           "' is not an event log handler: use null, console or file:PATH");
  }
  return handler;
}

}  // namespace ddprun
