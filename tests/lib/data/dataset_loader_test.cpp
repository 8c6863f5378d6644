// MNIST-format and CIFAR-10 dataset loading: generated directories (raw and gzip), Debian's
// Fashion-MNIST, and the errors for missing and inconsistent files.
#include <sys/stat.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "ddp/data/cifar10.h"
#include "ddp/data/mnist.h"
#include "ddp/error.h"
#include "test_files.h"

namespace ddp::data {
namespace {

using testing::TempDir;

template <typename F>
std::string data_error_of(F&& f, std::string* file = nullptr) {
  try {
    f();
  } catch (const DataError& e) {
    if (file) *file = e.file();
    return e.what();
  }
  return "(no DataError)";
}

TEST(MnistLoader, LoadsGeneratedSplitsRawAndGzipped) {
  for (bool gzip : {false, true}) {
    TempDir dir;
    testing::write_mnist_split(dir.path(), "train", 25, 28, 28, 10, gzip);
    testing::write_mnist_split(dir.path(), "t10k", 7, 28, 28, 10, gzip);
    ImageDataset train = load_fashion_mnist(dir.path(), Split::kTrain);
    ImageDataset test = load_fashion_mnist(dir.path(), Split::kTest);
    ASSERT_EQ(train.size(), 25);
    ASSERT_EQ(test.size(), 7);
    EXPECT_EQ(train.images.sizes(), at::IntArrayRef({25, 1, 28, 28}));
    EXPECT_EQ(train.labels.scalar_type(), at::kLong);
    EXPECT_EQ(train.class_names, fashion_mnist_class_names());
    for (int i = 0; i < 25; ++i) {
      EXPECT_EQ(train.labels.data_ptr<int64_t>()[i], i % 10);
      EXPECT_EQ(train.images.data_ptr<uint8_t>()[i * 784 + 5 * 28 + 9],
                testing::mnist_pixel(i, 5, 9));
    }
  }
}

TEST(MnistLoader, LoadsDebianFashionMnist) {
  struct stat st {};
  if (::stat(kDebianFashionMnistDir, &st) != 0) {
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << kDebianFashionMnistDir;
  }
  ImageDataset test = load_fashion_mnist(kDebianFashionMnistDir, Split::kTest);
  EXPECT_EQ(test.images.sizes(), at::IntArrayRef({10000, 1, 28, 28}));
  EXPECT_EQ(test.num_classes(), 10);
  EXPECT_EQ(test.class_names[9], "Ankle boot");
  EXPECT_EQ(test.head(100).size(), 100);
}

TEST(MnistLoaderErrors, MissingDirectoryNamesTheFileAndTheFix) {
  TempDir dir;
  std::string file;
  const std::string what =
      data_error_of([&] { load_mnist(dir.path() + "/absent", Split::kTrain); }, &file);
  EXPECT_EQ(file, dir.path() + "/absent/train-images-idx3-ubyte[.gz]");
  EXPECT_NE(what.find("not found"), std::string::npos) << what;
  EXPECT_NE(what.find("dataset-fashion-mnist"), std::string::npos) << what;
}

TEST(MnistLoaderErrors, LabelCountMustMatchImageCount) {
  TempDir dir;
  testing::write_mnist_split(dir.path(), "train", 10, 28, 28, 10, false);
  testing::write_bytes(dir.file("train-labels-idx1-ubyte"),
                       testing::idx_bytes(0x08, {9}, std::vector<uint8_t>(9, 1)));
  std::string file;
  const std::string what = data_error_of([&] { load_mnist(dir.path(), Split::kTrain); }, &file);
  EXPECT_EQ(file, dir.file("train-labels-idx1-ubyte"));
  EXPECT_NE(what.find("holds 9 labels"), std::string::npos) << what;
  EXPECT_NE(what.find("10 images"), std::string::npos) << what;
}

TEST(MnistLoaderErrors, LabelOutOfRange) {
  TempDir dir;
  testing::write_mnist_split(dir.path(), "t10k", 4, 28, 28, 10, true);
  testing::write_bytes(dir.file("t10k-labels-idx1-ubyte.gz"),
                       testing::idx_bytes(0x08, {4}, {1, 2, 12, 3}), true);
  const std::string what = data_error_of([&] { load_mnist(dir.path(), Split::kTest); });
  EXPECT_NE(what.find("label 12 at index 2 is outside 0..9"), std::string::npos) << what;
}

TEST(MnistLoaderErrors, ImagesMustBeUint8WithThreeDimensions) {
  TempDir dir;
  testing::write_mnist_split(dir.path(), "train", 2, 28, 28, 10, false);
  testing::write_bytes(dir.file("train-images-idx3-ubyte"),
                       testing::idx_bytes(0x0C, {2, 1}, {0, 0, 0, 1, 0, 0, 0, 2}));
  const std::string what = data_error_of([&] { load_mnist(dir.path(), Split::kTrain); });
  EXPECT_NE(what.find("expected uint8 images [N, H, W], found Int [2, 1]"), std::string::npos)
      << what;
}

TEST(Cifar10Loader, LoadsGeneratedBatches) {
  TempDir dir;
  testing::write_cifar_dir(dir.path(), 3, 4);
  ImageDataset train = load_cifar10(dir.path(), Split::kTrain);
  ImageDataset test = load_cifar10(dir.path(), Split::kTest);
  ASSERT_EQ(train.size(), 15);
  ASSERT_EQ(test.size(), 4);
  EXPECT_EQ(train.images.sizes(), at::IntArrayRef({15, 3, 32, 32}));
  ASSERT_EQ(train.class_names.size(), 10u);
  EXPECT_EQ(train.class_names[0], "airplane");
  EXPECT_EQ(train.class_names[9], "truck");
  for (int i = 0; i < 15; ++i) {
    EXPECT_EQ(train.labels.data_ptr<int64_t>()[i], i % 10);
    const uint8_t* img = train.images.data_ptr<uint8_t>() + i * 3072;
    EXPECT_EQ(img[0], testing::cifar_pixel(i, 0, 0, 0));
    EXPECT_EQ(img[1024 + 32 * 7 + 3], testing::cifar_pixel(i, 1, 7, 3));
    EXPECT_EQ(img[2048 + 32 * 31 + 31], testing::cifar_pixel(i, 2, 31, 31));
  }
  EXPECT_EQ(test.labels.data_ptr<int64_t>()[0], 1000 % 10);
}

TEST(Cifar10Loader, AcceptsGzippedBatches) {
  TempDir dir;
  testing::write_cifar_dir(dir.path(), 2, 2);
  std::remove(dir.file("test_batch.bin").c_str());
  testing::write_bytes(dir.file("test_batch.bin.gz"), testing::cifar_batch_bytes(2, 1000), true);
  EXPECT_EQ(load_cifar10(dir.path(), Split::kTest).size(), 2);
}

TEST(Cifar10LoaderErrors, MissingBatchFile) {
  TempDir dir;
  testing::write_cifar_dir(dir.path(), 2, 2);
  std::remove(dir.file("data_batch_4.bin").c_str());
  std::string file;
  const std::string what = data_error_of([&] { load_cifar10(dir.path(), Split::kTrain); }, &file);
  EXPECT_EQ(file, dir.file("data_batch_4.bin"));
  EXPECT_NE(what.find("cifar-10-batches-bin"), std::string::npos) << what;
}

TEST(Cifar10LoaderErrors, PartialRecord) {
  TempDir dir;
  testing::write_cifar_dir(dir.path(), 2, 2);
  auto bytes = testing::cifar_batch_bytes(2, 0);
  bytes.resize(bytes.size() - 100);
  testing::write_bytes(dir.file("data_batch_2.bin"), bytes);
  std::string file;
  const std::string what = data_error_of([&] { load_cifar10(dir.path(), Split::kTrain); }, &file);
  EXPECT_EQ(file, dir.file("data_batch_2.bin"));
  EXPECT_NE(what.find("size 6046 bytes is not a whole number of 3073-byte records"),
            std::string::npos)
      << what;
}

TEST(Cifar10LoaderErrors, LabelOutsideTheClassList) {
  TempDir dir;
  testing::write_cifar_dir(dir.path(), 2, 3);
  auto bytes = testing::cifar_batch_bytes(3, 0);
  bytes[2 * kCifarRecordBytes] = 10;
  testing::write_bytes(dir.file("test_batch.bin"), bytes);
  const std::string what = data_error_of([&] { load_cifar10(dir.path(), Split::kTest); });
  EXPECT_NE(what.find("record 2 has label 10, expected 0..9"), std::string::npos) << what;
}

TEST(Cifar10LoaderErrors, MissingOrEmptyClassNames) {
  TempDir dir;
  testing::write_cifar_dir(dir.path(), 1, 1);
  { std::ofstream(dir.file("batches.meta.txt"), std::ios::trunc) << "\n\n"; }
  EXPECT_NE(data_error_of([&] { load_cifar10(dir.path(), Split::kTest); }).find("no class names"),
            std::string::npos);
  std::remove(dir.file("batches.meta.txt").c_str());
  std::string file;
  data_error_of([&] { load_cifar10(dir.path(), Split::kTest); }, &file);
  EXPECT_EQ(file, dir.file("batches.meta.txt"));
}

TEST(Cifar10LoaderErrors, EmptyBatchFile) {
  TempDir dir;
  testing::write_cifar_dir(dir.path(), 1, 1);
  testing::write_bytes(dir.file("test_batch.bin"), {});
  EXPECT_NE(data_error_of([&] { load_cifar10(dir.path(), Split::kTest); }).find("size 0 bytes"),
            std::string::npos);
}

}  // namespace
}  // namespace ddp::data
