#pragma once
// Batches of one rank's shard, prepared ahead on a background thread so that the training thread
// does not wait for data. Which samples form batch k of epoch e depends only on the sampler
// (seed, epoch, rank) and augmentation only on (seed, epoch, rank, k), so an epoch resumed at
// batch k continues exactly as it would have.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "ddp/data/batch_transform.h"
#include "ddp/data/distributed_sampler.h"
#include "ddp/data/image_dataset.h"

namespace ddp::data {

struct LoaderOptions {
  int64_t batch_size = 64;
  // Omit the epoch's last batch when it is smaller than batch_size.
  bool drop_last = false;
  TransformOptions transform;
  // Batches built ahead of the consumer; 0 builds each batch on the caller's thread.
  int prefetch = 2;
  // Augmentation seed (the sampler has its own).
  uint64_t seed = 0;
};

struct LoaderStats {
  int64_t batches = 0;       // handed out by next()
  double wait_seconds = 0;   // the consumer spent in next(): waiting, or building without prefetch
  int64_t built = 0;         // batches built so far, on whichever thread
  double build_seconds = 0;  // spent building them
};

class DataLoader {
 public:
  // Throws ConfigError for a non-positive batch size or a negative prefetch depth.
  DataLoader(ImageDataset dataset, DistributedSampler sampler, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts epoch `epoch` at batch `first_batch` (0 for a fresh epoch) of the part of its sample
  // order that begins at position `offset` (DistributedSampler::set_offset; not 0 only after the
  // world size changed within the epoch); background building of its first batches begins at
  // once. Discards anything left of the previous epoch. batches_per_epoch() then counts the
  // batches from `offset` on.
  void start_epoch(int64_t epoch, int64_t first_batch = 0, int64_t offset = 0);

  // The epoch's next batch, or nullopt once it is exhausted. Rethrows a failure of the builder.
  std::optional<Batch> next();

  int64_t batches_per_epoch() const;
  // The batches of an epoch started at sample position `offset` (start_epoch's).
  int64_t batches_from(int64_t offset) const;
  const ImageDataset& dataset() const { return dataset_; }
  const DistributedSampler& sampler() const { return sampler_; }
  const LoaderOptions& options() const { return options_; }
  LoaderStats stats() const;

 private:
  struct Prefetcher;

  Batch build(const std::vector<int64_t>& order, int64_t epoch, int64_t batch_index) const;
  // The batches `samples` per-rank samples make (the last one partial unless drop_last).
  int64_t batches_of(int64_t samples) const;

  ImageDataset dataset_;
  DistributedSampler sampler_;
  LoaderOptions options_;
  BatchTransform transform_;
  std::shared_ptr<const std::vector<int64_t>> order_;
  int64_t epoch_ = 0;
  int64_t next_batch_ = 0;
  double wait_seconds_ = 0;
  mutable std::atomic<int64_t> build_nanoseconds_{0};
  mutable std::atomic<int64_t> built_{0};
  int64_t batches_ = 0;
  std::unique_ptr<Prefetcher> prefetcher_;
};

}  // namespace ddp::data
