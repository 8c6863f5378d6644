#pragma once
// The IDX file format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/): a 4-byte
// magic (0, 0, element type, rank), `rank` big-endian int32 dimensions, then the big-endian data.
// Files may be gzip-compressed; compression is detected from the content, not the name.
#include <string>

#include <ATen/core/Tensor.h>

namespace ddp::data {

// Reads a whole IDX file into a tensor of the matching dtype (uint8, int8, int16, int32, float32
// or float64) and shape. Throws DataError naming the file and what was expected and found for a
// missing file, bad magic, unknown type, truncated header or data, trailing bytes or corrupt gzip.
at::Tensor read_idx(const std::string& path);

}  // namespace ddp::data
