#pragma once
// How gradients are grouped into buckets, as PyTorch's compute_bucket_assignment_by_size: walk
// the tensors in the given order, one open bucket per dtype, and close a bucket as soon as it
// holds at least its cap (so a bucket exceeds its cap by at most one tensor). The first bucket of
// each dtype gets `first_cap`, later ones `cap`. Buckets come back ordered by their first tensor.
#include <cstddef>
#include <vector>

namespace ddp::detail {

struct TensorSlot {
  std::size_t bytes;
  int dtype;  // any key: tensors of different keys never share a bucket
};

std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<TensorSlot>& tensors,
                                                     std::size_t first_cap, std::size_t cap);

}  // namespace ddp::detail
