#include "doctor/doctor.h"

#include <glob.h>
#include <netdb.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <sstream>
#include <thread>

#include "base/cpu_features.h"
#include "ddp/error.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "ddp/net/local_address.h"
#include "ddp/settings.h"
#include "ddp/store.h"
#include "doctor/doctor_report.h"
#include "doctor/link_probe.h"
#include "supervision/worker_process.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using namespace doctor;

constexpr milliseconds kDnsTimeout{5000};
constexpr milliseconds kSweepTimeout{120000};

// libfabric's providers, from `fi_info -l` (one "name:" line each), bounded to 10 s.
void read_providers(const EnvMap& env, NodeFacts& facts) {
  try {
    (void)find_program("fi_info", env);
  } catch (const ddp::ConfigError&) {
    return;
  }
  FILE* pipe = popen("timeout 10 fi_info -l 2>/dev/null", "r");
  if (pipe == nullptr) return;
  facts.fi_info_found = true;
  char line[512];
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    std::string text(line);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    if (!text.empty() && text.back() == ':' && text[0] != ' ' && text[0] != '\t') {
      text.pop_back();
      facts.providers.push_back(text);
    }
  }
  pclose(pipe);
}

long long meminfo_value(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  long long value = 0;
  std::string rest;
  while (in >> name >> value) {
    std::getline(in, rest);
    if (name == key + ":") return value;
  }
  return 0;
}

// getaddrinfo cannot be cancelled: each lookup runs on a detached thread, and a lookup still
// running after kDnsTimeout counts as failed.
std::vector<DnsAnswer> resolve_all(const std::vector<std::string>& names) {
  struct Pending {
    std::string name;
    Clock::time_point start;
    std::shared_ptr<std::promise<DnsAnswer>> promise;
    std::future<DnsAnswer> future;
  };
  std::vector<Pending> pending;
  for (const auto& name : names) {
    auto promise = std::make_shared<std::promise<DnsAnswer>>();
    Pending p{name, Clock::now(), promise, promise->get_future()};
    std::thread([name, promise, start = p.start] {
      DnsAnswer a;
      a.name = name;
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      addrinfo* found = nullptr;
      const int rc = getaddrinfo(name.c_str(), nullptr, &hints, &found);
      a.ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      a.resolved = rc == 0;
      if (rc != 0) a.error = gai_strerror(rc);
      if (found != nullptr) freeaddrinfo(found);
      promise->set_value(a);
    }).detach();
    pending.push_back(std::move(p));
  }
  std::vector<DnsAnswer> answers;
  for (auto& p : pending) {
    if (p.future.wait_until(p.start + kDnsTimeout) == std::future_status::ready) {
      answers.push_back(p.future.get());
    } else {
      answers.push_back(
          {p.name, false, static_cast<double>(kDnsTimeout.count()), "no answer within 5 s"});
    }
  }
  return answers;
}

// The CPU: /proc/cpuinfo's model (arm64: the core its part number names) and the hwcaps the
// library's kernels and the --bf16 fallback read.
CpuFacts probe_cpu() {
  CpuFacts c;
  utsname machine{};
  c.arch = uname(&machine) == 0 ? machine.machine : "unknown";
  std::ifstream in("/proc/cpuinfo");
  std::stringstream text;
  text << in.rdbuf();
  c.model = cpu_model_from_cpuinfo(text.str());
  c.sve = ddp::detail::cpu_runs_sve();
  c.native_bf16 = ddp::detail::cpu_computes_bf16_natively();
  c.bf16_feature = ddp::detail::native_bf16_feature();
  return c;
}

NodeFacts probe_node(const EnvMap& env, const HostFacts& host, int node) {
  NodeFacts f;
  f.node = node;
  f.hostname = host.hostname;
  f.usable_cpus = host.usable_cpus;
  f.cpu = probe_cpu();
  read_providers(env, f);
  glob_t found{};
  if (glob("/dev/infiniband/uverbs*", 0, nullptr, &found) == 0) {
    f.efa_devices = static_cast<int>(found.gl_pathc);
  }
  globfree(&found);
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) == 0) {
    f.memlock_bytes = limit.rlim_cur == RLIM_INFINITY ? -1 : static_cast<long long>(limit.rlim_cur);
  }
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    f.nofile_soft =
        limit.rlim_cur == RLIM_INFINITY ? (1LL << 40) : static_cast<long long>(limit.rlim_cur);
  }
  f.hugepages_total = meminfo_value("HugePages_Total");
  f.hugepages_free = meminfo_value("HugePages_Free");
  struct statvfs shm {};
  if (statvfs("/dev/shm", &shm) == 0) {
    f.shm_free_bytes = static_cast<long long>(shm.f_bavail) * static_cast<long long>(shm.f_frsize);
    f.shm_size_bytes = static_cast<long long>(shm.f_blocks) * static_cast<long long>(shm.f_frsize);
  }
  return f;
}

