#pragma once
// bfloat16 as its raw bits, for loops compiled once per instruction set (the activation and
// reduction kernels): GCC vectorises loops over integers and floats but not over c10::BFloat16
// objects, and those objects' inline members, emitted out of line by one such unit, could be the
// copy the linker keeps for the whole library. Internal linkage, no branches; float -> bfloat16
// gives c10's bits (round to nearest even, every NaN to 0x7FC0).
#include <cstdint>
#include <cstring>

namespace ddp::detail {
namespace {

inline float bfloat16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t widened = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &widened, sizeof(f));
  return f;
}

inline std::uint16_t float_to_bfloat16_bits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  const std::uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<std::uint16_t>(nan ? 0x7FC0u : rounded);
}

}  // namespace
}  // namespace ddp::detail
