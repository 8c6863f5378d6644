#include "ddp/live_metrics.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "ddp/error.h"
#include "ddp/settings.h"

namespace ddp::live {

namespace {
constexpr std::uint64_t kMagic = 0x314d564c50444400ULL;  // "\0DDPLVM1"
constexpr std::uint32_t kVersion = 1;

enum Field : int {
  kSteps,
  kImages,
  kStepSecondsTotal,
  kWaitSecondsTotal,
  kBytesTotal,
  kStep,
  kEpoch,
  kLoss,
  kLearningRate,
  kImagesPerSecond,
  kStepSeconds,
  kStragglerRatio,
  kFieldCount
};

std::uint64_t bits(double v) {
  std::uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
double real(std::uint64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}
}  // namespace

struct Writer::Block {
  std::atomic<std::uint64_t> magic;  // set last
  std::uint32_t version;
  std::int32_t rank;
  std::int32_t world_size;
  std::int32_t pid;
  std::atomic<std::uint64_t> seq;  // odd while the writer changes the fields
  std::atomic<std::uint64_t> fields[kFieldCount];
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the file is shared memory");

namespace {

// The seqlock's write side: one writer, so a plain odd/even count.
class Update {
 public:
  explicit Update(Writer::Block& b) : b_(b), seq_(b.seq.load(std::memory_order_relaxed)) {
    b_.seq.store(seq_ + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  ~Update() { b_.seq.store(seq_ + 2, std::memory_order_release); }
  Update(const Update&) = delete;
  Update& operator=(const Update&) = delete;
  std::uint64_t get(Field f) const { return b_.fields[f].load(std::memory_order_relaxed); }
  void set(Field f, std::uint64_t v) { b_.fields[f].store(v, std::memory_order_relaxed); }
  void add(Field f, double v) { set(f, bits(real(get(f)) + v)); }

 private:
  Writer::Block& b_;
  const std::uint64_t seq_;
};

}  // namespace

Writer::Writer(const std::string& path, int rank, int world_size) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw DataError(path, std::string("cannot create the live metrics file: ") +
                              std::strerror(errno) + "; check DDP_LIVE_METRICS_FILE");
  }
  void* mapped = MAP_FAILED;
  if (::ftruncate(fd, sizeof(Block)) == 0) {
    mapped = ::mmap(nullptr, sizeof(Block), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int saved = errno;
  ::close(fd);
  if (mapped == MAP_FAILED) {
    throw DataError(path, std::string("cannot map the live metrics file: ") + std::strerror(saved) +
                              "; check the disk it is on");
  }
  block_ = static_cast<Block*>(mapped);  // zero-filled by ftruncate
  block_->version = kVersion;
  block_->rank = rank;
  block_->world_size = world_size;
  block_->pid = static_cast<std::int32_t>(::getpid());
  {
    Update u(*block_);
    u.set(kStep, static_cast<std::uint64_t>(std::int64_t{-1}));
  }
  // The magic last: a reader takes the file for a block only once the header is whole.
  block_->magic.store(kMagic, std::memory_order_release);
}

Writer Writer::from_environment(int rank, int world_size) {
  const auto path = settings::text(settings::kLiveMetricsFile);
  if (!path || path->empty()) return Writer();
  return Writer(*path, rank, world_size);
}

Writer::~Writer() {
  if (block_ != nullptr) ::munmap(block_, sizeof(Block));
}

Writer::Writer(Writer&& other) noexcept : block_(other.block_) { other.block_ = nullptr; }

Writer& Writer::operator=(Writer&& other) noexcept {
  if (this != &other) {
    if (block_ != nullptr) ::munmap(block_, sizeof(Block));
    block_ = other.block_;
    other.block_ = nullptr;
  }
  return *this;
}

void Writer::add_step(double seconds, std::uint64_t images, double allreduce_wait_seconds,
                      double allreduce_bytes) {
  if (block_ == nullptr) return;
  Update u(*block_);
  u.set(kSteps, u.get(kSteps) + 1);
  u.set(kImages, u.get(kImages) + images);
  u.add(kStepSecondsTotal, seconds);
  u.add(kWaitSecondsTotal, allreduce_wait_seconds);
  u.add(kBytesTotal, allreduce_bytes);
}

void Writer::set_progress(std::int64_t step, std::int64_t epoch, double loss, double learning_rate,
                          double images_per_second, double step_seconds) {
  if (block_ == nullptr) return;
  Update u(*block_);
  u.set(kStep, static_cast<std::uint64_t>(step));
  u.set(kEpoch, static_cast<std::uint64_t>(epoch));
  u.set(kLoss, bits(loss));
  u.set(kLearningRate, bits(learning_rate));
  u.set(kImagesPerSecond, bits(images_per_second));
  u.set(kStepSeconds, bits(step_seconds));
}

void Writer::set_straggler_ratio(double ratio) {
  if (block_ == nullptr) return;
  Update u(*block_);
  u.set(kStragglerRatio, bits(ratio));
}

std::optional<Snapshot> read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  struct stat st {};
  void* mapped = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof(Writer::Block))) {
    mapped = ::mmap(nullptr, sizeof(Writer::Block), PROT_READ, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (mapped == MAP_FAILED) return std::nullopt;
  auto* b = static_cast<Writer::Block*>(mapped);
  std::optional<Snapshot> result;
  if (b->magic.load(std::memory_order_acquire) == kMagic && b->version == kVersion) {
    for (int attempt = 0; attempt < 100 && !result; ++attempt) {
      const std::uint64_t before = b->seq.load(std::memory_order_acquire);
      if (before % 2 != 0) continue;
      std::uint64_t f[kFieldCount];
      for (int i = 0; i < kFieldCount; ++i) f[i] = b->fields[i].load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (b->seq.load(std::memory_order_relaxed) != before) continue;
      Snapshot s;
      s.rank = b->rank;
      s.world_size = b->world_size;
      s.pid = b->pid;
      s.steps = f[kSteps];
      s.images = f[kImages];
      s.step_seconds_total = real(f[kStepSecondsTotal]);
      s.allreduce_wait_seconds_total = real(f[kWaitSecondsTotal]);
      s.allreduce_bytes_total = real(f[kBytesTotal]);
      s.step = static_cast<std::int64_t>(f[kStep]);
      s.epoch = static_cast<std::int64_t>(f[kEpoch]);
      s.loss = real(f[kLoss]);
      s.learning_rate = real(f[kLearningRate]);
      s.images_per_second = real(f[kImagesPerSecond]);
      s.step_seconds = real(f[kStepSeconds]);
      s.straggler_ratio = real(f[kStragglerRatio]);
      result = s;
    }
  }
  ::munmap(mapped, sizeof(Writer::Block));
  return result;
}

}  // namespace ddp::live
