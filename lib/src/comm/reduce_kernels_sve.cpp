// The reduction loops compiled for armv8.2-a+sve, the Scalable Vector Extension of Graviton3
// (256-bit vectors) and Graviton4 (128-bit): vector-length agnostic, predicated tails.
// lib/CMakeLists.txt builds it, on arm64 only, as an object library of its own, so that a test can
// check what it exports and that its loops are SVE code.
#if defined(DDP_SVE_REDUCE_KERNELS)
#include "comm/reduce_kernel_loops.h"

namespace ddp::detail {

extern constexpr ReduceKernels kSveReduceKernels = make_reduce_kernels("sve");

}  // namespace ddp::detail
#endif
