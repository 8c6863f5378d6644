#include "ddp/data/idx.h"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ops/from_blob.h>

#include "data/compressed_reader.h"
#include "ddp/error.h"

namespace ddp::data {
namespace {

constexpr int kMaxRank = 8;
// Refuse headers that promise more data than any plausible dataset instead of trying to
// allocate it (a flipped bit in a dimension must not become a 64 GiB allocation).
constexpr uint64_t kMaxDataBytes = uint64_t{1} << 36;

struct ElementType {
  at::ScalarType dtype;
  std::size_t bytes;
  const char* name;
};

bool element_type_for(uint8_t code, ElementType* out) {
  switch (code) {
    case 0x08:
      *out = {at::kByte, 1, "uint8"};
      return true;
    case 0x09:
      *out = {at::kChar, 1, "int8"};
      return true;
    case 0x0B:
      *out = {at::kShort, 2, "int16"};
      return true;
    case 0x0C:
      *out = {at::kInt, 4, "int32"};
      return true;
    case 0x0D:
      *out = {at::kFloat, 4, "float32"};
      return true;
    case 0x0E:
      *out = {at::kDouble, 8, "float64"};
      return true;
    default:
      return false;
  }
}

std::string hex_bytes(const uint8_t* bytes, std::size_t n) {
  std::string text;
  char piece[4];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(piece, sizeof piece, "%s%02x", i == 0 ? "" : " ", bytes[i]);
    text += piece;
  }
  return text;
}

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string text;
  for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? "x" : "") + std::to_string(dims[i]);
  return text;
}

// IDX stores big-endian values; this machine is little-endian.
void to_host_order(uint8_t* data, std::size_t count, std::size_t width) {
  if (width == 1) return;
  for (std::size_t i = 0; i < count; ++i) {
    uint8_t* e = data + i * width;
    for (std::size_t a = 0, b = width - 1; a < b; ++a, --b) std::swap(e[a], e[b]);
  }
}

}  // namespace

at::Tensor read_idx(const std::string& path) {
  detail::CompressedReader reader(path);

  uint8_t magic[4];
  const std::size_t got_magic = reader.read(magic, 4);
  if (got_magic < 4) {
    throw DataError(path, "truncated: " + std::to_string(got_magic) +
                              " bytes, expected at least the 4-byte IDX magic");
  }
  ElementType type{};
  if (magic[0] != 0 || magic[1] != 0 || !element_type_for(magic[2], &type)) {
    throw DataError(path, "not an IDX file: magic is " + hex_bytes(magic, 4) +
                              ", expected 00 00 <type 08|09|0b|0c|0d|0e> <rank>");
  }
  const int rank = magic[3];
  if (rank < 1 || rank > kMaxRank) {
    throw DataError(path, "IDX header declares " + std::to_string(rank) +
                              " dimensions, expected 1 to " + std::to_string(kMaxRank));
  }

  std::vector<int64_t> dims(rank);
  uint64_t elements = 1;
  for (int d = 0; d < rank; ++d) {
    uint8_t be[4];
    if (reader.read(be, 4) < 4) {
      throw DataError(path, "truncated IDX header: expected " + std::to_string(rank) +
                                " dimensions, found " + std::to_string(d));
    }
    const uint32_t dim = (uint32_t{be[0]} << 24) | (uint32_t{be[1]} << 16) |
                         (uint32_t{be[2]} << 8) | uint32_t{be[3]};
    dims[d] = dim;
    // Zero-sized arrays are legal; skip them here so the overflow check stays meaningful.
    if (dim != 0 && elements > kMaxDataBytes / type.bytes / dim) {
      throw DataError(path, "IDX header declares an implausible size (dimension " +
                                std::to_string(d) + " is " + std::to_string(dim) +
                                "); the header is corrupt");
    }
    if (dim != 0) elements *= dim;
  }
  for (int64_t dim : dims) {
    if (dim == 0) elements = 0;
  }
  const uint64_t data_bytes = elements * type.bytes;

  // Grow the buffer as data arrives rather than trusting the header with one big allocation.
  auto storage = std::make_unique<std::vector<uint8_t>>();
  storage->reserve(std::min<uint64_t>(data_bytes, uint64_t{64} << 20));
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  while (storage->size() < data_bytes) {
    const std::size_t want = std::min<uint64_t>(kChunk, data_bytes - storage->size());
    const std::size_t old = storage->size();
    storage->resize(old + want);
    const std::size_t got = reader.read(storage->data() + old, want);
    storage->resize(old + got);
    if (got < want) {
      throw DataError(path, "truncated: header declares " + shape_text(dims) + " " + type.name +
                                " (" + std::to_string(data_bytes) + " data bytes), found " +
                                std::to_string(storage->size()));
    }
  }
  uint8_t extra;
  if (reader.read(&extra, 1) != 0) {
    throw DataError(path, "has bytes after the " + std::to_string(data_bytes) +
                              " data bytes its header declares (" + shape_text(dims) + " " +
                              type.name + "); wrong header or concatenated files");
  }
  to_host_order(storage->data(), elements, type.bytes);

  auto* raw = storage.release();
  return at::from_blob(
      raw->data(), dims, [raw](void*) { delete raw; }, at::TensorOptions().dtype(type.dtype));
}

}  // namespace ddp::data
