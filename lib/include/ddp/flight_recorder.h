#pragma once
// The flight recorder: every communicator keeps its last N collectives (sequence number, op,
// dtype, element count, bytes, algorithm, start and end time, the peer it waits on now) in a
// ring. Under ddprun the ring lives in a file the worker maps shared (DDP_FLIGHT_RECORDER_FILE,
// set per worker), so the agent on the node reads it at any time, without the worker's help:
// also when the worker is stopped, spinning, or dead. That is how ddprun diagnoses a hang
// (launcher/README.md, "Hang diagnosis"). Elsewhere the ring is private memory that a program
// reads through Communicator::flight_recorder().
//
// One writer (the thread that runs the communicator's ops, one op at a time), any number of
// readers in other processes: each entry is a seqlock over relaxed atomics, and a reader keeps
// only entries it read whole. Torch-free (ddp::base), so ddprun reads what the library wrote.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ddp::flight {

enum class OpKind : std::uint8_t {
  kNone = 0,
  kAllreduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kBarrier,
};
const char* to_string(OpKind kind);

enum class OpState : std::uint8_t { kRunning = 0, kDone = 1, kFailed = 2 };

// One op as a reader sees it.
struct OpRecord {
  std::uint64_t seq = 0;  // 1, 2, ... in issue order, the same on every rank for the same op
  OpKind kind = OpKind::kNone;
  OpState state = OpState::kRunning;
  std::string dtype;        // "float32"
  std::uint64_t count = 0;  // elements
  std::uint64_t bytes = 0;
  std::string label;  // what the caller said the op is for, e.g. "bucket"; "" for nothing
  std::int64_t label_index = -1;  // e.g. the bucket's index; -1 for none
  std::string algorithm;          // "ring", "direct", ...; "" until the algorithm is chosen
  // CLOCK_MONOTONIC_COARSE: one clock for every process of a host, 1-4 ms behind the precise
  // CLOCK_MONOTONIC (monotonic_ns()), at a quarter of its cost; CLOCK_MONOTONIC itself while
  // set_precise_stamps(true).
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;  // 0 while running
  int waiting_on = -1;      // global rank of the peer the op waits on now (running ops)

  // "allreduce #12 (bucket 3, 4.0 KiB float32)"
  std::string describe() const;
};

// A recorder's content at one moment.
struct Snapshot {
  int rank = -1;
  int world_size = 0;
  int pid = 0;
  std::chrono::milliseconds warn_after{0};  // 0: hang warnings are off
  std::chrono::milliseconds timeout{0};     // the communicator's op timeout
  std::uint64_t begun = 0;                  // ops begun (the last one's seq)
  std::vector<OpRecord> ops;                // ascending seq, the newest last

  // The op begun last, while it runs.
  const OpRecord* running() const;
  // The newest finished op (done or failed).
  const OpRecord* last_finished() const;
  // When hang warnings start for this recorder: warn_after, but never later than 3/4 of the op
  // timeout, so that the diagnosis precedes the timeout's failure. 0 when off.
  std::chrono::milliseconds warn_threshold() const;
};

// A name of up to 8 characters as the ring stores it (the first 8 of a longer one); a constant
// when the name is, so that recording an op copies no string.
constexpr std::uint64_t name_code(const char* text) {
  std::uint64_t code = 0;
  for (int i = 0; text != nullptr && i < 8 && text[i] != '\0'; ++i) {
    code |= static_cast<std::uint64_t>(static_cast<unsigned char>(text[i])) << (8 * i);
  }
  return code;
}

// Names the next ops this thread issues (a caller's annotation; the reducer names its buckets).
class OpLabel {
 public:
  // Only the first 8 characters of `name` are kept.
  OpLabel(const char* name, std::int64_t index);
  ~OpLabel();
  OpLabel(const OpLabel&) = delete;
  OpLabel& operator=(const OpLabel&) = delete;

  // The label in effect on this thread.
  struct Current {
    std::uint64_t name = 0;  // name_code(); 0 for no label
    std::int64_t index = -1;
  };
  static Current current();

 private:
  Current previous_;
};

struct Layout;
struct Slot;

class Recorder {
 public:
  // `capacity` ops (0: records nothing). With a non-empty `path` the ring is that file, created
  // (or replaced) and mapped shared; otherwise private memory. ConfigError when the file cannot
  // be created or mapped, naming it.
  Recorder(std::size_t capacity, const std::string& path, int rank, int world_size);
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  bool enabled() const { return layout_ != nullptr; }
  const std::string& path() const { return path_; }

  void set_thresholds(std::chrono::milliseconds warn_after, std::chrono::milliseconds timeout);
  // Stamps ops with CLOCK_MONOTONIC (a timeline's resolution, ~30 ns more per stamp) rather than
  // CLOCK_MONOTONIC_COARSE; any thread may switch it.
  void set_precise_stamps(bool on) { precise_.store(on, std::memory_order_relaxed); }

  struct Op {
    OpKind kind;
    std::uint64_t dtype;  // name_code("float32"); 0 for none
    std::uint64_t count;
    std::uint64_t bytes;
    OpLabel::Current label;
  };
  // Records the op as running on this thread; returns its seq (0 when disabled).
  std::uint64_t begin(const Op& op);
  // Records the end of the op begun last; the thread's notes stop.
  void end(std::uint64_t seq, bool ok);

  // Notes on the op running on this thread (nothing when none runs): the algorithm the op took
  // (name_code(); the first note stands), and the peer it now waits on (-1: none).
  static void note_algorithm(std::uint64_t name);
  static void note_waiting_on(int global_rank);

  Snapshot snapshot() const;

 private:
  Layout* layout_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  std::string path_;
  // The writer's own counters (begin/end, one thread at a time).
  std::uint64_t begun_ = 0;
  std::uint32_t next_index_ = 0;
  std::uint32_t wraps_ = 0;
  Slot* running_ = nullptr;
  std::uint32_t running_version_ = 0;
  std::uint32_t running_kind_ = 0;
  std::atomic<bool> precise_{false};
};

// Reads a recorder file another process writes (or wrote before it died). nullopt, with the
// reason in `error`, when the file is missing, too short or not a recorder.
std::optional<Snapshot> read_file(const std::string& path, std::string* error = nullptr);

// CLOCK_MONOTONIC in nanoseconds: never behind start_ns and end_ns.
std::int64_t monotonic_ns();

}  // namespace ddp::flight
