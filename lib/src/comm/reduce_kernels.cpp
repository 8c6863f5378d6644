#include "comm/reduce_kernels.h"

#include <cstring>
#include <string>

#include "cpu_features.h"
#include "ddp/env_vars.h"
#include "ddp/error.h"

namespace ddp::detail {

static_assert(static_cast<int>(DataType::kInt64) + 1 == ReduceKernels::kTypes,
              "ReduceKernels::by_type has one entry per DataType");

extern const ReduceKernels kBaselineReduceKernels;
#if defined(DDP_WIDE_REDUCE_KERNELS)
extern const ReduceKernels kAvx2ReduceKernels;
extern const ReduceKernels kAvx512ReduceKernels;
#endif

const ReduceKernels* reduce_kernels_for(const char* isa) {
  if (std::strcmp(isa, "baseline") == 0) return &kBaselineReduceKernels;
#if defined(DDP_WIDE_REDUCE_KERNELS)
  static const bool v3 = cpu_runs_x86_64_v3();
  static const bool v4 = cpu_runs_x86_64_v4();
  if (std::strcmp(isa, "avx2") == 0 && v3) return &kAvx2ReduceKernels;
  if (std::strcmp(isa, "avx512") == 0 && v4) return &kAvx512ReduceKernels;
#endif
  return nullptr;
}

const ReduceKernels& select_reduce_kernels(const char* wanted) {
  if (!wanted) {
    for (const char* isa : {"avx512", "avx2"}) {
      if (const ReduceKernels* widest = reduce_kernels_for(isa)) return *widest;
    }
    return kBaselineReduceKernels;
  }
  const ReduceKernels* named = reduce_kernels_for(wanted);
  if (!named) {
    throw ConfigError(std::string("DDP_REDUCE_ISA=") + wanted +
                      ": this build or CPU has no such reduction kernels; use baseline, avx2 "
                      "(x86-64 build, x86-64-v3 CPU) or avx512 (x86-64 build, x86-64-v4 CPU, "
                      "i.e. AVX-512 F/BW/CD/DQ/VL), or unset it");
  }
  return *named;
}

const ReduceKernels& reduce_kernels() {
  static const ReduceKernels& chosen = []() -> const ReduceKernels& {
    const auto wanted = env::get("DDP_REDUCE_ISA");
    return select_reduce_kernels(wanted ? wanted->c_str() : nullptr);
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
