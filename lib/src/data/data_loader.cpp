#include "ddp/data/data_loader.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "ddp/error.h"

namespace ddp::data {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// One background thread that builds the batches [next_build, end) of the current epoch plan,
// staying at most `depth` batches ahead of the consumer.
struct DataLoader::Prefetcher {
  explicit Prefetcher(const DataLoader* loader, int depth) : loader(loader), depth(depth) {
    thread = std::thread([this] { run(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    cv.notify_all();
    thread.join();
  }

  void restart(std::shared_ptr<const std::vector<int64_t>> new_order, int64_t new_epoch,
               int64_t first, int64_t end) {
    std::lock_guard<std::mutex> lock(mutex);
    ++generation;
    order = std::move(new_order);
    epoch = new_epoch;
    next_build = first;
    end_batch = end;
    ready.clear();
    error = nullptr;
    cv.notify_all();
  }

  // Blocks until batch `index` is built (or the builder failed).
  Batch take(int64_t index) {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return error || (!ready.empty() && ready.front().index == index); });
    if (error) std::rethrow_exception(error);
    Batch batch = std::move(ready.front());
    ready.pop_front();
    cv.notify_all();
    return batch;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      cv.wait(lock, [&] {
        return stopping || (order && !error && next_build < end_batch &&
                            static_cast<int>(ready.size()) < depth);
      });
      if (stopping) return;
      const uint64_t my_generation = generation;
      const auto my_order = order;
      const int64_t index = next_build++;
      const int64_t my_epoch = epoch;
      lock.unlock();
      std::exception_ptr failure;
      Batch batch;
      try {
        batch = loader->build(*my_order, my_epoch, index);
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      if (generation != my_generation) continue;  // the epoch was restarted meanwhile
      if (failure) {
        error = failure;
      } else {
        ready.push_back(std::move(batch));
      }
      cv.notify_all();
    }
  }

  const DataLoader* loader;
  const int depth;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<Batch> ready;
  std::shared_ptr<const std::vector<int64_t>> order;
  int64_t epoch = 0;
  int64_t next_build = 0;
  int64_t end_batch = 0;
  uint64_t generation = 0;
  std::exception_ptr error;
  bool stopping = false;
  std::thread thread;
};

DataLoader::DataLoader(ImageDataset dataset, DistributedSampler sampler, LoaderOptions options)
    : dataset_(std::move(dataset)),
      sampler_(std::move(sampler)),
      options_(std::move(options)),
      transform_(dataset_.channels(), options_.transform) {
  if (options_.batch_size < 1) throw ConfigError("batch size must be at least 1");
  if (options_.prefetch < 0) throw ConfigError("prefetch depth must not be negative");
  if (sampler_.dataset_size() != dataset_.size()) {
    throw ConfigError("sampler covers " + std::to_string(sampler_.dataset_size()) +
                      " samples but the dataset holds " + std::to_string(dataset_.size()));
  }
  if (options_.prefetch > 0) prefetcher_ = std::make_unique<Prefetcher>(this, options_.prefetch);
}

DataLoader::~DataLoader() = default;

int64_t DataLoader::batches_of(int64_t samples) const {
  return options_.drop_last ? samples / options_.batch_size
                            : (samples + options_.batch_size - 1) / options_.batch_size;
}

int64_t DataLoader::batches_per_epoch() const { return batches_of(sampler_.num_samples()); }

int64_t DataLoader::batches_from(int64_t offset) const {
  DistributedSampler sampler = sampler_;
  sampler.set_offset(offset);
  return batches_of(sampler.num_samples());
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch, int64_t offset) {
  sampler_.set_offset(offset);
  if (first_batch < 0 || first_batch > batches_per_epoch()) {
    throw ConfigError("cannot start epoch " + std::to_string(epoch) + " at batch " +
                      std::to_string(first_batch) + "; an epoch has " +
                      std::to_string(batches_per_epoch()) + " batches");
  }
  sampler_.set_epoch(epoch);
  order_ = std::make_shared<const std::vector<int64_t>>(sampler_.indices());
  epoch_ = epoch;
  next_batch_ = first_batch;
  if (prefetcher_) prefetcher_->restart(order_, epoch, first_batch, batches_per_epoch());
}

Batch DataLoader::build(const std::vector<int64_t>& order, int64_t epoch,
                        int64_t batch_index) const {
  const int64_t first = batch_index * options_.batch_size;
  const int64_t count =
      std::min<int64_t>(options_.batch_size, static_cast<int64_t>(order.size()) - first);
  const uint64_t seed =
      mix_seed(options_.seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(sampler_.rank()),
               static_cast<uint64_t>(batch_index));
  const auto start = std::chrono::steady_clock::now();
  Batch batch = transform_(dataset_, order.data() + first, count, seed);
  batch.index = batch_index;
  build_nanoseconds_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  ++built_;
  return batch;
}

std::optional<Batch> DataLoader::next() {
  if (!order_) throw ConfigError("DataLoader::next() called before start_epoch()");
  if (next_batch_ >= batches_per_epoch()) return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  Batch batch = prefetcher_ ? prefetcher_->take(next_batch_) : build(*order_, epoch_, next_batch_);
  wait_seconds_ += seconds_since(start);
  ++next_batch_;
  ++batches_;
  return batch;
}

LoaderStats DataLoader::stats() const {
  LoaderStats stats;
  stats.batches = batches_;
  stats.wait_seconds = wait_seconds_;
  stats.built = built_.load();
  stats.build_seconds = static_cast<double>(build_nanoseconds_.load()) * 1e-9;
  return stats;
}

}  // namespace ddp::data
