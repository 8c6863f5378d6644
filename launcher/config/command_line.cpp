#include "config/command_line.h"

#include <algorithm>
#include <cctype>

#include <cxxopts.hpp>

#include "ddp/error.h"

namespace ddprun {
namespace {

const FlagSpec* find_long(const std::string& name) {
  for (const auto& spec : flag_specs()) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

const FlagSpec* find_short(char c) {
  for (const auto& spec : flag_specs()) {
    if (spec.short_name[0] == c && spec.short_name[1] == '\0') return &spec;
  }
  return nullptr;
}

// Flags that do something instead of launching; they have no PET_ default.
bool is_action(const std::string& flag) { return flag == "help" || flag == "print-settings"; }

cxxopts::Options make_options() {
  cxxopts::Options options("ddprun",
                           "Starts a distributed job: one agent per node hosts or joins the "
                           "rendezvous store and runs --nproc-per-node workers with torchrun's "
                           "environment.");
  options.custom_help("[OPTION...]");
  options.positional_help("[doctor] PROGRAM [ARG...]");
  options.set_width(100);
  auto adder = options.add_options();
  for (const auto& spec : flag_specs()) {
    std::string names = spec.short_name[0] != '\0' ? std::string(spec.short_name) + "," + spec.name
                                                   : std::string(spec.name);
    std::string help = spec.help;
    if (spec.default_text[0] != '\0') help += " (default: " + std::string(spec.default_text) + ")";
    if (!is_action(spec.name)) help += " [" + pet_env_name(spec.name) + "]";
    if (spec.takes_value) {
      adder(names, help, cxxopts::value<std::string>());
    } else {
      adder(names, help, cxxopts::value<bool>());
    }
  }
  return options;
}

}  // namespace

const std::vector<FlagSpec>& flag_specs() {
  static const std::vector<FlagSpec> specs = {
      {"nnodes", "", true, "1:1",
       "Number of nodes, N or MIN:MAX (an elastic range needs --rdzv-backend c10d or etcd-v2)"},
      {"nproc-per-node", "", true, "1",
       "Workers per node: a number, 'cpu' (usable CPUs), 'gpu' (GPUs) or 'auto' (GPUs, else "
       "CPUs)"},
      {"node-rank", "", true, "0",
       "Rank of this node in [0, nnodes); defaults from Kubernetes when running in a pod"},
      {"master-addr", "", true, "127.0.0.1",
       "Host of the node-rank-0 agent, which serves the store (static rendezvous)"},
      {"master-port", "", true, "29500",
       "Port of the node-rank-0 agent's store (etcd-v2: of the workers' store; default a free "
       "port)"},
      {"rdzv-backend", "", true, "static",
       "'static' (node 0 serves the store at master-addr:master-port), 'c10d' (the store "
       "at --rdzv-endpoint) or 'etcd-v2' (an etcd cluster at --rdzv-endpoint; 'etcd' too)"},
      {"rdzv-endpoint", "", true, "",
       "HOST[:PORT] of the c10d rendezvous store (port 29400) or of etcd (port 2379)"},
      {"rdzv-id", "", true, "none", "Job id shared by all nodes; TORCHELASTIC_RUN_ID"},
      {"rdzv-conf", "", true, "",
       "KEY=VALUE,... : join_timeout (s, 600), last_call_timeout (s, 30), read_timeout (s, 60), "
       "exit_barrier_timeout (s, 300), keep_alive_interval (s, 5), keep_alive_max_attempt (3), "
       "is_host (c10d), token_file (the job's join token; DDPRUN_RDZV_TOKEN_FILE), store_peers "
       "(HOST;HOST;...: where a moved store may be; an Indexed Job's pod names); etcd: "
       "etcd_prefix (/ddprun), protocol (http|https), cacert, cert, key"},
      {"standalone", "", false, "",
       "Single node: a private store on a free port, random run id (implies --nnodes 1)"},
      {"max-restarts", "", true, "0", "Group restarts allowed after a worker failure"},
      {"monitor-interval", "", true, "0.1",
       "Seconds between checks of the store for a failure on another node"},
      {"start-method", "", true, "spawn",
       "Accepted for compatibility; workers are always started with fork+exec"},
      {"role", "", true, "default", "Worker role name; ROLE_NAME"},
      {"module", "m", false, "", "PROGRAM is a Python module: run '$PYTHON_EXEC -u -m PROGRAM'"},
      {"no-python", "", false, "", "Exec PROGRAM directly even if it ends in .py"},
      {"run-path", "", false, "",
       "Accepted for compatibility; the script runs in its own interpreter"},
      {"log-dir", "", true, "",
       "Directory for per-rank logs and error files (default: a temporary directory)"},
      {"redirects", "r", true, "0",
       "Send worker output to files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local "
       "rank, e.g. 0:1,1:2"},
      {"tee", "t", true, "0",
       "Copy worker output to files as well as the console (same values as --redirects)"},
      {"local-ranks-filter", "", true, "",
       "Show console output only of these local ranks, e.g. 0,1 (files keep everything)"},
      {"local-addr", "", true, "", "Address of this node as other nodes reach it"},
      {"signals-to-handle", "", true, "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
       "Signals forwarded to the workers before stopping them"},
      {"shutdown-timeout", "", true, "30",
       "Seconds workers get after a forwarded signal before SIGKILL; unset, "
       "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"},
      {"exit-barrier-timeout", "", true, "300",
       "Seconds a node whose workers finished waits for the other nodes before exiting; unset, "
       "rdzv-conf exit_barrier_timeout, then TORCH_ELASTIC_EXIT_BARRIER_TIMEOUT"},
      {"collectives", "", true, "torch",
       "CPU collectives of Python workers: 'torch' (the script's backend) or 'ddprun' "
       "(init_process_group's gloo, or no backend on CPU, becomes the library's 'ddprun' "
       "backend, through a sitecustomize hook; DDP_TORCH_COLLECTIVES too)"},
      {"virtual-local-rank", "", false, "",
       "Every worker sees LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES holding only its own device"},
      {"numa-binding", "", true, "",
       "Bind each worker to CPUs: 'node' (its NUMA node's), 'socket' (its package's), "
       "'exclusive' (physical cores of its own) or 'core-complex' (an L3 domain's); each then "
       "gets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS from its cores "
       "(default: off)"},
      {"duplicate-stdout-filters", "", true, "",
       "Also write tee'd stdout lines that contain any of these comma-separated strings (',,' is "
       "a comma) to attempt_N/filtered_stdout.log in the node's log directory"},
      {"duplicate-stderr-filters", "", true, "",
       "The same for stderr, into attempt_N/filtered_stderr.log"},
      {"event-log-handler", "", true, "null",
       "Where torchelastic's events go, as JSON lines: 'null' (nowhere), 'console' (stderr) or "
       "'file:PATH' (appended to PATH)"},
      {"logs-specs", "", true, "",
       "Refused unless absent: a torchrun.logs_specs entry point is Python code; torchrun's "
       "default layout (--log-dir, --tee, --redirects) is ddprun's"},
      {"metrics-port", "", true, "",
       "Serve Prometheus metrics (GET /metrics) on this port on every node: step time, images/s, "
       "loss, learning rate, allreduce wait and bytes, restarts, worker states (default: off)"},
      {"preflight", "", false, "",
       "Run 'ddprun doctor' before the workers start and fail fast (exit 78 on a bad node)"},
      {"print-settings", "", false, "",
       "Print every DDP_* setting with the value in effect and where it comes from, then exit"},
      {"help", "h", false, "", "Print this help"},
  };
  return specs;
}

std::string pet_env_name(const std::string& flag) {
  std::string name = "PET_";
  for (char c : flag) {
    name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

CommandLine parse_command_line(const std::vector<std::string>& argv) {
  CommandLine result;
  // cxxopts would also take flags placed after the program; torchrun stops at the program, so
  // split first, normalizing every flag to "--name=value" with dashes.
  std::vector<std::string> normalized = {argv.empty() ? "ddprun" : argv[0]};
  std::size_t first = 1;
  if (argv.size() > 1 && argv[1] == "doctor") {
    result.doctor = true;
    first = 2;
  }
  for (std::size_t i = first; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      result.program.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
      break;
    }
    const FlagSpec* spec = nullptr;
    std::string inline_value;
    bool has_inline = false;
    if (arg.rfind("--", 0) == 0) {
      std::string name = arg.substr(2);
      if (auto eq = name.find('='); eq != std::string::npos) {
        inline_value = name.substr(eq + 1);
        has_inline = true;
        name.resize(eq);
      }
      std::replace(name.begin(), name.end(), '_', '-');
      spec = find_long(name);
      if (spec == nullptr) {
        throw ddp::ConfigError("unknown option '--" + name + "'; see 'ddprun --help'");
      }
    } else if (arg.size() > 1 && arg[0] == '-') {
      spec = find_short(arg[1]);
      if (spec == nullptr) {
        throw ddp::ConfigError("unknown option '" + arg.substr(0, 2) + "'; see 'ddprun --help'");
      }
      if (arg.size() > 2) {
        if (!spec->takes_value) {
          throw ddp::ConfigError("option '-" + std::string(spec->short_name) +
                                 "' takes no value (got '" + arg + "')");
        }
        inline_value = arg.substr(arg[2] == '=' ? 3 : 2);
        has_inline = true;
      }
    } else {
      result.program.assign(argv.begin() + static_cast<long>(i), argv.end());
      break;
    }
    std::string flag = "--" + std::string(spec->name);
    if (spec->takes_value && !has_inline) {
      if (i + 1 >= argv.size()) {
        throw ddp::ConfigError("option '" + flag + "' needs a value; see 'ddprun --help'");
      }
      inline_value = argv[++i];
      has_inline = true;
    }
    normalized.push_back(has_inline ? flag + "=" + inline_value : flag);
  }

  auto options = make_options();
  std::vector<char*> raw;
  for (auto& s : normalized) raw.push_back(s.data());
  try {
    auto parsed = options.parse(static_cast<int>(raw.size()), raw.data());
    for (const auto& spec : flag_specs()) {
      if (parsed.count(spec.name) == 0) continue;
      result.given[spec.name] = spec.takes_value
                                    ? parsed[spec.name].as<std::string>()
                                    : (parsed[spec.name].as<bool>() ? "true" : "false");
    }
  } catch (const cxxopts::exceptions::exception& e) {
    throw ddp::ConfigError(std::string(e.what()) + "; see 'ddprun --help'");
  }
  result.help = result.given.count("help") != 0 && result.given["help"] == "true";
  result.print_settings =
      result.given.count("print-settings") != 0 && result.given["print-settings"] == "true";
  result.given.erase("help");
  result.given.erase("print-settings");
  if (!result.doctor && !result.program.empty() && result.program.front() == "doctor") {
    result.doctor = true;
    result.program.erase(result.program.begin());
  }
  return result;
}

std::string help_text() {
  return make_options().help() +
         "\nEvery flag also accepts underscores (--nproc_per_node) and takes its default from\n"
         "the PET_<NAME> environment variable shown in brackets; a flag given explicitly wins.\n"
         "In a Kubernetes pod the node rank, node count and master address are read from the\n"
         "Indexed Job, JobSet, PyTorchJob or TrainJob environment (see launcher/README.md).\n"
         "A PROGRAM ending in .py, or -m MODULE, runs as '$PYTHON_EXEC -u' (default python3);\n"
         "anything else is executed directly.\n"
         "'ddprun [OPTION...] doctor [PROGRAM...]' checks every node and the links between\n"
         "them instead (the program is not run): exit 0 when healthy, 78 on a bad node.\n";
}

}  // namespace ddprun