// Every node adds itself to `key`; returns once all `nodes` did, or throws StoreError.
void barrier(ddp::Store& store, const std::string& key, int nodes, milliseconds timeout,
             const std::function<void()>& poll_interrupt) {
  const auto deadline = Clock::now() + timeout;
  milliseconds pause(5);  // backs off to 100 ms: a thousand agents poll the one store
  for (int64_t seen = store.add(key, 1); seen < nodes; seen = store.add(key, 0)) {
    poll_interrupt();
    if (Clock::now() > deadline) {
      throw ddp::StoreError("doctor: only " + std::to_string(seen) + " of " +
                            std::to_string(nodes) + " nodes reached '" + key + "' within " +
                            std::to_string(timeout.count() / 1000) +
                            " s; a node stopped answering (see its log)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(100));
  }
}

std::string read_fd(int fd) {
  std::string out;
  char buffer[4096];
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, 0) > 0) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    out.append(buffer, static_cast<std::size_t>(n));
  }
  return out;
}

// The allreduce sweep's program, installed beside ddprun; "" when missing.
std::string sweep_program(const EnvMap& env) {
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    std::string dir(self, static_cast<std::size_t>(n));
    dir = dir.substr(0, dir.find_last_of('/'));
    const std::string beside = dir + "/ddprun-allreduce-sweep";
    if (access(beside.c_str(), X_OK) == 0) return beside;
  }
  try {
    return find_program("ddprun-allreduce-sweep", env);
  } catch (const ddp::ConfigError&) {
    return "";
  }
}

// Runs this node's ranks of the sweep; "" when they all succeeded, else what failed.
std::string run_sweep(const std::string& program, const LaunchConfig& config, const EnvMap& env,
                      const NodeAssignment& node, const WorkerStore& store,
                      const std::string& result_file, const std::function<void()>& poll_interrupt) {
  std::vector<std::unique_ptr<WorkerProcess>> ranks;
  for (int lr = 0; lr < config.nproc_per_node; ++lr) {
    EnvMap worker = worker_environment(env, config, node, {lr, ""}, store);
    worker.erase("TORCHELASTIC_ERROR_FILE");
    if (node.rank_offset + lr == 0) worker[ddp::settings::kDoctorSweepFile.name] = result_file;
    ranks.push_back(std::make_unique<WorkerProcess>(std::vector<std::string>{program}, worker));
  }
  const auto deadline = Clock::now() + kSweepTimeout;
  std::string failure;
  std::vector<std::string> stderr_text(ranks.size());
  for (bool running = true; running;) {
    running = false;
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i]->stdout_fd() >= 0) (void)read_fd(ranks[i]->stdout_fd());
      if (ranks[i]->stderr_fd() >= 0) stderr_text[i] += read_fd(ranks[i]->stderr_fd());
      if (ranks[i]->running() && !ranks[i]->try_reap()) running = true;
    }
    if (!running) break;
    if (Clock::now() > deadline) {
      for (auto& r : ranks) r->signal_group(SIGKILL);
      failure = "the allreduce sweep did not finish within " +
                std::to_string(kSweepTimeout.count() / 1000) + " s";
    }
    try {
      poll_interrupt();
    } catch (...) {
      for (auto& r : ranks) r->signal_group(SIGKILL);
      throw;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  if (!failure.empty()) return failure;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i]->status().code == 0) continue;
    std::string last;
    std::istringstream lines(stderr_text[i]);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) last = line;
    }
    return "rank " + std::to_string(node.rank_offset + static_cast<int>(i)) + " of the allreduce " +
           "sweep exited with " + std::to_string(ranks[i]->status().code) +
           (last.empty() ? "" : ": " + last);
  }
  return "";
}

Requirements requirements_of(const LaunchConfig& config, const NodeAssignment& node) {
  Requirements r;
  r.nproc_per_node = config.nproc_per_node;
  r.world_size = node.world_size;
  r.shm_min_bytes = ddp::settings::integer(ddp::settings::kDoctorShmBytes)
                        .value_or(default_shm_min_bytes(config.nproc_per_node));
  r.backend = ddp::settings::spelling_or_default(ddp::settings::kBackend);
  r.provider = ddp::settings::text(ddp::settings::kFabricProvider).value_or("");
  for (const auto& arg : config.command) {
    if (arg == "--bf16" || arg == "--bf16=true" || arg == "--bf16=1") r.bf16 = true;
  }
  return r;
}

}  // namespace

