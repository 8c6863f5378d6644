#include "ddp/data/cifar10.h"

#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "data/compressed_reader.h"
#include "ddp/error.h"

namespace ddp::data {
namespace {

constexpr int64_t kPixels = 3 * 32 * 32;

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string find_batch(const std::string& dir, const std::string& name) {
  const std::string base = dir + "/" + name;
  if (is_file(base)) return base;
  if (is_file(base + ".gz")) return base + ".gz";
  throw DataError(base,
                  "not found; expected the CIFAR-10 binary version (cifar-10-batches-bin: "
                  "data_batch_1..5.bin, test_batch.bin, batches.meta.txt) in " +
                      dir);
}

std::vector<std::string> read_class_names(const std::string& dir) {
  const std::string path = dir + "/batches.meta.txt";
  std::ifstream in(path);
  if (!in) {
    throw DataError(path, std::string("cannot open: ") + std::strerror(errno) +
                              "; expected one class name per line next to the .bin files");
  }
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  if (names.empty()) throw DataError(path, "holds no class names, expected one per line");
  if (names.size() > 256) {
    throw DataError(path, "holds " + std::to_string(names.size()) +
                              " class names; a one-byte label allows at most 256");
  }
  return names;
}

// Appends the pixels and labels of every record in one batch file, checking labels as it goes.
void read_batch(const std::string& path, std::size_t num_classes, std::vector<uint8_t>* pixels,
                std::vector<int64_t>* labels) {
  detail::CompressedReader reader(path);
  constexpr std::size_t kRecordsPerRead = 1024;
  std::vector<uint8_t> chunk(kRecordsPerRead * kCifarRecordBytes);
  int64_t record_index = 0;
  for (;;) {
    const std::size_t got = reader.read(chunk.data(), chunk.size());
    const std::size_t whole = got / kCifarRecordBytes;
    for (std::size_t r = 0; r < whole; ++r, ++record_index) {
      const uint8_t* record = chunk.data() + r * kCifarRecordBytes;
      if (record[0] >= num_classes) {
        throw DataError(path, "record " + std::to_string(record_index) + " has label " +
                                  std::to_string(record[0]) + ", expected 0.." +
                                  std::to_string(num_classes - 1) + " (batches.meta.txt lists " +
                                  std::to_string(num_classes) + " classes)");
      }
      labels->push_back(record[0]);
      pixels->insert(pixels->end(), record + 1, record + kCifarRecordBytes);
    }
    if (got < chunk.size()) {
      if (got % kCifarRecordBytes != 0 || reader.position() == 0) {
        throw DataError(path, "size " + std::to_string(reader.position()) +
                                  " bytes is not a whole number of " +
                                  std::to_string(kCifarRecordBytes) +
                                  "-byte records (1 label + 3x32x32 pixels); truncated, or not a "
                                  "CIFAR-10 binary batch");
      }
      return;
    }
  }
}

}  // namespace

ImageDataset load_cifar10(const std::string& dir, Split split) {
  std::vector<std::string> files;
  if (split == Split::kTrain) {
    for (int i = 1; i <= 5; ++i) {
      files.push_back(find_batch(dir, "data_batch_" + std::to_string(i) + ".bin"));
    }
  } else {
    files.push_back(find_batch(dir, "test_batch.bin"));
  }
  std::vector<std::string> class_names = read_class_names(dir);

  auto pixels = std::make_unique<std::vector<uint8_t>>();
  std::vector<int64_t> labels;
  pixels->reserve(files.size() * 10000 * kPixels);
  labels.reserve(files.size() * 10000);
  for (const auto& file : files) read_batch(file, class_names.size(), pixels.get(), &labels);

  const auto n = static_cast<int64_t>(labels.size());
  auto* raw = pixels.release();
  at::Tensor images = at::from_blob(
      raw->data(), {n, 3, 32, 32}, [raw](void*) { delete raw; }, at::kByte);
  at::Tensor label_tensor = at::empty({n}, at::kLong);
  std::memcpy(label_tensor.data_ptr<int64_t>(), labels.data(), labels.size() * sizeof(int64_t));
  return {images, label_tensor, std::move(class_names)};
}
}  // namespace ddp::data
