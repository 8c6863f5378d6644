#pragma once
// An in-memory labelled image set: raw uint8 pixels as stored on disk (normalisation happens per
// batch in the loader, so the resident set stays 4x smaller than float images).
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace ddp::data {

enum class Split { kTrain, kTest };

struct ImageDataset {
  at::Tensor images;  // uint8 [N, C, H, W], contiguous
  at::Tensor labels;  // int64 [N], each in [0, class_names.size())
  std::vector<std::string> class_names;

  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
  int64_t channels() const { return images.size(1); }
  int64_t height() const { return images.size(2); }
  int64_t width() const { return images.size(3); }
  int64_t num_classes() const { return static_cast<int64_t>(class_names.size()); }

  // The first `n` samples (all of them if n >= size()), sharing memory: for quick runs and tests.
  ImageDataset head(int64_t n) const;
};

}  // namespace ddp::data
