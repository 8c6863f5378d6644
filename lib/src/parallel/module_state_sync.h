#pragma once
// Making the ranks' copies of a module agree: check that all ranks hold the same list of tensor
// shapes and dtypes, and broadcast tensors from rank 0, coalesced into one collective per dtype.
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ddp/comm/communicator.h"

namespace ddp::detail {

struct NamedTensor {
  std::string kind;  // "parameter" or "buffer"
  std::string name;
  at::Tensor tensor;
};

// Collective. Throws ConfigError on every rank when any rank's list differs from rank 0's: on a
// differing rank naming the first difference, on the others naming the differing ranks.
void verify_same_tensors(const std::vector<NamedTensor>& tensors, Communicator& comm);

// Collective: every rank's tensors end with rank 0's values.
void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, Communicator& comm);

}  // namespace ddp::detail
