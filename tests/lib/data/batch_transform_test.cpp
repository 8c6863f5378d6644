// Unit test of lib/src/data/batch_transform.cpp: BatchTransform gathers the indexed samples and
// their labels, normalises per channel, lays images out channels-last when asked, and augments
// with a crop of the zero-padded image and a flip drawn only from the seed and the position in
// the batch; its options are checked; mix_seed is SplitMix64 chained.
#include "ddp/data/batch_transform.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ddp/error.h"

namespace ddp::data {
namespace {

// n images [n, c, h, w]: within an image every pixel differs (1 .. 251, no 0, so that padding
// is told apart); label = 10 + sample.
ImageDataset make_dataset(int64_t n, int64_t c, int64_t h, int64_t w) {
  ImageDataset d;
  d.images = at::empty({n, c, h, w}, at::kByte);
  d.labels = at::empty({n}, at::kLong);
  auto* px = d.images.data_ptr<uint8_t>();
  const int64_t size = c * h * w;
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t i = 0; i < size; ++i)
      px[s * size + i] = static_cast<uint8_t>((i * 7 + s * 13) % 251 + 1);
    d.labels.data_ptr<int64_t>()[s] = 10 + s;
  }
  for (int64_t k = 0; k < 10 + n; ++k) d.class_names.push_back(std::to_string(k));
  return d;
}

TransformOptions normalised(std::vector<float> mean, std::vector<float> std) {
  TransformOptions o;
  o.mean = std::move(mean);
  o.std = std::move(std);
  return o;
}

// (pixel / 255 - mean) / std in float, as a float [C, H, W] tensor of sample `s`, shifted by
// (dy, dx) and optionally flipped; outside the image the pixel is 0.
at::Tensor expected_image(const ImageDataset& d, int64_t s, const std::vector<float>& mean,
                          const std::vector<float>& std, int dy = 0, int dx = 0,
                          bool flip = false) {
  const int64_t C = d.channels(), H = d.height(), W = d.width();
  at::Tensor out = at::empty({C, H, W}, at::kFloat);
  const auto px = d.images.accessor<uint8_t, 4>();
  auto o = out.accessor<float, 3>();
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t y = 0; y < H; ++y) {
      for (int64_t x = 0; x < W; ++x) {
        const int64_t sy = y + dy, sx = (flip ? W - 1 - x : x) + dx;
        const bool inside = sy >= 0 && sy < H && sx >= 0 && sx < W;
        const float v = inside ? static_cast<float>(px[s][c][sy][sx]) : 0.0f;
        o[c][y][x] = (v / 255.0f - mean[c]) / std[c];
      }
    }
  }
  return out;
}

Batch apply(const BatchTransform& t, const ImageDataset& d, const std::vector<int64_t>& indices,
            uint64_t seed = 0) {
  return t(d, indices.data(), static_cast<int64_t>(indices.size()), seed);
}

TEST(BatchTransform, NormalisesEachChannelWithItsMeanAndStd) {
  const ImageDataset d = make_dataset(4, 3, 2, 3);
  const std::vector<float> mean{0.1f, 0.2f, 0.3f}, std{0.5f, 0.25f, 2.0f};
  const BatchTransform t(3, normalised(mean, std));
  const Batch b = apply(t, d, {2, 0});
  ASSERT_EQ(b.images.sizes(), at::IntArrayRef({2, 3, 2, 3}));
  EXPECT_EQ(b.images.scalar_type(), at::kFloat);
  EXPECT_TRUE(b.images.is_contiguous());
  EXPECT_TRUE(at::allclose(b.images[0], expected_image(d, 2, mean, std), 0, 1e-6));
  EXPECT_TRUE(at::allclose(b.images[1], expected_image(d, 0, mean, std), 0, 1e-6));
  // One value by hand: sample 0, channel 2, pixel (1, 2) is element 2 * 6 + 1 * 3 + 2 = 17,
  // (17 * 7) % 251 + 1 = 120.
  EXPECT_FLOAT_EQ(b.images[1][2][1][2].item<float>(), (120.0f / 255.0f - 0.3f) / 2.0f);
}

