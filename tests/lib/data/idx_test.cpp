// The IDX reader on generated files of every element type (raw and gzip), on Debian's
// Fashion-MNIST files, and on each kind of malformed input.
#include <sys/stat.h>

#include <cstring>
#include <string>
#include <vector>

#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include "ddp/data/idx.h"
#include "ddp/data/mnist.h"
#include "ddp/error.h"
#include "test_files.h"

namespace ddp::data {
namespace {

using testing::idx_bytes;
using testing::TempDir;
using testing::write_bytes;

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Big-endian bytes of a value of type T.
template <typename T>
void append_be(std::vector<uint8_t>* out, T value) {
  uint8_t bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  for (std::size_t i = 0; i < sizeof(T); ++i) out->push_back(bytes[sizeof(T) - 1 - i]);
}

template <typename T>
void expect_roundtrip(uint8_t code, at::ScalarType dtype, const std::vector<T>& values, bool gzip) {
  TempDir dir;
  std::vector<uint8_t> data;
  for (T v : values) append_be(&data, v);
  const std::string path = dir.file(gzip ? "a.idx.gz" : "a.idx");
  write_bytes(path, idx_bytes(code, {2, static_cast<uint32_t>(values.size() / 2)}, data), gzip);

  at::Tensor t = read_idx(path);
  ASSERT_EQ(t.scalar_type(), dtype);
  ASSERT_EQ(t.dim(), 2);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(1), static_cast<int64_t>(values.size() / 2));
  const T* got = t.data_ptr<T>();
  for (std::size_t i = 0; i < values.size(); ++i) EXPECT_EQ(got[i], values[i]) << "element " << i;
}

TEST(IdxReader, ReadsEveryElementTypeRawAndGzipped) {
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "raw");
    expect_roundtrip<uint8_t>(0x08, at::kByte, {0, 1, 127, 128, 254, 255}, gzip);
    expect_roundtrip<int8_t>(0x09, at::kChar, {-128, -1, 0, 1, 126, 127}, gzip);
    expect_roundtrip<int16_t>(0x0B, at::kShort, {-32768, -2, 0, 258, 1000, 32767}, gzip);
    expect_roundtrip<int32_t>(0x0C, at::kInt, {-2147483647 - 1, -70000, 0, 1, 65536, 2147483647},
                              gzip);
    expect_roundtrip<float>(0x0D, at::kFloat, {-1.5f, 0.0f, 3.25f, 1e-20f, 6.5e10f, -0.0f}, gzip);
    expect_roundtrip<double>(0x0E, at::kDouble, {-1.5, 0.1, 3.25, 1e-300, 6.5e100, 2.0}, gzip);
  }
}

TEST(IdxReader, ReadsZeroSizedArrays) {
  TempDir dir;
  write_bytes(dir.file("empty.idx"), idx_bytes(0x08, {0, 28, 28}, {}));
  at::Tensor t = read_idx(dir.file("empty.idx"));
  EXPECT_EQ(t.size(0), 0);
  EXPECT_EQ(t.size(1), 28);
}

TEST(IdxReader, ReadsDebianFashionMnist) {
  const std::string dir = kDebianFashionMnistDir;
  if (!exists(dir + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << dir
                 << " (apt-get install dataset-fashion-mnist)";
  }
  at::Tensor train_images = read_idx(dir + "/train-images-idx3-ubyte.gz");
  at::Tensor train_labels = read_idx(dir + "/train-labels-idx1-ubyte.gz");
  at::Tensor test_images = read_idx(dir + "/t10k-images-idx3-ubyte.gz");
  at::Tensor test_labels = read_idx(dir + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(train_images.sizes(), at::IntArrayRef({60000, 28, 28}));
  EXPECT_EQ(train_labels.sizes(), at::IntArrayRef({60000}));
  EXPECT_EQ(test_images.sizes(), at::IntArrayRef({10000, 28, 28}));
  EXPECT_EQ(test_labels.sizes(), at::IntArrayRef({10000}));
  EXPECT_EQ(train_images.scalar_type(), at::kByte);

  // Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class.
  std::vector<int> train_counts(256, 0), test_counts(256, 0);
  for (int64_t i = 0; i < 60000; ++i) ++train_counts[train_labels.data_ptr<uint8_t>()[i]];
  for (int64_t i = 0; i < 10000; ++i) ++test_counts[test_labels.data_ptr<uint8_t>()[i]];
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(train_counts[c], 6000) << "class " << c;
    EXPECT_EQ(test_counts[c], 1000) << "class " << c;
  }
  // Real images: dark backgrounds, bright garments, not all one value.
  const uint8_t* px = train_images.data_ptr<uint8_t>();
  EXPECT_EQ(px[0], 0);  // top-left corner of the first image is background
  int64_t bright = 0;
  for (int64_t i = 0; i < 784; ++i) bright += px[i] > 128;
  EXPECT_GT(bright, 50);
}

// A DataError that names `path` and whose message contains every one of `fragments`.
void expect_data_error(const std::string& path, const std::vector<std::string>& fragments) {
  try {
    read_idx(path);
    ADD_FAILURE() << "read_idx(" << path << ") did not throw";
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), path);
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(what.rfind(path, 0), 0u) << what;
    for (const auto& f : fragments) EXPECT_NE(what.find(f), std::string::npos) << what;
  }
}

