#include "ddp/flight_recorder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ddp/error.h"

namespace ddp::flight {

// The ring as it lies in memory (and in the file): a header, then `capacity` slots. Only
// lock-free atomics of fixed width, so two processes share it.
struct Slot {
  std::atomic<std::uint32_t> version;  // odd while the writer changes the slot
  std::atomic<std::uint32_t> info;     // kind | state << 8
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> count;
  std::atomic<std::uint64_t> bytes;
  std::atomic<std::uint64_t> dtype;      // up to 8 characters
  std::atomic<std::uint64_t> label;      // up to 8 characters
  std::atomic<std::uint64_t> algorithm;  // up to 8 characters
  std::atomic<std::int64_t> label_index;
  std::atomic<std::int64_t> start_ns;
  std::atomic<std::int64_t> end_ns;
  std::atomic<std::int32_t> waiting_on;
  std::int32_t reserved;
};

struct Layout {
  static constexpr std::uint64_t kMagic = 0x3130524c46504444ULL;  // "DDPFLR01"
  static constexpr std::uint32_t kVersion = 1;
  std::uint64_t magic;
  std::uint32_t layout_version;
  std::uint32_t capacity;
  std::int32_t rank;
  std::int32_t world_size;
  std::int32_t pid;
  std::int32_t slot_bytes;
  std::atomic<std::int64_t> warn_after_ms;
  std::atomic<std::int64_t> timeout_ms;
  std::atomic<std::uint64_t> begun;

  Slot* slots() { return reinterpret_cast<Slot*>(this + 1); }
  const Slot* slots() const { return reinterpret_cast<const Slot*>(this + 1); }
};

static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);
static_assert(sizeof(Layout) % alignof(Slot) == 0);

namespace {

// Initial-exec: read at a fixed offset from the thread pointer, not through __tls_get_addr
// (a shared library's default), a few times per op. The library is linked, not dlopen'ed.
__attribute__((tls_model("initial-exec"))) thread_local OpLabel::Current t_label;
__attribute__((tls_model("initial-exec"))) thread_local Slot* t_running = nullptr;

std::string unpack(std::uint64_t v) {
  std::string text;
  for (; v != 0 && text.size() < 8; v >>= 8) text.push_back(static_cast<char>(v & 0xFF));
  return text;
}

std::size_t bytes_for(std::size_t capacity) { return sizeof(Layout) + capacity * sizeof(Slot); }

std::string errno_text() { return std::strerror(errno); }

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char text[32];
  if (u == 0) {
    std::snprintf(text, sizeof(text), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof(text), "%.1f %s", v, units[u]);
  }
  return text;
}

// Reads one slot whole, or nothing when the writer changed it meanwhile (or it is empty).
std::optional<OpRecord> read_slot(const Slot& s) {
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::uint32_t before = s.version.load(std::memory_order_acquire);
    if (before & 1U) continue;
    OpRecord r;
    r.seq = s.seq.load(std::memory_order_relaxed);
    const std::uint32_t info = s.info.load(std::memory_order_relaxed);
    r.kind = static_cast<OpKind>(info & 0xFF);
    r.state = static_cast<OpState>((info >> 8) & 0xFF);
    r.count = s.count.load(std::memory_order_relaxed);
    r.bytes = s.bytes.load(std::memory_order_relaxed);
    r.dtype = unpack(s.dtype.load(std::memory_order_relaxed));
    r.label = unpack(s.label.load(std::memory_order_relaxed));
    r.algorithm = unpack(s.algorithm.load(std::memory_order_relaxed));
    r.label_index = s.label_index.load(std::memory_order_relaxed);
    r.start_ns = s.start_ns.load(std::memory_order_relaxed);
    r.end_ns = s.end_ns.load(std::memory_order_relaxed);
    r.waiting_on = s.waiting_on.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.version.load(std::memory_order_relaxed) != before) continue;
    if (r.seq == 0) return std::nullopt;
    return r;
  }
  return std::nullopt;
}

Snapshot read_layout(const Layout& l) {
  Snapshot s;
  s.rank = l.rank;
  s.world_size = l.world_size;
  s.pid = l.pid;
  s.warn_after = std::chrono::milliseconds(l.warn_after_ms.load(std::memory_order_relaxed));
  s.timeout = std::chrono::milliseconds(l.timeout_ms.load(std::memory_order_relaxed));
  s.begun = l.begun.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < l.capacity; ++i) {
    if (auto r = read_slot(l.slots()[i])) s.ops.push_back(std::move(*r));
  }
  std::sort(s.ops.begin(), s.ops.end(),
            [](const OpRecord& a, const OpRecord& b) { return a.seq < b.seq; });
  return s;
}

}  // namespace

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kNone:
      break;
  }
  return "op";
}

