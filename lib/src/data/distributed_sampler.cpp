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
  set_offset(0);
}

void DistributedSampler::set_offset(int64_t offset) {
  if (offset < 0 || offset > dataset_size_) {
    throw ConfigError("sampler offset " + std::to_string(offset) + " is outside the epoch's " +
                      std::to_string(dataset_size_) + " samples");
  }
  offset_ = offset;
  const int64_t remaining = dataset_size_ - offset;
  // torch: drop_last with an uneven split rounds down, otherwise up (then pads).
  if (options_.drop_last && remaining % world_size_ != 0) {
    num_samples_ = (remaining - world_size_ + world_size_ - 1) / world_size_;
    if (num_samples_ < 0) num_samples_ = 0;
  } else {
    num_samples_ = (remaining + world_size_ - 1) / world_size_;
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

  // What remains after the offset, padded by repeating the permutation from its start (as often
  // as needed, as torch pads), or truncated, to total_size(): the padding is the same whatever
  // the offset, so a world continuing at its own offset keeps its shards.
  const int64_t total = total_size();
  std::vector<int64_t> rest;
  rest.reserve(static_cast<std::size_t>(total));
  for (int64_t i = offset_; static_cast<int64_t>(rest.size()) < total; ++i) {
    rest.push_back(order[static_cast<std::size_t>(i % dataset_size_)]);
  }
  order.swap(rest);

  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = rank_; i < total; i += world_size_) mine.push_back(order[i]);
  return mine;
}

}  // namespace ddp::data
