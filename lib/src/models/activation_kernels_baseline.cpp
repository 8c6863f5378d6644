// The fused activation loops for any CPU the library is built for.
#include "models/activation_kernel_loops.h"

namespace ddp::models::detail {

extern constexpr ActivationKernels kBaselineActivationKernels = make_kernel_table("baseline");

}  // namespace ddp::models::detail