TEST(BatchTransform, OneValueAppliesToEveryChannelAndNoneMeansZeroAndOne) {
  ImageDataset d = make_dataset(1, 2, 1, 3);
  auto* px = d.images.data_ptr<uint8_t>();
  const uint8_t values[] = {0, 51, 255, 255, 102, 0};
  std::copy(std::begin(values), std::end(values), px);

  const Batch half = apply(BatchTransform(2, normalised({0.5f}, {0.5f})), d, {0});
  const at::Tensor want_half = at::tensor({-1.0f, -0.6f, 1.0f, 1.0f, -0.2f, -1.0f});
  EXPECT_TRUE(at::allclose(half.images.flatten(), want_half, 0, 1e-6)) << half.images;

  const Batch plain = apply(BatchTransform(2, TransformOptions{}), d, {0});
  const at::Tensor want_plain = at::tensor({0.0f, 0.2f, 1.0f, 1.0f, 0.4f, 0.0f});
  EXPECT_TRUE(at::allclose(plain.images.flatten(), want_plain, 0, 1e-6)) << plain.images;
}

TEST(BatchTransform, SamplesAndLabelsFollowTheIndicesRepeatsIncluded) {
  const ImageDataset d = make_dataset(5, 1, 3, 3);
  const BatchTransform t(1, TransformOptions{});
  const Batch b = apply(t, d, {3, 1, 3, 4});
  EXPECT_EQ(b.labels.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(b.labels, at::tensor({13, 11, 13, 14}, at::kLong)));
  EXPECT_TRUE(at::equal(b.images[0], b.images[2]));
  EXPECT_TRUE(at::allclose(b.images[1], expected_image(d, 1, {0.0f}, {1.0f}), 0, 1e-7));
  EXPECT_TRUE(at::allclose(b.images[3], expected_image(d, 4, {0.0f}, {1.0f}), 0, 1e-7));
  EXPECT_EQ(b.index, 0);
}

TEST(BatchTransform, ChannelsLastHasTheSameValuesInNhwcLayout) {
  const ImageDataset d = make_dataset(3, 3, 4, 5);
  TransformOptions o = normalised({0.4f, 0.5f, 0.6f}, {0.2f, 0.3f, 0.4f});
  const Batch standard = apply(BatchTransform(3, o), d, {0, 1, 2});
  o.channels_last = true;
  const Batch nhwc = apply(BatchTransform(3, o), d, {0, 1, 2});
  EXPECT_TRUE(nhwc.images.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(nhwc.images.strides(), at::IntArrayRef({60, 1, 15, 3}));
  EXPECT_TRUE(at::equal(nhwc.images, standard.images));
}

TEST(BatchTransform, WithoutAugmentationTheSeedChangesNothing) {
  const ImageDataset d = make_dataset(4, 2, 3, 3);
  const BatchTransform t(2, TransformOptions{});
  EXPECT_TRUE(at::equal(apply(t, d, {0, 1, 2, 3}, 1).images, apply(t, d, {0, 1, 2, 3}, 2).images));
}

// Which (dy, dx, flip) of [-pad, pad]^2 x {no, yes} turned sample `s` into `image`; several
// when more than one does, none when none does.
std::vector<std::tuple<int, int, bool>> explanations(const at::Tensor& image, const ImageDataset& d,
                                                     int64_t s, int pad,
                                                     const std::vector<float>& mean,
                                                     const std::vector<float>& std) {
  std::vector<std::tuple<int, int, bool>> found;
  for (int dy = -pad; dy <= pad; ++dy) {
    for (int dx = -pad; dx <= pad; ++dx) {
      for (bool flip : {false, true}) {
        if (at::equal(image, expected_image(d, s, mean, std, dy, dx, flip))) {
          found.emplace_back(dy, dx, flip);
        }
      }
    }
  }
  return found;
}

TEST(BatchTransform, AugmentationIsACropOfTheZeroPaddedImageAndAFlip) {
  const ImageDataset d = make_dataset(8, 2, 5, 6);
  // A mean of 0.5: padding must be the normalised zero pixel, -1, not 0.
  const std::vector<float> mean{0.5f}, std{0.5f};
  TransformOptions o = normalised(mean, std);
  o.random_crop_flip = true;
  o.crop_padding = 1;
  const BatchTransform t(2, o);
  std::vector<int64_t> indices;
  for (int k = 0; k < 256; ++k) indices.push_back(k % 8);
  const Batch b = apply(t, d, indices, 12345);
  std::set<std::tuple<int, int, bool>> drawn;
  for (int64_t i = 0; i < b.images.size(0); ++i) {
    const auto found = explanations(b.images[i], d, indices[i], 1, {0.5f, 0.5f}, {0.5f, 0.5f});
    ASSERT_EQ(found.size(), 1u) << "image " << i << " is not exactly one crop/flip of its sample";
    drawn.insert(found.front());
  }
  // 256 draws over 3 x 3 offsets x 2 flips: every combination comes up.
  EXPECT_EQ(drawn.size(), 18u);
}

TEST(BatchTransform, ZeroPaddingOnlyFlips) {
  const ImageDataset d = make_dataset(4, 1, 3, 4);
  TransformOptions o;
  o.random_crop_flip = true;
  o.crop_padding = 0;
  const BatchTransform t(1, o);
  const std::vector<int64_t> indices{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};
  const Batch b = apply(t, d, indices, 7);
  int flips = 0;
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const auto found = explanations(b.images[i], d, indices[i], 0, {0.0f}, {1.0f});
    ASSERT_EQ(found.size(), 1u) << "image " << i;
    flips += std::get<2>(found.front());
  }
  EXPECT_GT(flips, 0);
  EXPECT_LT(flips, 16);
}

