#pragma once
// Splits `count` elements into `parts` contiguous pieces whose sizes differ by at most one, the
// first `count % parts` pieces taking the extra element. Every rank computes the same split.
#include <cstddef>

namespace ddp::detail::collectives {

struct Piece {
  std::size_t offset;
  std::size_t count;
};

inline Piece partition(std::size_t count, std::size_t parts, std::size_t index) {
  const std::size_t base = count / parts;
  const std::size_t extra = count % parts;
  const std::size_t offset = index * base + (index < extra ? index : extra);
  return {offset, base + (index < extra ? 1 : 0)};
}

inline std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

}  // namespace ddp::detail::collectives
