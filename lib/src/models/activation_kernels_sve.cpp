// The fused activation loops compiled for armv8.2-a+sve (Graviton3 and later). lib/CMakeLists.txt
// builds it, on arm64 only, as an object library of its own, so that a test can check what it
// exports and that its loops are SVE code.
#if defined(DDP_SVE_KERNELS)
#include "models/activation_kernel_loops.h"

namespace ddp::models::detail {

extern constexpr ActivationKernels kSveActivationKernels = make_kernel_table("sve");

}  // namespace ddp::models::detail
#endif
