// The reduction loops compiled for x86-64-v3 (AVX2, FMA unused: no contraction), the level of
// x86 CPU nodes without AVX-512 (AWS c6a, hpc6a). lib/CMakeLists.txt builds it, on x86-64 only,
// as an object library of its own, so that a test can check what it exports.
#if defined(DDP_WIDE_REDUCE_KERNELS)
#include "comm/reduce_kernel_loops.h"

namespace ddp::detail {

extern constexpr ReduceKernels kAvx2ReduceKernels = make_reduce_kernels("avx2");

}  // namespace ddp::detail
#endif
