#pragma once
// MNIST-format datasets: MNIST digits and Fashion-MNIST, as four IDX files (raw or .gz) in one
// directory: train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
// t10k-labels-idx1-ubyte.
#include <string>
#include <vector>

#include "ddp/data/image_dataset.h"

namespace ddp::data {

// Where Debian's dataset-fashion-mnist package installs Fashion-MNIST.
inline constexpr const char* kDebianFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Training-set pixel statistics (of pixel / 255), for normalisation.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;
inline constexpr float kMnistMean = 0.1307f;
inline constexpr float kMnistStd = 0.3081f;

// "T-shirt/top", "Trouser", ... "Ankle boot".
const std::vector<std::string>& fashion_mnist_class_names();
// "0" ... "9".
const std::vector<std::string>& mnist_digit_class_names();

// Loads one split; images come back as uint8 [N, 1, 28, 28]. Throws DataError naming the file
// when one is missing or malformed, when image and label counts differ, or a label is out of
// range for `class_names`.
ImageDataset load_mnist(const std::string& dir, Split split,
                        const std::vector<std::string>& class_names = mnist_digit_class_names());
ImageDataset load_fashion_mnist(const std::string& dir, Split split);

}  // namespace ddp::data
