// The fused activation loops compiled for x86-64-v4 (AVX-512 F/BW/CD/DQ/VL), the level of the
// CPU nodes that train (AWS c5 and later). lib/CMakeLists.txt builds it, on x86-64 only, as an
// object library of its own, so that a test can check what it exports.
#if defined(DDP_AVX512_KERNELS)
#include "models/activation_kernel_loops.h"

namespace ddp::models::detail {

extern constexpr ActivationKernels kAvx512ActivationKernels = make_kernel_table("avx512");

}  // namespace ddp::models::detail
#endif
