#pragma once
// Writes dataset files for tests: IDX (raw or gzip), CIFAR-10 binary batches, and temporary
// directories that clean up after themselves.
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<uint8_t> read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip = false);

// An IDX file image: magic (0, 0, type, rank), big-endian dims, then `data` as given (the caller
// provides big-endian element bytes).
std::vector<uint8_t> idx_bytes(uint8_t type_code, const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& data);

// uint8 images [n, h, w] with pixel (i, y, x) = (i * 7 + y * 3 + x) % 256 and labels i % classes,
// as the four MNIST files under `dir` (gzipped if asked).
void write_mnist_split(const std::string& dir, const std::string& prefix, int n, int h, int w,
                       int classes, bool gzip);
uint8_t mnist_pixel(int i, int y, int x);

// One CIFAR-10 batch of n records: label (first_label + i) % 10, pixel (c, y, x) of record i =
// cifar_pixel(first_label + i, c, y, x).
std::vector<uint8_t> cifar_batch_bytes(int n, int first_label);
uint8_t cifar_pixel(int i, int c, int y, int x);
// data_batch_1..5.bin with `per_file` records each, test_batch.bin and batches.meta.txt.
void write_cifar_dir(const std::string& dir, int per_file, int test_records);

}  // namespace ddp::testing
