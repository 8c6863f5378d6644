#pragma once
// CIFAR-10, binary version (cifar-10-batches-bin): data_batch_1.bin ... data_batch_5.bin and
// test_batch.bin, each a sequence of 3073-byte records (label byte, then 32x32 red, green, blue
// planes), and batches.meta.txt with one class name per line.
#include <string>

#include "ddp/data/image_dataset.h"

namespace ddp::data {

inline constexpr int64_t kCifarRecordBytes = 1 + 3 * 32 * 32;

// Training-set per-channel (R, G, B) statistics of pixel / 255, for normalisation.
inline constexpr float kCifar10Mean[3] = {0.4914f, 0.4822f, 0.4465f};
inline constexpr float kCifar10Std[3] = {0.2470f, 0.2435f, 0.2616f};

// Loads one split; images come back as uint8 [N, 3, 32, 32]. The .bin files may be gzipped.
// Throws DataError naming the file for a missing file, a size that is not a whole number of
// records, a label outside the class list, or a missing or empty batches.meta.txt.
ImageDataset load_cifar10(const std::string& dir, Split split);

}  // namespace ddp::data
