// The fused activation loops compiled for x86-64-v4 (AVX-512 F/BW/DQ/VL), the level of the
// CPU nodes that train (AWS c5 and later). lib/CMakeLists.txt adds the flags on x86-64 only.
#if defined(DDP_AVX512_KERNELS)
#include "models/activation_kernel_loops.h"

namespace ddp::models::detail {

extern const ActivationKernels kAvx512ActivationKernels = make_kernel_table("avx512");

}  // namespace ddp::models::detail
#endif
