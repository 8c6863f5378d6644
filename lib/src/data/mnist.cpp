#include "ddp/data/mnist.h"

#include <sys/stat.h>

#include <ATen/ops/empty.h>

#include "ddp/data/idx.h"
#include "ddp/error.h"

namespace ddp::data {
namespace {

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// "<dir>/<stem>" or "<dir>/<stem>.gz", whichever exists (the raw file first).
std::string find_idx_file(const std::string& dir, const std::string& stem) {
  const std::string base = dir + "/" + stem;
  if (is_file(base)) return base;
  if (is_file(base + ".gz")) return base + ".gz";
  throw DataError(base + "[.gz]",
                  "not found; expected the four MNIST-format IDX files (train-/t10k- images and "
                  "labels) in " +
                      dir +
                      " (for Fashion-MNIST: apt-get install dataset-fashion-mnist, or pass the "
                      "directory that holds them)");
}

std::string dims_text(const at::Tensor& t) {
  std::string text = "[";
  for (int64_t d = 0; d < t.dim(); ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
  return text + "]";
}

}  // namespace

const std::vector<std::string>& fashion_mnist_class_names() {
  static const std::vector<std::string> names{"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                              "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                              "Bag",         "Ankle boot"};
  return names;
}

const std::vector<std::string>& mnist_digit_class_names() {
  static const std::vector<std::string> names{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  return names;
}

ImageDataset load_mnist(const std::string& dir, Split split,
                        const std::vector<std::string>& class_names) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_idx_file(dir, prefix + "-labels-idx1-ubyte");

  at::Tensor images = read_idx(images_path);
  if (images.scalar_type() != at::kByte || images.dim() != 3) {
    throw DataError(images_path, std::string("expected uint8 images [N, H, W], found ") +
                                     c10::toString(images.scalar_type()) + " " + dims_text(images));
  }
  at::Tensor labels = read_idx(labels_path);
  if (labels.scalar_type() != at::kByte || labels.dim() != 1) {
    throw DataError(labels_path, std::string("expected uint8 labels [N], found ") +
                                     c10::toString(labels.scalar_type()) + " " + dims_text(labels));
  }
  if (labels.size(0) != images.size(0)) {
    throw DataError(labels_path, "holds " + std::to_string(labels.size(0)) + " labels but " +
                                     images_path + " holds " + std::to_string(images.size(0)) +
                                     " images; the files must come from the same split");
  }

  const int64_t n = labels.size(0);
  const auto num_classes = static_cast<int64_t>(class_names.size());
  at::Tensor labels64 = at::empty({n}, at::kLong);
  const uint8_t* src = labels.data_ptr<uint8_t>();
  int64_t* dst = labels64.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (src[i] >= num_classes) {
      throw DataError(labels_path, "label " + std::to_string(src[i]) + " at index " +
                                       std::to_string(i) + " is outside 0.." +
                                       std::to_string(num_classes - 1));
    }
    dst[i] = src[i];
  }
  return {images.unsqueeze(1), labels64, class_names};
}

ImageDataset load_fashion_mnist(const std::string& dir, Split split) {
  return load_mnist(dir, split, fashion_mnist_class_names());
}

}  // namespace ddp::data
