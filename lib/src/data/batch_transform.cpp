#include "ddp/data/batch_transform.h"

#include <string>

#include <ATen/ops/empty.h>

#include "ddp/error.h"

namespace ddp::data {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<float> per_channel(const std::vector<float>& values, int64_t channels, float fallback,
                               const char* what) {
  if (values.empty()) return std::vector<float>(channels, fallback);
  if (values.size() == 1) return std::vector<float>(channels, values[0]);
  if (static_cast<int64_t>(values.size()) != channels) {
    throw ConfigError(std::string("normalisation ") + what + " has " +
                      std::to_string(values.size()) + " values for " + std::to_string(channels) +
                      "-channel images; give 1 or one per channel");
  }
  return values;
}

}  // namespace

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  return splitmix64(splitmix64(splitmix64(splitmix64(a) ^ b) ^ c) ^ d);
}

BatchTransform::BatchTransform(int64_t channels, TransformOptions options)
    : options_(std::move(options)), channels_(channels) {
  const auto mean = per_channel(options_.mean, channels, 0.0f, "mean");
  const auto std = per_channel(options_.std, channels, 1.0f, "std");
  if (options_.crop_padding < 0) throw ConfigError("crop padding must not be negative");
  lut_.resize(channels * 256);
  for (int64_t c = 0; c < channels; ++c) {
    if (!(std[c] > 0.0f)) throw ConfigError("normalisation std must be positive");
    for (int v = 0; v < 256; ++v)
      lut_[c * 256 + v] = (static_cast<float>(v) / 255.0f - mean[c]) / std[c];
  }
}

Batch BatchTransform::operator()(const ImageDataset& data, const int64_t* indices, int64_t count,
                                 uint64_t seed) const {
  const int64_t C = data.channels(), H = data.height(), W = data.width();
  if (C != channels_) {
    throw ConfigError("batch transform built for " + std::to_string(channels_) +
                      " channels applied to " + std::to_string(C) + "-channel images");
  }
  Batch batch;
  batch.images = at::empty(
      {count, C, H, W}, at::TensorOptions()
                            .dtype(at::kFloat)
                            .memory_format(options_.channels_last ? at::MemoryFormat::ChannelsLast
                                                                  : at::MemoryFormat::Contiguous));
  batch.labels = at::empty({count}, at::kLong);
  float* out = batch.images.data_ptr<float>();
  const int64_t sB = batch.images.stride(0), sC = batch.images.stride(1),
                sH = batch.images.stride(2), sW = batch.images.stride(3);
  const uint8_t* pixels = data.images.data_ptr<uint8_t>();
  const int64_t* labels = data.labels.data_ptr<int64_t>();
  int64_t* out_labels = batch.labels.data_ptr<int64_t>();
  const int64_t image_size = C * H * W;
  const int pad = options_.crop_padding;

  for (int64_t b = 0; b < count; ++b) {
    const int64_t sample = indices[b];
    out_labels[b] = labels[sample];
    const uint8_t* src = pixels + sample * image_size;
    float* dst = out + b * sB;
    int64_t dy = 0, dx = 0;
    bool flip = false;
    if (options_.random_crop_flip) {
      const uint64_t r = mix_seed(seed, static_cast<uint64_t>(b));
      dy = static_cast<int64_t>(r % (2 * pad + 1)) - pad;
      dx = static_cast<int64_t>((r >> 16) % (2 * pad + 1)) - pad;
      flip = ((r >> 32) & 1) != 0;
    }
    for (int64_t c = 0; c < C; ++c) {
      const float* lut = lut_.data() + c * 256;
      const uint8_t* plane = src + c * H * W;
      for (int64_t y = 0; y < H; ++y) {
        const int64_t sy = y + dy;
        float* row = dst + c * sC + y * sH;
        if (sy < 0 || sy >= H) {
          for (int64_t x = 0; x < W; ++x) row[x * sW] = lut[0];
          continue;
        }
        const uint8_t* src_row = plane + sy * W;
        for (int64_t x = 0; x < W; ++x) {
          const int64_t sx = (flip ? W - 1 - x : x) + dx;
          row[x * sW] = (sx < 0 || sx >= W) ? lut[0] : lut[src_row[sx]];
        }
      }
    }
  }
  return batch;
}

}  // namespace ddp::data