std::string OpRecord::describe() const {
  std::string text = std::string(to_string(kind)) + " #" + std::to_string(seq);
  std::vector<std::string> parts;
  if (!label.empty()) {
    parts.push_back(label_index >= 0 ? label + " " + std::to_string(label_index) : label);
  }
  if (kind != OpKind::kBarrier) parts.push_back(human_bytes(bytes) + " " + dtype);
  if (!algorithm.empty()) parts.push_back(algorithm);
  if (parts.empty()) return text;
  text += " (";
  for (std::size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
  return text + ")";
}

const OpRecord* Snapshot::running() const {
  if (ops.empty() || ops.back().seq != begun || ops.back().state != OpState::kRunning) {
    return nullptr;
  }
  return &ops.back();
}

const OpRecord* Snapshot::last_finished() const {
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    if (it->state != OpState::kRunning) return &*it;
  }
  return nullptr;
}

std::chrono::milliseconds Snapshot::warn_threshold() const {
  if (warn_after.count() <= 0) return std::chrono::milliseconds(0);
  if (timeout.count() <= 0) return warn_after;
  return std::min(warn_after, timeout * 3 / 4);
}

OpLabel::OpLabel(const char* name, std::int64_t index) : previous_(t_label) {
  t_label = {name_code(name), index};
}

OpLabel::~OpLabel() { t_label = previous_; }

OpLabel::Current OpLabel::current() { return t_label; }

