#pragma once
// Which dataset indices each rank visits in an epoch, with the semantics of PyTorch's
// torch.utils.data.DistributedSampler (and bit-identical to it): a permutation drawn from
// torch.randperm with a generator seeded by seed + epoch, the same on every rank; padded by
// wrapping around (or truncated with drop_last) to a multiple of the world size; rank r takes
// positions r, r + W, r + 2W, ... So every rank gets the same number of samples.
//
// An offset (set_offset) starts the epoch part-way, for a job whose world size changed within
// it: the first `offset` positions of the permutation are skipped, and the rest is padded (or
// truncated) and dealt out as above. A world of W ranks that trained b batches of B samples each
// consumed exactly positions [0, b x B x W), so a new world continuing at that offset visits
// every remaining sample of the epoch once.
#include <cstdint>
#include <vector>

namespace ddp::data {

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  // Drop the tail so that shards divide evenly instead of repeating samples to pad them.
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // Throws ConfigError unless 0 <= rank < world_size and dataset_size >= 0.
  DistributedSampler(int64_t dataset_size, int world_size, int rank, SamplerOptions options = {});

  // Selects the epoch whose permutation indices() returns (seed + epoch), as torch's set_epoch.
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  // Skips the epoch's first `offset` positions (0 <= offset <= dataset size; ConfigError
  // otherwise); num_samples() then counts what remains.
  void set_offset(int64_t offset);
  int64_t offset() const { return offset_; }

  // This rank's indices for the current epoch, in visiting order.
  std::vector<int64_t> indices() const;

  int64_t num_samples() const { return num_samples_; }  // per rank
  int64_t total_size() const { return num_samples_ * world_size_; }
  int64_t dataset_size() const { return dataset_size_; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  const SamplerOptions& options() const { return options_; }

 private:
  int64_t dataset_size_;
  int world_size_;
  int rank_;
  SamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
  int64_t offset_ = 0;
};

}  // namespace ddp::data
