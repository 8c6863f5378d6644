#pragma once
// Every DDP_* and DDPRUN_* setting, declared once: name, type, default, accepted values, who reads
// it and what it does (the model is aws-ofi-nccl's nccl_ofi_param.h). The library and ddprun read
// their settings only through this header, so a malformed value fails the same way wherever it is
// read; `ddprun --print-settings` shows the values in effect and where each came from, and the
// README's settings table is generated from all() (markdown_table(); a test compares the two).
//
// The worker environment of torchrun's contract (RANK, WORLD_SIZE, MASTER_ADDR, ...) is not a
// setting: ddp/env.h reads it.
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddp::settings {

enum class Type {
  kInteger,
  kBytes,    // an integer count of bytes
  kBoolean,  // 1/0, true/false, yes/no, on/off
  kChoice,   // one of `choices`
  kText,
};

struct Setting {
  const char* name;
  Type type;
  // The value in effect when the variable is unset, as the table shows it. The typed default,
  // declared nowhere else: a plain value of the setting's type ("1800", "gloo"), which may be
  // followed by a note in parentheses ("0 (links are judged ...)"); the *_or_default readers
  // below return it. Anything else describes a default that its reader computes ("per
  // transport ...") and has no typed default.
  const char* default_text;
  // kInteger and kBytes: the accepted range.
  long min_value;
  long max_value;
  // kChoice: the accepted spellings, separated by '|'.
  const char* choices;
  // Another variable read when this one is unset ("" for none), e.g. GLOO_SOCKET_IFNAME.
  const char* fallback;
  // Who reads it: "library" (every program built on ddp::ddp, in the worker), "ddprun",
  // "ddprun_torch" (the Python backend), "tests".
  const char* read_by;
  const char* doc;
};

constexpr long kMiB = 1L << 20;
constexpr long kGiB = 1L << 30;

// --- The communicator --------------------------------------------------------------------------
inline constexpr Setting kBackend{
    "DDP_BACKEND",
    Type::kChoice,
    "gloo",
    0,
    0,
    "gloo|fabric",
    "",
    "library",
    "The communicator backend of init_process_group (fabric only in builds with libfabric)."};
inline constexpr Setting kTimeoutSec{
    "DDP_TIMEOUT_SEC",
    Type::kInteger,
    "1800",
    1,
    7 * 24 * 3600,
    "",
    "",
    "library",
    "Bound in seconds on every collective and on joining the group; a peer that does not take "
    "part within it fails the op."};
inline constexpr Setting kSocketIfname{
    "DDP_SOCKET_IFNAME",
    Type::kText,
    "the address that routes to MASTER_ADDR",
    0,
    0,
    "",
    "GLOO_SOCKET_IFNAME",
    "library",
    "The network interface the gloo backend listens on, and fabric's tcp provider binds to "
    "(unless FI_TCP_IFACE is set)."};
inline constexpr Setting kFabricProvider{
    "DDP_FABRIC_PROVIDER",
    Type::kText,
    "efa where present, else shm on one host, else tcp;ofi_rxm",
    0,
    0,
    "",
    "FI_PROVIDER",
    "library",
    "The libfabric provider of the fabric backend (efa, shm, tcp;ofi_rxm, ...)."};
inline constexpr Setting kCollectives{
    "DDP_COLLECTIVES",
    Type::kChoice,
    "auto",
    0,
    0,
    "auto|flat|hierarchical",
    "",
    "library",
    "Hierarchical collectives (inside each node, then across nodes) or flat ones over all ranks; "
    "auto takes hierarchical ones on even nodes of more than one rank."};

// --- The collective algorithms (one set for every transport) ------------------------------------
inline constexpr Setting kAlgorithm{
    "DDP_ALGORITHM",
    Type::kChoice,
    "auto",
    0,
    0,
    "auto|direct|ring|recursive_doubling",
    "",
    "library",
    "The allreduce algorithm; direct takes one round wherever the transport's round carries the "
    "payload, auto's choice elsewhere."};
// At most 16 MiB: one round stops paying long before, and gloo keeps receive slots of this size
// per level.
inline constexpr Setting kDirectBytes{
    "DDP_DIRECT_BYTES",
    Type::kBytes,
    "per transport (gloo 1 MiB, fabric 0)",
    0,
    16 * kMiB,
    "",
    "",
    "library",
    "A collective whose payload times the peer count is below this takes one round, where every "
    "rank sends its payload to every other; 0: never."};
inline constexpr Setting kRingThreshold{
    "DDP_RING_THRESHOLD",
    Type::kBytes,
    "per transport (gloo 0, fabric 64-512 KiB)",
    0,
    kGiB,
    "",
    "",
    "library",
    "Payloads of at least this many bytes take the bandwidth-optimal ring (the pipelined chain for "
    "broadcasts), smaller ones recursive doubling."};
inline constexpr Setting kChunkBytes{"DDP_CHUNK_BYTES",
                                     Type::kBytes,
                                     "per transport (gloo 4 MiB, fabric 256-512 KiB)",
                                     64,
                                     kGiB,
                                     "",
                                     "",
                                     "library",
                                     "The pipeline unit of the ring and the chain."};
inline constexpr Setting kPipelineDepth{
    "DDP_PIPELINE_DEPTH",
    Type::kInteger,
    "per transport (fabric on shm and tcp 2, else 4)",
    1,
    64,
    "",
    "",
    "library",
    "Receives the ring keeps posted at once, the one being waited for included."};
inline constexpr Setting kRingOrder{
    "DDP_RING_ORDER",
    Type::kChoice,
    "wavefront",
    0,
    0,
    "wavefront|step",
    "",
    "library",
    "The order in which the ring takes its incoming chunks; ranks must agree."};
inline constexpr Setting kHierarchySliceBytes{
    "DDP_HIERARCHY_SLICE_BYTES",
    Type::kBytes,
    "per transport (gloo 64 KiB + 1, fabric 8 KiB)",
    0,
    kGiB,
    "",
    "",
    "library",
    "From this payload up a hierarchical allreduce sends each local rank's slice across nodes; "
    "below it every local rank sends the whole node-reduced buffer. The same size of output "
    "(allgather) or input (reduce_scatter) decides between their hierarchical and flat forms."};
inline constexpr Setting kHierarchyPieceBytes{
    "DDP_HIERARCHY_PIECE_BYTES",
    Type::kBytes,
    "per transport (gloo 1 MiB, fabric 0)",
    0,
    kGiB,
    "",
    "",
    "library",
    "A hierarchical allreduce across N nodes runs in pieces of (N-1) times this (at most 64, "
    "where the buffer holds two), each piece crossing nodes on a second thread while the node "
    "reduce-scatters the next and allgathers the previous one; 0: one piece, the steps in turn."};

// --- The flight recorder and hang warnings (launcher/README.md, "Hang diagnosis") ---------------
inline constexpr Setting kHangWarnSec{
    "DDP_HANG_WARN_SEC",
    Type::kInteger,
    "60",
    0,
    7 * 24 * 3600,
    "",
    "",
    "library",
    "A collective that has waited this many seconds (at most 3/4 of DDP_TIMEOUT_SEC) makes ddprun "
    "gather every rank's flight recorder and name the rank holding the others up; 0 turns it "
    "off (TrainerOptions::hang_warn_sec wins). ddprun applies it to Python workers too: a main "
    "thread blocked this long in a c10d wait."};
inline constexpr Setting kPyStackSignal{
    "DDP_PY_STACK_SIGNAL",
    Type::kChoice,
    "off",
    0,
    0,
    "off|SIGUSR1|SIGUSR2",
    "",
    "ddprun",
    "The signal on which Python workers registered faulthandler (faulthandler.register): ddprun "
    "sends it to a Python rank the hang diagnosis names, if it catches it, for its Python "
    "stack."};
inline constexpr Setting kFlightRecorderEntries{
    "DDP_FLIGHT_RECORDER_ENTRIES",
    Type::kInteger,
    "256",
    0,
    1L << 20,
    "",
    "",
    "library",
    "Collectives each communicator's flight recorder keeps (about 100 bytes each); 0 records "
    "nothing, which also blinds the hang diagnosis."};
inline constexpr Setting kFlightRecorderFile{
    "DDP_FLIGHT_RECORDER_FILE",
    Type::kText,
    "none (ddprun sets one per worker; else private memory)",
    0,
    0,
    "",
    "",
    "library",
    "The file the first communicator of a process keeps its flight recorder in, shared with the "
    "agent that reads it; it stays after the worker exits."};

inline constexpr Setting kLiveMetricsFile{
    "DDP_LIVE_METRICS_FILE",
    Type::kText,
    "none (ddprun sets one per worker)",
    0,
    0,
    "",
    "",
    "library",
    "The file the trainer keeps its live figures in (step time, images/s, loss, learning rate, "
    "allreduce wait and bytes), read by the agent for its Prometheus endpoint and the first step "
    "of an elastic change's timeline."};

inline constexpr Setting kAbortFile{
    "DDP_ABORT_FILE",
    Type::kText,
    "none (ddprun sets one per worker)",
    0,
    0,
    "",
    "",
    "library",
    "The file ddprun writes a reason into when the round must stop for a cause the ranks cannot "
    "see (a node lost without closing its connections): the worker's collectives then give up "
    "with a CommError carrying it (libfabric's at once; gloo's, blocked inside gloo, by ending "
    "the process after 1 s with exit code 70)."};
inline constexpr Setting kRegroupFile{
    "DDP_REGROUP_FILE",
    Type::kText,
    "none (ddprun sets one per worker)",
    0,
    0,
    "",
    "",
    "library",
    "Where ddprun gives a worker that regroups in-process its place in the next world "
    "(ddp/distributed.h, ProcessGroup::regroup). The worker offers to regroup in <file>.able and "
    "says it is ready in <file>.ready; ddprun then writes the place (RANK, WORLD_SIZE, "
    "MASTER_ADDR, ... one NAME=VALUE a line) into the file."};
inline constexpr Setting kRegroupWaitSec{
    "DDP_REGROUP_WAIT_SEC",
    Type::kInteger,
    "30",
    0,
    3600,
    "",
    "",
    "library",
    "How long a worker that can regroup waits, after a collective failed on its own (a peer's "
    "connections closed), for ddprun's notice that a node was lost before it fails; 0: not at "
    "all. ddprun sets it from the heartbeat limit."};

// --- The rendezvous store ----------------------------------------------------------------------
inline constexpr Setting kStoreProtocol{
    "DDP_STORE_PROTOCOL",
    Type::kChoice,
    "auto",
    0,
    0,
    "auto|legacy|modern",
    "",
    "library",
    "The c10d store protocol of the client: legacy (PyTorch 1.13/2.0), modern (2.1 and later) or "
    "auto (asks the server)."};

// --- Kernels and logging -----------------------------------------------------------------------
inline constexpr Setting kIsa{
    "DDP_ISA",
    Type::kChoice,
    "the widest this CPU runs",
    0,
    0,
    "baseline|avx2|avx512|sve",
    "",
    "library",
    "The widest instruction set the reduction and activation kernels may use: avx2 and avx512 on "
    "x86-64, sve on arm64 (baseline is NEON there); a set this build or CPU lacks is an error."};
inline constexpr Setting kLogLevel{"DDP_LOG_LEVEL",
                                   Type::kChoice,
                                   "info",
                                   0,
                                   0,
                                   "trace|debug|info|warn|error|critical|off",
                                   "",
                                   "library, ddprun",
                                   "The level of the one logger of the library and ddprun."};

// --- The trainer -------------------------------------------------------------------------------
inline constexpr Setting kStragglerWindow{
    "DDP_STRAGGLER_WINDOW",
    Type::kInteger,
    "100",
    0,
    1000000,
    "",
    "",
    "library",
    "Steps between straggler reports: every rank's compute and wait time per step over that "
    "window, shared in one allgather; 0 turns them off (TrainerOptions::straggler_window wins)."};
inline constexpr Setting kStragglerPercent{
    "DDP_STRAGGLER_PERCENT",
    Type::kInteger,
    "120",
    101,
    10000,
    "",
    "",
    "library",
    "A rank is named a straggler when its compute per step exceeds the median rank's by this "
    "percentage: 120 is 1.2x (TrainerOptions::straggler_threshold wins)."};

inline constexpr Setting kTraceDir{
    "DDP_TRACE_DIR",
    Type::kText,
    "the current directory (ddprun sets its run's log folder)",
    0,
    0,
    "",
    "",
    "library",
    "Where the trainer's --trace-steps writes trace-rank<R>.json (TrainerOptions::trace_dir "
    "wins); ddprun merges a run's files into one trace.json."};

// --- The launcher ------------------------------------------------------------------------------
inline constexpr Setting kNnodes{
    "DDP_NNODES",
    Type::kText,
    "none (--nnodes, PET_NNODES, or the Kubernetes job)",
    0,
    0,
    "",
    "",
    "ddprun",
    "The node count, N or MIN:MAX, where neither --nnodes nor PET_NNODES gives it (e.g. an "
    "Indexed Job's manifest)."};

inline constexpr Setting kTorchCollectives{
    "DDP_TORCH_COLLECTIVES",
    Type::kChoice,
    "torch (--collectives, PET_COLLECTIVES)",
    0,
    0,
    "torch|ddprun",
    "",
    "ddprun",
    "ddprun: Python workers' init_process_group(\"gloo\"), or no backend on CPU, takes the "
    "library's \"ddprun\" backend (lib/python/README.md), where neither --collectives nor "
    "PET_COLLECTIVES says."};

inline constexpr Setting kPythonHook{
    "DDP_PYTHON_HOOK",
    Type::kChoice,
    "on",
    0,
    0,
    "on|off",
    "",
    "ddprun",
    "on: Python workers get ddprun's sitecustomize hook first on PYTHONPATH; it keeps "
    "TORCHELASTIC_USE_AGENT_STORE to the agent's own store, so that init_method=\"tcp://...\" on "
    "a port of the script's own works instead of hanging (pytorch PR #192113), and carries "
    "--collectives ddprun. off: no hook (--collectives ddprun then refuses to start)."};

inline constexpr Setting kDoctorShmBytes{
    "DDP_DOCTOR_SHM_BYTES",
    Type::kBytes,
    "64 MiB per rank, at least 256 MiB",
    0,
    1L << 50,
    "",
    "",
    "ddprun",
    "The free room ddprun doctor requires in each node's /dev/shm."};
inline constexpr Setting kDoctorTransferMs{
    "DDP_DOCTOR_TRANSFER_MS",
    Type::kInteger,
    "1000",
    50,
    60000,
    "",
    "",
    "ddprun",
    "How long ddprun doctor streams over each ring link in each direction."};
inline constexpr Setting kDoctorMinMbps{
    "DDP_DOCTOR_MIN_MBPS",
    Type::kInteger,
    "0 (links are judged against their median only)",
    0,
    1000000,
    "",
    "",
    "ddprun",
    "A link slower than this many Mbit/s in either direction is bad, whatever the median (the "
    "only judge of a 2-node job's one link)."};
inline constexpr Setting kDoctorSweepFile{
    "DDP_DOCTOR_SWEEP_FILE",
    Type::kText,
    "none (set by ddprun doctor for rank 0 of its sweep)",
    0,
    0,
    "",
    "",
    "ddprun",
    "Where ddprun-allreduce-sweep's rank 0 writes the bus bandwidth it measured, for the doctor's "
    "table."};

inline constexpr Setting kRdzvTokenFile{
    "DDPRUN_RDZV_TOKEN_FILE",
    Type::kText,
    "none (no join token: every address may join)",
    0,
    0,
    "",
    "",
    "ddprun",
    "The file holding the job's join token, as --rdzv-conf token_file= (which wins): agents "
    "prove they hold it (an HMAC challenge-response: the token never crosses the network), and "
    "the store admits workers only from the current round's members' addresses."};
inline constexpr Setting kRegroup{
    "DDPRUN_REGROUP",
    Type::kBoolean,
    "1",
    0,
    0,
    "",
    "",
    "ddprun",
    "Whether an elastic job's workers that offer it (a Trainer on the library's process group) "
    "regroup in-process on a membership change, keeping their state in memory; 0: every change "
    "stops and restarts the workers, as for Python programs."};
inline constexpr Setting kTorchLib{
    "DDPRUN_TORCH_LIB",
    Type::kText,
    "the libddp_capi.so.0 bundled with ddprun_torch, else the loader's search",
    0,
    0,
    "",
    "",
    "ddprun_torch",
    "Another libddp_capi.so.0 for the Python backend ddprun_torch to load (lib/python/README.md)."};

// --- Test hooks (never needed in production) ----------------------------------------------------
inline constexpr Setting kTestHostId{
    "DDP_TEST_HOST_ID",
    Type::kText,
    "none (the host's identity)",
    0,
    0,
    "",
    "",
    "tests",
    "Makes the processes of one host pose as a node of that name, to test multi-node topologies."};
inline constexpr Setting kTestCpuBf16{
    "DDP_TEST_CPU_BF16",
    Type::kBoolean,
    "none (the CPU's answer)",
    0,
    0,
    "",
    "",
    "tests",
    "Fakes whether the CPU computes bfloat16 natively (the --bf16 fallback)."};

inline constexpr Setting kTestStepDelayMs{
    "DDP_TEST_STEP_DELAY_MS",
    Type::kInteger,
    "0",
    0,
    60000,
    "",
    "",
    "tests",
    "Makes this rank's trainer compute each step this many milliseconds longer (a straggler)."};

// Every setting, in the order of the table.
const std::vector<const Setting*>& all();

// Names of earlier releases, refused with their successor's name.
struct Replaced {
  const char* old_name;
  const char* successor;
};
const std::vector<Replaced>& replaced();
// ConfigError if any of them is set, naming its successor.
void refuse_replaced();

// The variable's value (or its fallback's), nullopt when both are unset or empty.
std::optional<std::string> text(const Setting& setting);
// A kInteger/kBytes setting, checked against its range; nullopt when unset. ConfigError names the
// variable, the value and the range.
std::optional<long> integer(const Setting& setting);
// A kBoolean setting; nullopt when unset.
std::optional<bool> boolean(const Setting& setting);
// A kChoice setting's spelling, checked against its choices; nullopt when unset.
std::optional<std::string> spelling(const Setting& setting);

// The same, with the declared default (default_text) when unset. A setting without a typed default
// throws std::logic_error: its reader must compute the default (has_typed_default tells).
long integer_or_default(const Setting& setting);
bool boolean_or_default(const Setting& setting);
std::string spelling_or_default(const Setting& setting);
// Whether default_text is a plain value of the setting's type, within its range or choices.
bool has_typed_default(const Setting& setting);

// A kChoice setting mapped to `T`: `mapping` pairs each of the setting's spellings with its value.
template <typename T>
std::optional<T> choice(const Setting& setting,
                        std::initializer_list<std::pair<const char*, T>> mapping);

// ConfigError for the first malformed setting or replaced name in the environment: programs call
// it at start, so that a bad value fails before any work (even one read only later, or only by
// another backend).
void validate_all();

// Where a setting's value comes from, and what it is.
struct Effective {
  const Setting* setting;
  std::string value;   // as set, or the default's text
  std::string source;  // "environment", "GLOO_SOCKET_IFNAME" (a fallback) or "default"
  std::string error;   // the ConfigError's text, for a malformed value
};
std::vector<Effective> effective();

// The README's table of every setting (Markdown).
std::string markdown_table();
// What `ddprun --print-settings` prints: each setting's value in effect and its source.
std::string effective_table();

namespace detail {
[[noreturn]] void unmapped_spelling(const Setting& setting, const std::string& spelling);
}

template <typename T>
std::optional<T> choice(const Setting& setting,
                        std::initializer_list<std::pair<const char*, T>> mapping) {
  const auto value = spelling(setting);
  if (!value) return std::nullopt;
  for (const auto& [name, mapped] : mapping) {
    if (*value == name) return mapped;
  }
  detail::unmapped_spelling(setting, *value);
}

}  // namespace ddp::settings
