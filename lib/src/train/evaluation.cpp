#include "ddp/train/evaluation.h"

#include <cstdio>

#include <ATen/ops/argmax.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <c10/core/GradMode.h>

#include "ddp/comm/communicator.h"
#include "ddp/error.h"
#include "ddp/models/classifier.h"
#include "train/autocast_scope.h"
#include "train/bf16_support.h"

namespace ddp::train {

int64_t EvalResult::correct_count() const {
  int64_t n = 0;
  for (int64_t c : correct) n += c;
  return n;
}

int64_t EvalResult::count() const {
  int64_t n = 0;
  for (int64_t t : total) n += t;
  return n;
}

double EvalResult::accuracy() const {
  const int64_t n = count();
  return n == 0 ? 0.0 : static_cast<double>(correct_count()) / static_cast<double>(n);
}

double EvalResult::mean_loss() const {
  const int64_t n = count();
  return n == 0 ? 0.0 : loss_sum / static_cast<double>(n);
}

EvalResult evaluate(models::Classifier& model, const data::ImageDataset& data,
                    const EvalOptions& options, Communicator* comm) {
  if (options.batch_size < 1) throw ConfigError("evaluation batch size must be at least 1");
  const int rank = comm ? comm->rank() : 0;
  const int world = comm ? comm->size() : 1;
  const int64_t classes = data.num_classes();
  EvalResult result;
  result.correct.assign(classes, 0);
  result.total.assign(classes, 0);

  data::TransformOptions transform = options.transform;
  transform.random_crop_flip = false;
  const data::BatchTransform make_batch(data.channels(), transform);
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < data.size(); i += world) mine.push_back(i);

  const bool was_training = model.is_training();
  model.eval();
  const bool bf16 = detail::bf16_autocast_enabled(options.bf16);
  {
    c10::AutoGradMode no_grad(false);
    for (std::size_t first = 0; first < mine.size();
         first += static_cast<std::size_t>(options.batch_size)) {
      const auto count =
          static_cast<int64_t>(std::min<std::size_t>(options.batch_size, mine.size() - first));
      data::Batch batch = make_batch(data, mine.data() + first, count, 0);
      at::Tensor logits;
      {
        detail::AutocastScope autocast(bf16);
        logits = model.forward(batch.images);
      }
      logits = logits.to(at::kFloat);
      result.loss_sum +=
          at::cross_entropy_loss(logits, batch.labels, {}, at::Reduction::Sum).item<double>();
      const at::Tensor predicted = logits.argmax(1);
      const int64_t* p = predicted.data_ptr<int64_t>();
      const int64_t* y = batch.labels.data_ptr<int64_t>();
      for (int64_t k = 0; k < count; ++k) {
        ++result.total[y[k]];
        result.correct[y[k]] += p[k] == y[k];
      }
    }
  }
  model.train(was_training);

  if (comm) {
    std::vector<int64_t> counts(result.correct);
    counts.insert(counts.end(), result.total.begin(), result.total.end());
    comm->allreduce(counts, ReduceOp::kSum);
    std::vector<double> loss{result.loss_sum};
    comm->allreduce(loss, ReduceOp::kSum);
    std::copy(counts.begin(), counts.begin() + classes, result.correct.begin());
    std::copy(counts.begin() + classes, counts.end(), result.total.begin());
    result.loss_sum = loss[0];
  }
  return result;
}

std::string format_accuracy_table(const EvalResult& result,
                                  const std::vector<std::string>& class_names) {
  std::size_t width = 7;  // "overall"
  for (const auto& name : class_names) width = std::max(width, name.size());
  std::string table;
  char line[256];
  std::snprintf(line, sizeof line, "%-*s %9s %9s %9s\n", static_cast<int>(width), "class",
                "correct", "total", "accuracy");
  table += line;
  auto row = [&](const std::string& name, int64_t correct, int64_t total) {
    const double acc =
        total ? 100.0 * static_cast<double>(correct) / static_cast<double>(total) : 0;
    std::snprintf(line, sizeof line, "%-*s %9lld %9lld %8.2f%%\n", static_cast<int>(width),
                  name.c_str(), static_cast<long long>(correct), static_cast<long long>(total),
                  acc);
    table += line;
  };
  for (std::size_t c = 0; c < result.total.size(); ++c) {
    row(c < class_names.size() ? class_names[c] : std::to_string(c), result.correct[c],
        result.total[c]);
  }
  row("overall", result.correct_count(), result.count());
  return table;
}

}  // namespace ddp::train
