#include "ddp/data/distributed_sampler.h"

#include <string>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randperm.h>

#include "ddp/error.h"

namespace ddp::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int world_size, int rank,
                                       SamplerOptions options)
    : dataset_size_(dataset_size), world_size_(world_size), rank_(rank), options_(options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw ConfigError("sampler rank " + std::to_string(rank) + " of world size " +
                      std::to_string(world_size) + " is invalid; rank must be in [0, world)");
  }
  if (dataset_size < 0) throw ConfigError("sampler dataset size must not be negative");
  // torch: drop_last with an uneven split rounds down, otherwise up (then pads).
  if (options_.drop_last && dataset_size % world_size != 0) {
    num_samples_ = (dataset_size - world_size + world_size - 1) / world_size;
    if (num_samples_ < 0) num_samples_ = 0;
  } else {
    num_samples_ = (dataset_size + world_size - 1) / world_size;
  }
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(dataset_size_);
  if (options_.shuffle && dataset_size_ > 0) {
    // Seeding a fresh generator exactly as torch.Generator().manual_seed(seed + epoch) does makes
    // the permutation identical to PyTorch's.
    auto generator = at::detail::createCPUGenerator(options_.seed + static_cast<uint64_t>(epoch_));
    at::Tensor perm = at::randperm(dataset_size_, generator, at::kLong);
    const int64_t* p = perm.data_ptr<int64_t>();
    order.assign(p, p + dataset_size_);
  } else {
    for (int64_t i = 0; i < dataset_size_; ++i) order[i] = i;
  }

  const int64_t total = total_size();
  if (total > dataset_size_) {
    // Pad by repeating the permutation from its start, as often as needed.
    order.reserve(total);
    for (int64_t i = 0; static_cast<int64_t>(order.size()) < total; ++i) {
      order.push_back(order[i % dataset_size_]);
    }
  } else {
    order.resize(total);
  }

  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = rank_; i < total; i += world_size_) mine.push_back(order[i]);
  return mine;
}

}  // namespace ddp::data
