// DataLoader and BatchTransform: batches cover the shard in sampler order, normalisation and
// augmentation are exactly what they claim, results do not depend on prefetch depth, a resumed
// epoch continues identically, and prefetching builds batches ahead of the consumer.
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "ddp/data/data_loader.h"
#include "ddp/error.h"

namespace ddp::data {
namespace {

// n images [n, c, h, w] whose pixels encode (sample, channel, y, x); label = sample % 10.
ImageDataset make_dataset(int64_t n, int64_t c, int64_t h, int64_t w) {
  ImageDataset d;
  d.images = at::empty({n, c, h, w}, at::kByte);
  d.labels = at::empty({n}, at::kLong);
  auto* px = d.images.data_ptr<uint8_t>();
  for (int64_t i = 0; i < n * c * h * w; ++i) px[i] = static_cast<uint8_t>((i * 7919) % 251);
  for (int64_t i = 0; i < n; ++i) d.labels.data_ptr<int64_t>()[i] = i % 10;
  d.class_names = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  return d;
}

std::vector<Batch> whole_epoch(DataLoader& loader, int64_t epoch, int64_t first = 0) {
  loader.start_epoch(epoch, first);
  std::vector<Batch> out;
  while (auto b = loader.next()) out.push_back(*b);
  return out;
}

TEST(DataLoader, BatchesFollowTheSamplerAndScalePixels) {
  const ImageDataset d = make_dataset(23, 1, 4, 5);
  DistributedSampler sampler(23, 2, 1);
  LoaderOptions o;
  o.batch_size = 5;
  DataLoader loader(d, sampler, o);
  ASSERT_EQ(loader.batches_per_epoch(), 3);  // 12 samples per rank
  const auto batches = whole_epoch(loader, 2);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2].images.size(0), 2);

  sampler.set_epoch(2);
  const auto expected = sampler.indices();
  std::size_t k = 0;
  for (const auto& b : batches) {
    for (int64_t j = 0; j < b.images.size(0); ++j, ++k) {
      const int64_t i = expected[k];
      EXPECT_EQ(b.labels[j].item<int64_t>(), i % 10);
      const auto want = d.images[i].to(at::kFloat) / 255.0;
      EXPECT_TRUE(b.images[j].allclose(want, 1e-6, 1e-6)) << "sample " << i;
    }
  }
  EXPECT_EQ(k, expected.size());
}

TEST(DataLoader, DropLastOmitsThePartialBatch) {
  LoaderOptions o;
  o.batch_size = 5;
  o.drop_last = true;
  DataLoader loader(make_dataset(23, 1, 2, 2), DistributedSampler(23, 2, 0), o);
  EXPECT_EQ(loader.batches_per_epoch(), 2);
  EXPECT_EQ(whole_epoch(loader, 0).size(), 2u);
}

TEST(DataLoader, NormalisesPerChannel) {
  const ImageDataset d = make_dataset(4, 3, 2, 2);
  LoaderOptions o;
  o.batch_size = 4;
  o.transform.mean = {0.1f, 0.2f, 0.3f};
  o.transform.std = {0.5f, 0.25f, 2.0f};
  SamplerOptions s;
  s.shuffle = false;
  DataLoader loader(d, DistributedSampler(4, 1, 0, s), o);
  const auto b = whole_epoch(loader, 0).at(0);
  for (int c = 0; c < 3; ++c) {
    const auto want =
        (d.images.select(1, c).to(at::kFloat) / 255.0 - o.transform.mean[c]) / o.transform.std[c];
    EXPECT_TRUE(b.images.select(1, c).allclose(want, 1e-5, 1e-6)) << "channel " << c;
  }
}

TEST(DataLoader, ChannelsLastStrides) {
  LoaderOptions o;
  o.batch_size = 2;
  o.transform.channels_last = true;
  DataLoader loader(make_dataset(4, 3, 5, 6), DistributedSampler(4, 1, 0), o);
  const auto b = whole_epoch(loader, 0).at(0);
  EXPECT_TRUE(b.images.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_EQ(b.images.stride(1), 1);
}

// The source image, padded by `pad` zero pixels, cropped at (dy, dx) and optionally flipped.
at::Tensor crop_flip(const at::Tensor& img, int pad, int dy, int dx, bool flip) {
  const int64_t C = img.size(0), H = img.size(1), W = img.size(2);
  at::Tensor out = at::zeros({C, H, W}, at::kFloat);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t y = 0; y < H; ++y) {
      for (int64_t x = 0; x < W; ++x) {
        const int64_t sy = y + dy, sx = (flip ? W - 1 - x : x) + dx;
        if (sy >= 0 && sy < H && sx >= 0 && sx < W) {
          out[c][y][x] = img[c][sy][sx].item<uint8_t>() / 255.0f;
        }
      }
    }
  }
  (void)pad;
  return out;
}