namespace {

// Where each node's link probe listens (published through the doctor's store).
struct Peers {
  std::vector<std::string> names;  // the other nodes' names, for the DNS check
  std::vector<std::string> addresses;
  std::vector<int> ports;
};

// The allreduce sweep's outcome on this node.
struct SweepRun {
  std::string program;  // "" when it is not installed
  std::string file;     // where rank 0 writes its figures
  std::string note;     // why there are no figures, when there are none
  std::string error;    // what failed on this node
};

// One run of `ddprun doctor` on this node, step by step (run_doctor below).
class Doctor {
 public:
  Doctor(const LaunchConfig& config, const HostFacts& host, const EnvMap& env,
         Rendezvous& rendezvous, const NodeAssignment& node, const std::string& log_root,
         const std::function<void()>& poll_interrupt)
      : config_(config),
        host_(host),
        env_(env),
        rendezvous_(rendezvous),
        node_(node),
        log_root_(log_root),
        poll_interrupt_(poll_interrupt),
        nodes_(node.group_world_size),
        store_(rendezvous.round_store(node.round, "doctor")),
        transfer_(ddp::settings::integer_or_default(ddp::settings::kDoctorTransferMs)),
        io_timeout_(transfer_ + milliseconds(15000)),
        step_timeout_(config.rdzv.read_timeout + 2 * io_timeout_) {}

  int run() {
    ddp::log::info("doctor: checking node {} of {} ({} ranks per node)", node_.group_rank, nodes_,
                   config_.nproc_per_node);
    const std::string address = this_address();
    LinkProbeServer probe("0.0.0.0", io_timeout_);
    const Peers peers = exchange_where(address, probe.port());
    NodeFacts facts = probe_node(env_, host_, node_.group_rank);
    facts.address = address;
    facts.probe_port = probe.port();
    facts.dns = resolve_all(peers.names);
    const std::vector<LinkResult> links = measure_ring(peers);
    SweepRun sweep = run_this_nodes_sweep();
    store_->set("facts/" + std::to_string(node_.group_rank), facts_to_json(facts, links));
    if (!sweep.error.empty()) {
      store_->set("sweep_error/" + std::to_string(node_.group_rank), sweep.error);
    }
    const Verdict verdict =
        node_.group_rank == 0 ? judge_group(sweep) : verdict_from_json(store_->get("verdict"));
    // Node 0 serves the store: it leaves only once every node has read the verdict (or a node
    // that vanished meanwhile made that wait time out, which changes no node's verdict).
    try {
      barrier(*store_, "verdict_read", nodes_, step_timeout_, poll_interrupt_);
    } catch (const ddp::StoreError& e) {
      ddp::log::warn("{}", e.what());
    }
    return exit_code_for(verdict);
  }

 private:
  // Where the peers reach this node: the address that routes to the store (or --local-addr).
  std::string this_address() const {
    if (!config_.local_addr.empty()) return config_.local_addr;
    return ddp::net::is_loopback(rendezvous_.store_host())
               ? "127.0.0.1"
               : ddp::net::local_address_towards(rendezvous_.store_host());
  }

  // Publishes where this node's probe listens; reads where every node's does.
  Peers exchange_where(const std::string& address, int port) {
    std::string fqdn = host_.hostname;
    try {
      fqdn = host_.fqdn ? host_.fqdn() : host_.hostname;
    } catch (const std::exception&) {
    }
    store_->set("where/" + std::to_string(node_.group_rank),
                fqdn + "\n" + address + "\n" + std::to_string(port));
    std::vector<std::string> where_keys;
    for (int n = 0; n < nodes_; ++n) where_keys.push_back("where/" + std::to_string(n));
    const auto where = store_->multi_get(where_keys);
    Peers peers;
    peers.addresses.resize(static_cast<std::size_t>(nodes_));
    peers.ports.resize(static_cast<std::size_t>(nodes_));
    for (int n = 0; n < nodes_; ++n) {
      std::istringstream in(where[static_cast<std::size_t>(n)]);
      std::string name, port_text;
      std::getline(in, name);
      std::getline(in, peers.addresses[static_cast<std::size_t>(n)]);
      std::getline(in, port_text);
      peers.ports[static_cast<std::size_t>(n)] = std::atoi(port_text.c_str());
      if (n != node_.group_rank) peers.names.push_back(name);
    }
    return peers;
  }

  // The ring, phase by phase: in each, this node measures at most one link.
  std::vector<LinkResult> measure_ring(const Peers& peers) {
    std::vector<LinkResult> links;
    const auto phases = ring_phases(nodes_);
    LinkProbeOptions options;
    options.transfer = transfer_;
    options.io_timeout = io_timeout_;
    for (std::size_t k = 0; k < phases.size(); ++k) {
      for (const auto& [from, to] : phases[k]) {
        if (from != node_.group_rank) continue;
        LinkResult r{from, to, {}, ""};
        try {
          r.figures = measure_link(peers.addresses[static_cast<std::size_t>(to)],
                                   peers.ports[static_cast<std::size_t>(to)], options);
        } catch (const LinkError& e) {
          r.error = e.what();
        }
        links.push_back(r);
      }
      barrier(*store_, "phase/" + std::to_string(k), nodes_, step_timeout_, poll_interrupt_);
    }
    return links;
  }

