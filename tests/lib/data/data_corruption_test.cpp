// Fuzz-style robustness: every truncation and many random byte corruptions of valid IDX and
// CIFAR-10 files (raw and gzip) must either load correctly or raise a DataError naming the file;
// never crash, hang, allocate absurdly or return silently wrong data from a gzip file.
#include <random>
#include <string>
#include <vector>

#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include "ddp/data/cifar10.h"
#include "ddp/data/idx.h"
#include "ddp/error.h"
#include "test_files.h"

namespace ddp::data {
namespace {

using testing::TempDir;

enum class Outcome { kLoaded, kDataError };

template <typename Load>
Outcome try_load(const std::string& path, Load&& load, at::Tensor* out) {
  try {
    *out = load();
    return Outcome::kLoaded;
  } catch (const DataError& e) {
    EXPECT_FALSE(e.file().empty());
    EXPECT_NE(std::string(e.what()).find(e.file()), std::string::npos);
    return Outcome::kDataError;
  }
}

std::vector<uint8_t> sample_idx() {
  std::vector<uint8_t> pixels(3 * 5 * 4);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 37);
  return testing::idx_bytes(0x08, {3, 5, 4}, pixels);
}

TEST(DataCorruption, EveryTruncationOfAnIdxFileIsADataError) {
  for (bool gzip : {false, true}) {
    TempDir dir;
    const std::string path = dir.file("x");
    testing::write_bytes(path, sample_idx(), gzip);
    const auto whole = testing::read_bytes(path);
    for (std::size_t len = 0; len < whole.size(); ++len) {
      testing::write_bytes(path, std::vector<uint8_t>(whole.begin(), whole.begin() + len));
      at::Tensor t;
      EXPECT_EQ(try_load(
                    path, [&] { return read_idx(path); }, &t),
                Outcome::kDataError)
          << (gzip ? "gzip" : "raw") << " truncated to " << len << " of " << whole.size();
    }
  }
}

TEST(DataCorruption, RandomByteFlipsInAnIdxFile) {
  std::mt19937 rng(1234);
  for (bool gzip : {false, true}) {
    TempDir dir;
    const std::string path = dir.file("x");
    testing::write_bytes(path, sample_idx(), gzip);
    const auto whole = testing::read_bytes(path);
    const at::Tensor original = read_idx(path);
    int errors = 0;
    for (int trial = 0; trial < 400; ++trial) {
      auto bytes = whole;
      const std::size_t at = rng() % bytes.size();
      bytes[at] ^= static_cast<uint8_t>(1 + rng() % 255);
      testing::write_bytes(path, bytes);
      at::Tensor t;
      const Outcome outcome = try_load(
          path, [&] { return read_idx(path); }, &t);
      if (outcome == Outcome::kDataError) {
        ++errors;
        continue;
      }
      if (gzip) {
        // gzip's CRC catches payload damage; only ignored header fields (mtime, flags, OS) may
        // change without an error, and then the data must be exactly the original.
        EXPECT_TRUE(at::equal(t, original)) << "flip at byte " << at << " went unnoticed";
      } else if (at < 16) {
        // A raw header flip that still parses must describe the same number of bytes.
        EXPECT_EQ(t.numel() * t.element_size(), original.numel()) << "flip at byte " << at;
      }
    }
    EXPECT_GT(errors, 0);
  }
}

TEST(DataCorruption, TruncationsAndFlipsOfACifarBatch) {
  TempDir dir;
  testing::write_cifar_dir(dir.path(), 1, 3);
  const std::string path = dir.file("test_batch.bin");
  const auto whole = testing::read_bytes(path);
  for (std::size_t len :
       {std::size_t{0}, std::size_t{1}, std::size_t{3072}, std::size_t{3074}, whole.size() - 1}) {
    testing::write_bytes(path, std::vector<uint8_t>(whole.begin(), whole.begin() + len));
    at::Tensor t;
    EXPECT_EQ(try_load(
                  path, [&] { return load_cifar10(dir.path(), Split::kTest).images; }, &t),
              Outcome::kDataError)
        << "truncated to " << len;
  }
  std::mt19937 rng(99);
  for (int trial = 0; trial < 100; ++trial) {
    auto bytes = whole;
    // Hit label bytes half of the time: values >= 10 must be rejected.
    const std::size_t record = rng() % 3;
    const std::size_t at = trial % 2 ? record * kCifarRecordBytes : rng() % bytes.size();
    bytes[at] = static_cast<uint8_t>(rng() % 256);
    testing::write_bytes(path, bytes);
    at::Tensor labels;
    const Outcome outcome = try_load(
        path, [&] { return load_cifar10(dir.path(), Split::kTest).labels; }, &labels);
    if (outcome == Outcome::kLoaded) {
      EXPECT_LT(labels.max().item<int64_t>(), 10);
      EXPECT_GE(labels.min().item<int64_t>(), 0);
    } else {
      EXPECT_TRUE(bytes[at] >= 10 && at % kCifarRecordBytes == 0) << "unexpected error at " << at;
    }
  }
}

}  // namespace
}  // namespace ddp::data
