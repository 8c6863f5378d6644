#pragma once
// Turns a list of samples into a training batch: gathers the uint8 pixels, optionally applies
// CIFAR-style augmentation (random crop from the image zero-padded by 4 pixels, random horizontal
// flip) and normalises to float ((pixel / 255 - mean) / std per channel) in one pass.
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ddp/data/image_dataset.h"

namespace ddp::data {

struct Batch {
  at::Tensor images;  // float32 [B, C, H, W] (channels-last strides if asked for)
  at::Tensor labels;  // int64 [B]
  int64_t index = 0;  // position of this batch in its epoch
};

struct TransformOptions {
  // Per channel, in units of pixel / 255. One value applies to every channel; empty means 0 / 1.
  std::vector<float> mean;
  std::vector<float> std;
  bool random_crop_flip = false;
  int crop_padding = 4;
  // NHWC strides: what oneDNN convolutions prefer.
  bool channels_last = false;
};

class BatchTransform {
 public:
  // Throws ConfigError if mean/std do not have 0, 1 or `channels` entries or a std is <= 0.
  BatchTransform(int64_t channels, TransformOptions options);

  // The batch of samples indices[0..count). Augmentation draws only from `seed`, so a batch is
  // the same whichever thread builds it and whenever (resume reproduces it exactly).
  Batch operator()(const ImageDataset& data, const int64_t* indices, int64_t count,
                   uint64_t seed) const;

  const TransformOptions& options() const { return options_; }

 private:
  TransformOptions options_;
  int64_t channels_;
  std::vector<float> lut_;  // [channel][pixel value] -> normalised float
};

// Mixes several values into one well-distributed seed (SplitMix64 finaliser).
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0);

}  // namespace ddp::data
