#pragma once
// Test-set evaluation, sharded across ranks: rank r scores samples r, r + W, r + 2W, ... (each
// exactly once, no padding) and the per-class counts are summed with one allreduce, so the
// result is the exact accuracy of the whole set, W times faster than rank 0 alone.
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/data/batch_transform.h"
#include "ddp/data/image_dataset.h"

namespace ddp {
class Communicator;
}
namespace ddp::models {
class Classifier;
}

namespace ddp::train {

struct EvalResult {
  std::vector<int64_t> correct;  // per class
  std::vector<int64_t> total;    // per class
  double loss_sum = 0;           // cross-entropy summed over all samples

  int64_t correct_count() const;
  int64_t count() const;
  double accuracy() const;  // in [0, 1]
  double mean_loss() const;
};

struct EvalOptions {
  int64_t batch_size = 128;          // see TrainerOptions::eval_batch_size
  data::TransformOptions transform;  // normalisation (augmentation is ignored)
  bool bf16 = false;                 // autocast the forward pass to bfloat16
};

// Collective when comm is given (every rank must call it); comm == nullptr scores every sample
// here. Leaves the model in the training mode it found it in.
EvalResult evaluate(models::Classifier& model, const data::ImageDataset& data,
                    const EvalOptions& options, Communicator* comm);

// A table with one row per class (name, correct, total, accuracy) and an overall row.
std::string format_accuracy_table(const EvalResult& result,
                                  const std::vector<std::string>& class_names);

}  // namespace ddp::train