TEST(DataLoader, AugmentationIsACropOfThePaddedImageAndAFlip) {
  const ImageDataset d = make_dataset(64, 3, 8, 8);
  LoaderOptions o;
  o.batch_size = 64;
  o.transform.random_crop_flip = true;
  o.transform.crop_padding = 2;
  SamplerOptions s;
  s.shuffle = false;
  DataLoader loader(d, DistributedSampler(64, 1, 0, s), o);
  const auto b = whole_epoch(loader, 0).at(0);
  int flips = 0, shifted = 0;
  for (int64_t i = 0; i < 64; ++i) {
    bool matched = false;
    for (int dy = -2; dy <= 2 && !matched; ++dy) {
      for (int dx = -2; dx <= 2 && !matched; ++dx) {
        for (bool flip : {false, true}) {
          if (at::equal(b.images[i], crop_flip(d.images[i], 2, dy, dx, flip))) {
            matched = true;
            flips += flip;
            shifted += dy != 0 || dx != 0;
            break;
          }
        }
      }
    }
    EXPECT_TRUE(matched) << "sample " << i << " is not a crop/flip of its source";
  }
  // 64 draws: both outcomes of each choice must appear.
  EXPECT_GT(flips, 8);
  EXPECT_LT(flips, 56);
  EXPECT_GT(shifted, 32);
}

TEST(DataLoader, ResultsDoNotDependOnPrefetchDepth) {
  const ImageDataset d = make_dataset(50, 3, 8, 8);
  std::vector<std::vector<Batch>> runs;
  for (int depth : {0, 1, 4}) {
    LoaderOptions o;
    o.batch_size = 7;
    o.prefetch = depth;
    o.seed = 11;
    o.transform.random_crop_flip = true;
    DataLoader loader(d, DistributedSampler(50, 2, 1), o);
    whole_epoch(loader, 0);  // epochs must not interfere
    runs.push_back(whole_epoch(loader, 1));
  }
  for (std::size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), runs[0].size());
    for (std::size_t k = 0; k < runs[0].size(); ++k) {
      EXPECT_TRUE(at::equal(runs[r][k].images, runs[0][k].images)) << "batch " << k;
      EXPECT_TRUE(at::equal(runs[r][k].labels, runs[0][k].labels)) << "batch " << k;
    }
  }
}

TEST(DataLoader, ResumedEpochContinuesExactly) {
  const ImageDataset d = make_dataset(40, 1, 6, 6);
  LoaderOptions o;
  o.batch_size = 4;
  o.transform.random_crop_flip = true;
  DataLoader loader(d, DistributedSampler(40, 2, 0), o);
  const auto full = whole_epoch(loader, 3);
  const auto tail = whole_epoch(loader, 3, 2);
  ASSERT_EQ(tail.size(), full.size() - 2);
  for (std::size_t k = 0; k < tail.size(); ++k) {
    EXPECT_EQ(tail[k].index, full[k + 2].index);
    EXPECT_TRUE(at::equal(tail[k].images, full[k + 2].images)) << "batch " << k + 2;
  }
  EXPECT_TRUE(whole_epoch(loader, 3, loader.batches_per_epoch()).empty());
  EXPECT_THROW(loader.start_epoch(3, loader.batches_per_epoch() + 1), ConfigError);
}

TEST(DataLoader, PrefetchBuildsAheadOfTheConsumer) {
  LoaderOptions o;
  o.batch_size = 8;
  o.prefetch = 3;
  DataLoader loader(make_dataset(200, 1, 28, 28), DistributedSampler(200, 1, 0), o);
  loader.start_epoch(0);
  // Nobody calls next(): the background thread alone must fill the queue, then stop there.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (loader.stats().built < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(loader.stats().built, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(loader.stats().built, 3) << "built beyond the prefetch depth";
  ASSERT_TRUE(loader.next().has_value());
  EXPECT_EQ(loader.stats().batches, 1);
}

TEST(DataLoader, RejectsBadOptions) {
  const ImageDataset d = make_dataset(4, 3, 2, 2);
  LoaderOptions o;
  o.transform.mean = {0.1f, 0.2f};
  EXPECT_THROW(DataLoader(d, DistributedSampler(4, 1, 0), o), ConfigError);
  LoaderOptions zero;
  zero.batch_size = 0;
  EXPECT_THROW(DataLoader(d, DistributedSampler(4, 1, 0), zero), ConfigError);
  EXPECT_THROW(DataLoader(d, DistributedSampler(5, 1, 0), LoaderOptions{}), ConfigError);
  DataLoader idle(d, DistributedSampler(4, 1, 0), LoaderOptions{});
  EXPECT_THROW(idle.next(), ConfigError);
}

}  // namespace
}  // namespace ddp::data
