// float16's reduction kernels, shared by every instruction-set variant (reduce_kernels.h): c10's
// conversions, compiled once for the baseline. Each element is widened to float, reduced there
// and rounded back; min and max are std::min and std::max, as in the other types' loops.
#include <c10/util/Half.h>

#include <algorithm>

#include "comm/reduce_kernels.h"

namespace ddp::detail {
namespace {

template <typename Op>
void reduce_float16(void* out, const void* a, const void* b, std::size_t count, Op op) {
  const auto* x = static_cast<const c10::Half*>(a);
  const auto* y = static_cast<const c10::Half*>(b);
  auto* z = static_cast<c10::Half*>(out);
  for (std::size_t i = 0; i < count; ++i) {
    z[i] = c10::Half(op(static_cast<float>(x[i]), static_cast<float>(y[i])));
  }
}

}  // namespace

void float16_sum(void* out, const void* a, const void* b, std::size_t count) {
  reduce_float16(out, a, b, count, [](float u, float v) { return u + v; });
}

void float16_min(void* out, const void* a, const void* b, std::size_t count) {
  reduce_float16(out, a, b, count, [](float u, float v) { return std::min(u, v); });
}

void float16_max(void* out, const void* a, const void* b, std::size_t count) {
  reduce_float16(out, a, b, count, [](float u, float v) { return std::max(u, v); });
}

// The sum rounded to float16, then scaled as float16_divide scales it.
void float16_sum_divide(void* out, const void* a, const void* b, std::size_t count, int divisor) {
  const float inverse = 1.0f / static_cast<float>(divisor);
  reduce_float16(out, a, b, count, [inverse](float u, float v) {
    return static_cast<float>(c10::Half(u + v)) * inverse;
  });
}

void float16_divide(void* data, std::size_t count, int divisor) {
  auto* z = static_cast<c10::Half*>(data);
  const float inverse = 1.0f / static_cast<float>(divisor);
  for (std::size_t i = 0; i < count; ++i) z[i] = c10::Half(static_cast<float>(z[i]) * inverse);
}

}  // namespace ddp::detail