namespace {

// The ops' stamps: CLOCK_MONOTONIC as of the last timer tick (1-4 ms behind), read in a quarter
// of the time of the precise clock. A hang is seconds; an op's stamps need no better.
std::int64_t stamp_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace

std::int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

Recorder::Recorder(std::size_t capacity, const std::string& path, int rank, int world_size)
    : path_(path) {
  if (capacity == 0) return;
  mapped_bytes_ = bytes_for(capacity);
  void* memory = nullptr;
  if (path.empty()) {
    memory =
        mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else {
    // A new file renamed over the path: never one a reader still maps from an earlier process.
    std::string temp = path + ".XXXXXX";
    const int fd = mkostemp(temp.data(), O_CLOEXEC);
    if (fd < 0) {
      throw ConfigError("cannot create the flight recorder file " + path + " (" + errno_text() +
                        "); check DDP_FLIGHT_RECORDER_FILE's folder");
    }
    const auto fail = [&](const char* what) {
      const std::string why = errno_text();
      close(fd);
      unlink(temp.c_str());
      throw ConfigError(std::string("cannot ") + what + " the flight recorder file " + path + " (" +
                        why +
                        "); check its file system, or set "
                        "DDP_FLIGHT_RECORDER_ENTRIES=0 to go without");
    };
    if (fchmod(fd, 0644) != 0 || ftruncate(fd, static_cast<off_t>(mapped_bytes_)) != 0) {
      fail("size");
    }
    memory = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (memory == MAP_FAILED) fail("map");
    if (rename(temp.c_str(), path.c_str()) != 0) {
      munmap(memory, mapped_bytes_);
      fail("place");
    }
    close(fd);
  }
  if (memory == MAP_FAILED) {
    throw ConfigError("cannot map the flight recorder" + (path.empty() ? "" : " file " + path) +
                      " (" + errno_text() + "); set DDP_FLIGHT_RECORDER_ENTRIES=0 to go without");
  }
  // Fresh pages are zero: every slot is empty (seq 0, version 0).
  layout_ = new (memory) Layout{};
  layout_->capacity = static_cast<std::uint32_t>(capacity);
  layout_->layout_version = Layout::kVersion;
  layout_->rank = rank;
  layout_->world_size = world_size;
  layout_->pid = static_cast<std::int32_t>(getpid());
  layout_->slot_bytes = static_cast<std::int32_t>(sizeof(Slot));
  for (std::size_t i = 0; i < capacity; ++i) new (&layout_->slots()[i]) Slot{};
  std::atomic_thread_fence(std::memory_order_release);
  // The magic last: a reader that sees it sees a whole header.
  reinterpret_cast<std::atomic<std::uint64_t>*>(&layout_->magic)
      ->store(Layout::kMagic, std::memory_order_release);
}

Recorder::~Recorder() {
  if (layout_ != nullptr) munmap(layout_, mapped_bytes_);
}

void Recorder::set_thresholds(std::chrono::milliseconds warn_after,
                              std::chrono::milliseconds timeout) {
  if (layout_ == nullptr) return;
  layout_->warn_after_ms.store(warn_after.count(), std::memory_order_relaxed);
  layout_->timeout_ms.store(timeout.count(), std::memory_order_relaxed);
}

// The writer reads nothing back from the ring (its lines may have left the cache since the slot's
// last use): the seq, the slot and the seqlock's version come from its own counters. A slot's
// version is 4 x (times the ring wrapped) + 1..4: begin writes it odd then even, end again.
std::uint64_t Recorder::begin(const Op& op) {
  if (layout_ == nullptr) return 0;
  const std::uint64_t seq = ++begun_;
  Slot& s = layout_->slots()[next_index_];
  const std::uint32_t v = 4 * wraps_;
  if (++next_index_ == layout_->capacity) {
    next_index_ = 0;
    ++wraps_;
  }
  s.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.seq.store(seq, std::memory_order_relaxed);
  s.info.store(static_cast<std::uint32_t>(op.kind), std::memory_order_relaxed);
  s.count.store(op.count, std::memory_order_relaxed);
  s.bytes.store(op.bytes, std::memory_order_relaxed);
  s.dtype.store(op.dtype, std::memory_order_relaxed);
  s.label.store(op.label.name, std::memory_order_relaxed);
  s.label_index.store(op.label.name != 0 ? op.label.index : -1, std::memory_order_relaxed);
  s.algorithm.store(0, std::memory_order_relaxed);
  s.start_ns.store(precise_.load(std::memory_order_relaxed) ? monotonic_ns() : stamp_ns(),
                   std::memory_order_relaxed);
  s.end_ns.store(0, std::memory_order_relaxed);
  s.waiting_on.store(-1, std::memory_order_relaxed);
  s.version.store(v + 2, std::memory_order_release);
  layout_->begun.store(seq, std::memory_order_release);
  running_ = &s;
  running_version_ = v + 2;
  running_kind_ = static_cast<std::uint32_t>(op.kind);
  t_running = &s;
  return seq;
}

void Recorder::end(std::uint64_t seq, bool ok) {
  t_running = nullptr;
  if (layout_ == nullptr || seq == 0 || seq != begun_ || running_ == nullptr) return;
  Slot& s = *running_;
  running_ = nullptr;
  s.version.store(running_version_ + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const auto state = ok ? OpState::kDone : OpState::kFailed;
  s.info.store(running_kind_ | (static_cast<std::uint32_t>(state) << 8), std::memory_order_relaxed);
  s.end_ns.store(precise_.load(std::memory_order_relaxed) ? monotonic_ns() : stamp_ns(),
                 std::memory_order_relaxed);
  s.waiting_on.store(-1, std::memory_order_relaxed);
  s.version.store(running_version_ + 2, std::memory_order_release);
}

void Recorder::note_algorithm(std::uint64_t name) {
  // The first note stands: a composed op (hierarchical) names itself before its steps do.
  if (t_running != nullptr && t_running->algorithm.load(std::memory_order_relaxed) == 0) {
    t_running->algorithm.store(name, std::memory_order_relaxed);
  }
}

void Recorder::note_waiting_on(int global_rank) {
  if (t_running != nullptr) t_running->waiting_on.store(global_rank, std::memory_order_relaxed);
}

Snapshot Recorder::snapshot() const {
  if (layout_ == nullptr) return {};
  return read_layout(*layout_);
}

std::optional<Snapshot> read_file(const std::string& path, std::string* error) {
  const auto fail = [&](const std::string& why) -> std::optional<Snapshot> {
    if (error != nullptr) *error = path + ": " + why;
    return std::nullopt;
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errno_text());
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < sizeof(Layout)) {
    close(fd);
    return fail("too short for a flight recorder");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* memory = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (memory == MAP_FAILED) return fail("cannot map it: " + errno_text());
  const auto& l = *static_cast<const Layout*>(memory);
  std::optional<Snapshot> s;
  const std::uint64_t magic = reinterpret_cast<const std::atomic<std::uint64_t>*>(&l.magic)->load(
      std::memory_order_acquire);
  if (magic != Layout::kMagic || l.layout_version != Layout::kVersion ||
      l.slot_bytes != static_cast<std::int32_t>(sizeof(Slot))) {
    fail("not a flight recorder of this version");
  } else if (bytes_for(l.capacity) > size) {
    fail("shorter than its " + std::to_string(l.capacity) + " entries");
  } else {
    s = read_layout(l);
  }
  munmap(memory, size);
  return s;
}

}  // namespace ddp::flight
