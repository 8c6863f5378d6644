#include "comm/reduce_kernels.h"

#include <cstring>
#include <string>

#include "base/cpu_features.h"
#include "ddp/error.h"

namespace ddp::detail {

static_assert(static_cast<int>(DataType::kInt64) + 1 == ReduceKernels::kTypes,
              "ReduceKernels::by_type has one entry per DataType");

extern const ReduceKernels kBaselineReduceKernels;
#if defined(DDP_WIDE_REDUCE_KERNELS)
extern const ReduceKernels kAvx2ReduceKernels;
extern const ReduceKernels kAvx512ReduceKernels;
#endif
#if defined(DDP_SVE_REDUCE_KERNELS)
extern const ReduceKernels kSveReduceKernels;
#endif

const ReduceKernels* reduce_kernels_for(const char* isa) {
  if (std::strcmp(isa, "baseline") == 0) return &kBaselineReduceKernels;
#if defined(DDP_WIDE_REDUCE_KERNELS)
  static const bool v3 = cpu_runs_x86_64_v3();
  static const bool v4 = cpu_runs_x86_64_v4();
  if (std::strcmp(isa, "avx2") == 0 && v3) return &kAvx2ReduceKernels;
  if (std::strcmp(isa, "avx512") == 0 && v4) return &kAvx512ReduceKernels;
#endif
#if defined(DDP_SVE_REDUCE_KERNELS)
  static const bool sve = cpu_runs_sve();
  if (std::strcmp(isa, "sve") == 0 && sve) return &kSveReduceKernels;
#endif
  return nullptr;
}

const ReduceKernels& select_reduce_kernels(const char* cap) {
  if (cap) check_isa_cap(cap);
  for (int i = kernel_isa_count() - 1; i > 0; --i) {
    if (!isa_allowed(kernel_isa(i), cap)) continue;
    if (const ReduceKernels* widest = reduce_kernels_for(kernel_isa(i))) return *widest;
  }
  return kBaselineReduceKernels;
}

const ReduceKernels& reduce_kernels() {
  static const ReduceKernels& chosen = []() -> const ReduceKernels& {
    const auto cap = isa_cap();
    return select_reduce_kernels(cap ? cap->c_str() : nullptr);
  }();
  return chosen;
}

namespace {

const ReduceKernels::PerType& kernels_of(DataType dtype) {
  return reduce_kernels().by_type[static_cast<int>(dtype)];
}

}  // namespace

ReduceFn reduce_kernel(DataType dtype, ReduceOp op) {
  const ReduceKernels::PerType& k = kernels_of(dtype);
  switch (op) {
    case ReduceOp::kMin:
      return k.min;
    case ReduceOp::kMax:
      return k.max;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return k.sum;
  }
  return nullptr;
}

void divide_in_place(void* data, std::size_t count, DataType dtype, int divisor) {
  kernels_of(dtype).divide(data, count, divisor);
}

Reduction::Reduction(DataType dtype, ReduceOp op, int ranks)
    : combine_(reduce_kernel(dtype, op)),
      sum_divide_(op == ReduceOp::kAvg ? kernels_of(dtype).sum_divide : nullptr),
      ranks_(ranks) {}

void Reduction::complete(void* out, const void* a, const void* b, std::size_t count) const {
  if (sum_divide_) return sum_divide_(out, a, b, count, ranks_);
  combine_(out, a, b, count);
}

}  // namespace ddp::detail
