#include "ddp/data/image_dataset.h"

#include <algorithm>

namespace ddp::data {

ImageDataset ImageDataset::head(int64_t n) const {
  const int64_t count = std::clamp<int64_t>(n, 0, size());
  return {images.narrow(0, 0, count), labels.narrow(0, 0, count), class_names};
}

}  // namespace ddp::data
