// The reduction loops compiled for x86-64-v4 (AVX-512 F/BW/CD/DQ/VL), the level of most EC2 CPU
// nodes that train (c5, c6i, c7i, c7a). lib/CMakeLists.txt builds it, on x86-64 only, as an
// object library of its own, so that a test can check what it exports.
#if defined(DDP_WIDE_REDUCE_KERNELS)
#include "comm/reduce_kernel_loops.h"

namespace ddp::detail {

extern constexpr ReduceKernels kAvx512ReduceKernels = make_reduce_kernels("avx512");

}  // namespace ddp::detail
#endif
