#include "test_files.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <zlib.h>

namespace ddp::testing {

TempDir::TempDir() {
  std::string pattern = std::filesystem::temp_directory_path().string() + "/ddp-train-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    if (f == nullptr) throw std::runtime_error("cannot write " + path);
    if (!bytes.empty() && gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) <= 0) {
      throw std::runtime_error("gzwrite failed for " + path);
    }
    gzclose(f);
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::vector<uint8_t> idx_bytes(uint8_t type_code, const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out{0, 0, type_code, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    out.push_back(static_cast<uint8_t>(d >> 24));
    out.push_back(static_cast<uint8_t>(d >> 16));
    out.push_back(static_cast<uint8_t>(d >> 8));
    out.push_back(static_cast<uint8_t>(d));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

uint8_t mnist_pixel(int i, int y, int x) { return static_cast<uint8_t>((i * 7 + y * 3 + x) % 256); }

void write_mnist_split(const std::string& dir, const std::string& prefix, int n, int h, int w,
                       int classes, bool gzip) {
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> labels;
  for (int i = 0; i < n; ++i) {
    labels.push_back(static_cast<uint8_t>(i % classes));
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) pixels.push_back(mnist_pixel(i, y, x));
    }
  }
  const std::string suffix = gzip ? ".gz" : "";
  const auto un = static_cast<uint32_t>(n);
  write_bytes(dir + "/" + prefix + "-images-idx3-ubyte" + suffix,
              idx_bytes(0x08, {un, static_cast<uint32_t>(h), static_cast<uint32_t>(w)}, pixels),
              gzip);
  write_bytes(dir + "/" + prefix + "-labels-idx1-ubyte" + suffix, idx_bytes(0x08, {un}, labels),
              gzip);
}

uint8_t cifar_pixel(int i, int c, int y, int x) {
  return static_cast<uint8_t>((i * 13 + c * 101 + y * 5 + x) % 256);
}

std::vector<uint8_t> cifar_batch_bytes(int n, int first_label) {
  std::vector<uint8_t> out;
  for (int r = 0; r < n; ++r) {
    const int i = first_label + r;
    out.push_back(static_cast<uint8_t>(i % 10));
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 32; ++y) {
        for (int x = 0; x < 32; ++x) out.push_back(cifar_pixel(i, c, y, x));
      }
    }
  }
  return out;
}

void write_cifar_dir(const std::string& dir, int per_file, int test_records) {
  for (int f = 1; f <= 5; ++f) {
    write_bytes(dir + "/data_batch_" + std::to_string(f) + ".bin",
                cifar_batch_bytes(per_file, (f - 1) * per_file));
  }
  write_bytes(dir + "/test_batch.bin", cifar_batch_bytes(test_records, 1000));
  std::ofstream meta(dir + "/batches.meta.txt");
  meta << "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n";
}

}  // namespace ddp::testing