TEST(IdxReaderErrors, MissingFileNamesItAndTheCause) {
  TempDir dir;
  expect_data_error(dir.file("nope-idx3-ubyte"), {"cannot open", "No such file"});
}

TEST(IdxReaderErrors, DirectoryIsNotAFile) {
  TempDir dir;
  expect_data_error(dir.path(), {"is a directory"});
}

TEST(IdxReaderErrors, EmptyFileIsTruncated) {
  TempDir dir;
  write_bytes(dir.file("e"), {});
  expect_data_error(dir.file("e"), {"truncated", "0 bytes", "4-byte IDX magic"});
}

TEST(IdxReaderErrors, WrongMagicShowsExpectedAndFound) {
  TempDir dir;
  write_bytes(dir.file("png"), {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a});
  expect_data_error(dir.file("png"), {"not an IDX file", "89 50 4e 47", "expected 00 00"});
}

TEST(IdxReaderErrors, UnknownElementType) {
  TempDir dir;
  write_bytes(dir.file("t"), idx_bytes(0x07, {1}, {0}));
  expect_data_error(dir.file("t"), {"magic is 00 00 07 01"});
}

TEST(IdxReaderErrors, BadRank) {
  TempDir dir;
  write_bytes(dir.file("r0"), {0, 0, 8, 0});
  expect_data_error(dir.file("r0"), {"declares 0 dimensions", "expected 1 to 8"});
  write_bytes(dir.file("r9"), {0, 0, 8, 9});
  expect_data_error(dir.file("r9"), {"declares 9 dimensions"});
}

TEST(IdxReaderErrors, TruncatedHeader) {
  TempDir dir;
  auto bytes = idx_bytes(0x08, {10, 28, 28}, {});
  bytes.resize(4 + 4 + 2);  // one whole dimension and half of the next
  write_bytes(dir.file("h"), bytes);
  expect_data_error(dir.file("h"), {"truncated IDX header", "expected 3 dimensions, found 1"});
}

TEST(IdxReaderErrors, TruncatedDataSaysDeclaredAndFound) {
  for (bool gzip : {false, true}) {
    TempDir dir;
    const std::string path = dir.file(gzip ? "d.gz" : "d");
    write_bytes(path, idx_bytes(0x08, {10, 28, 28}, std::vector<uint8_t>(1000, 7)), gzip);
    expect_data_error(path, {"truncated", "10x28x28 uint8", "7840 data bytes", "found 1000"});
  }
}

TEST(IdxReaderErrors, TrailingBytes) {
  TempDir dir;
  write_bytes(dir.file("t"), idx_bytes(0x08, {2, 2}, {1, 2, 3, 4, 5}));
  expect_data_error(dir.file("t"), {"bytes after the 4 data bytes", "2x2 uint8"});
}

TEST(IdxReaderErrors, ImplausibleDimensionsAreRejectedWithoutAllocating) {
  TempDir dir;
  write_bytes(dir.file("big"), idx_bytes(0x0E, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {}));
  expect_data_error(dir.file("big"), {"implausible size", "header is corrupt"});
}

TEST(IdxReaderErrors, CorruptGzipPayload) {
  TempDir dir;
  const std::string path = dir.file("c.gz");
  std::vector<uint8_t> data(5000);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 31 + i / 7);
  write_bytes(path, idx_bytes(0x08, {5000}, data), true);
  auto gz = testing::read_bytes(path);
  for (std::size_t i = 20; i < gz.size() - 8; i += 3) gz[i] ^= 0x5a;
  write_bytes(path, gz);
  expect_data_error(path, {"gzip"});
}

TEST(IdxReaderErrors, TruncatedGzipStream) {
  TempDir dir;
  const std::string path = dir.file("c.gz");
  write_bytes(path, idx_bytes(0x08, {5000}, std::vector<uint8_t>(5000, 3)), true);
  auto gz = testing::read_bytes(path);
  gz.resize(gz.size() - 6);  // cut into the CRC/size trailer
  write_bytes(path, gz);
  expect_data_error(path, {"gzip"});
}

}  // namespace
}  // namespace ddp::data