TEST(BatchTransform, DrawsDependOnlyOnTheSeedAndThePositionInTheBatch) {
  const ImageDataset d = make_dataset(8, 3, 6, 6);
  TransformOptions o;
  o.random_crop_flip = true;
  o.crop_padding = 2;
  const BatchTransform t(3, o);
  const std::vector<int64_t> all{0, 1, 2, 3, 4, 5, 6, 7};
  const Batch once = apply(t, d, all, 99);
  EXPECT_TRUE(at::equal(once.images, apply(t, d, all, 99).images)) << "not reproducible";
  // The first four positions of a shorter batch with the same seed draw the same.
  const Batch prefix = apply(t, d, {0, 1, 2, 3}, 99);
  EXPECT_TRUE(at::equal(prefix.images, once.images.narrow(0, 0, 4)));
  // Another seed, other draws (for at least one of eight images).
  EXPECT_FALSE(at::equal(once.images, apply(t, d, all, 100).images));
}

TEST(BatchTransform, RejectsOptionsItCannotApply) {
  try {
    BatchTransform(3, normalised({0.1f, 0.2f}, {}));
    ADD_FAILURE() << "no error for 2 means for 3 channels";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "normalisation mean has 2 values for 3-channel images; give 1 or one per channel");
  }
  try {
    BatchTransform(1, normalised({}, {0.5f, 0.5f}));
    ADD_FAILURE() << "no error for 2 stds for 1 channel";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "normalisation std has 2 values for 1-channel images; give 1 or one per channel");
  }
  for (float bad : {0.0f, -1.0f, std::nanf("")}) {
    try {
      BatchTransform(2, normalised({}, {1.0f, bad}));
      ADD_FAILURE() << "no error for std " << bad;
    } catch (const ConfigError& e) {
      EXPECT_STREQ(e.what(), "normalisation std must be positive");
    }
  }
  TransformOptions negative;
  negative.crop_padding = -1;
  EXPECT_THROW(BatchTransform(1, negative), ConfigError);
}

TEST(BatchTransform, RejectsImagesWithAnotherChannelCount) {
  const BatchTransform t(3, TransformOptions{});
  try {
    apply(t, make_dataset(2, 1, 2, 2), {0});
    ADD_FAILURE() << "no error for 1-channel images";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "batch transform built for 3 channels applied to 1-channel images");
  }
}

// Expected values from an independent SplitMix64 (whose first output from state 0 is the
// published 0xE220A8397B1DCDAF), chained as s(s(s(s(a) ^ b) ^ c) ^ d).
TEST(MixSeed, IsChainedSplitMix64) {
  EXPECT_EQ(mix_seed(0, 0, 0, 0), 0x2130748AAAC80268ull);
  EXPECT_EQ(mix_seed(1, 2, 3, 4), 0xD55CCD4AEB3CCAFBull);
  EXPECT_EQ(mix_seed(1, 2), 0x75693551CF81461Cull);
  EXPECT_EQ(mix_seed(2, 1), 0x12357961B81F4425ull);
  EXPECT_EQ(mix_seed(42, 7), 0x7D9B9E232DDB16E1ull);
  EXPECT_EQ(mix_seed(1, 2), mix_seed(1, 2, 0, 0));
}

}  // namespace
}  // namespace ddp::data