  // The allreduce sweep over the chosen backend, with the job's ranks.
  SweepRun run_this_nodes_sweep() {
    SweepRun sweep;
    sweep.program = sweep_program(env_);
    sweep.file = log_root_ + "/doctor-sweep.json";
    if (sweep.program.empty()) {
      sweep.note = "skipped: ddprun-allreduce-sweep is not installed beside ddprun or on PATH";
    } else {
      sweep.error = run_sweep(sweep.program, config_, env_, node_, rendezvous_.worker_store(),
                              sweep.file, poll_interrupt_);
    }
    return sweep;
  }

  // Node 0: every node's findings, the sweep's figures, the verdict (logged and published).
  Verdict judge_group(SweepRun& sweep) {
    std::vector<std::string> keys;
    for (int n = 0; n < nodes_; ++n) keys.push_back("facts/" + std::to_string(n));
    std::vector<NodeFacts> all;
    std::vector<LinkResult> all_links;
    for (const auto& json : store_->multi_get(keys))
      all.push_back(facts_from_json(json, all_links));
    const Requirements req = requirements_of(config_, node_);
    std::vector<std::vector<Finding>> findings;
    for (int n = 0; n < nodes_; ++n) {
      findings.push_back(evaluate_node(all[static_cast<std::size_t>(n)], req));
      const std::string key = "sweep_error/" + std::to_string(n);
      if (store_->check({key})) findings.back().push_back({"sweep", Level::kBad, store_->get(key)});
    }
    const std::vector<SweepPoint> points = read_sweep(sweep);
    const double min_gbps =
        static_cast<double>(ddp::settings::integer_or_default(ddp::settings::kDoctorMinMbps)) /
        1000.0;
    const Verdict verdict = judge(all, findings, all_links, min_gbps);
    std::istringstream table(render(all, findings, all_links, points, sweep.note, verdict, req));
    for (std::string line; std::getline(table, line);) {
      if (verdict.problems.empty()) {
        ddp::log::info("{}", line);
      } else {
        ddp::log::warn("{}", line);
      }
    }
    store_->set("verdict", verdict_to_json(verdict));
    return verdict;
  }

  // Rank 0's figures of the sweep; notes in `sweep` why there are none.
  static std::vector<SweepPoint> read_sweep(SweepRun& sweep) {
    std::vector<SweepPoint> points;
    if (sweep.program.empty()) return points;
    std::ifstream in(sweep.file);
    std::stringstream text;
    text << in.rdbuf();
    try {
      if (!text.str().empty()) points = sweep_from_json(text.str());
    } catch (const std::exception& e) {
      sweep.note = e.what();
    }
    if (points.empty() && sweep.note.empty()) sweep.note = "no result (see the problems below)";
    return points;
  }

  int exit_code_for(const Verdict& verdict) const {
    if (verdict.problems.empty()) {
      ddp::log::info("doctor: node {} healthy; all {} nodes healthy", node_.group_rank, nodes_);
      return ddp::exit_code::kSuccess;
    }
    if (verdict.bad_nodes.count(node_.group_rank) != 0) {
      const auto why = verdict.reason.find(node_.group_rank);
      ddp::log::error("doctor: this node (node {}) is bad: {}; exit {}", node_.group_rank,
                      why == verdict.reason.end() ? "" : why->second, ddp::exit_code::kNodeBad);
      return ddp::exit_code::kNodeBad;
    }
    ddp::log::warn("doctor: this node is healthy; {} other{} bad ({})", verdict.bad_nodes.size(),
                   verdict.bad_nodes.size() == 1 ? " node is" : " nodes are",
                   verdict.problems.front());
    return config_.preflight ? ddp::exit_code::kRendezvous : ddp::exit_code::kSuccess;
  }

  const LaunchConfig& config_;
  const HostFacts& host_;
  const EnvMap& env_;
  Rendezvous& rendezvous_;
  const NodeAssignment& node_;
  const std::string& log_root_;
  const std::function<void()>& poll_interrupt_;
  const int nodes_;
  const std::shared_ptr<ddp::Store> store_;
  const milliseconds transfer_;
  const milliseconds io_timeout_;
  const milliseconds step_timeout_;
};

}  // namespace

int run_doctor(const LaunchConfig& config, const HostFacts& host, const EnvMap& env,
               Rendezvous& rendezvous, const NodeAssignment& node, const std::string& log_root,
               const std::function<void()>& poll_interrupt) {
  return Doctor(config, host, env, rendezvous, node, log_root, poll_interrupt).run();
}

}  // namespace ddprun
