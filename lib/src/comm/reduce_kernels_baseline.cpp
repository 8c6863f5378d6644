// The reduction loops for any CPU the library is built for.
#include "comm/reduce_kernel_loops.h"

namespace ddp::detail {

extern constexpr ReduceKernels kBaselineReduceKernels = make_reduce_kernels("baseline");

}  // namespace ddp::detail
