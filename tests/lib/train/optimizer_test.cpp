// Unit test of lib/src/train/optimizer.cpp: make_optimizer builds SGD (momentum, Nesterov,
// weight decay) and Adam (betas, eps, weight decay) from their options, checked step by step
// against the update rules computed here; it rejects bad values with ConfigError; and
// set_learning_rate reaches every parameter group.
#include "ddp/train/optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ddp/error.h"

namespace ddp::train {
namespace {

// A float64 parameter holding `values`, with no gradient yet.
at::Tensor parameter(std::vector<double> values) {
  return at::tensor(values, at::kDouble).requires_grad_();
}

// Sets p's gradient to `g` and takes one optimizer step.
void step_with(torch::optim::Optimizer& optimizer, at::Tensor& p, std::vector<double> g) {
  p.mutable_grad() = at::tensor(g, at::kDouble);
  optimizer.step();
}

void expect_values(const at::Tensor& p, const std::vector<double>& expected, double tolerance) {
  ASSERT_EQ(p.numel(), static_cast<int64_t>(expected.size()));
  const at::Tensor values = p.detach().contiguous();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(values.data_ptr<double>()[i], expected[i], tolerance) << "element " << i;
  }
}

TEST(MakeOptimizer, SgdWithMomentum) {
  at::Tensor p = parameter({1.0, -2.0});
  OptimizerOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  auto optimizer = make_optimizer({p}, o);
  ASSERT_NE(dynamic_cast<torch::optim::SGD*>(optimizer.get()), nullptr);
  // Step 1: buffer = g = (0.5, 1); p -= 0.1 buffer.
  step_with(*optimizer, p, {0.5, 1.0});
  expect_values(p, {0.95, -2.1}, 1e-12);
  // Step 2: buffer = 0.9 (0.5, 1) + (0.5, 1) = (0.95, 1.9).
  step_with(*optimizer, p, {0.5, 1.0});
  expect_values(p, {0.95 - 0.095, -2.1 - 0.19}, 1e-12);
}

TEST(MakeOptimizer, NesterovSgdLooksAhead) {
  at::Tensor p = parameter({1.0});
  OptimizerOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = true;
  auto optimizer = make_optimizer({p}, o);
  // buffer = g = 0.5; the step uses g + 0.9 buffer = 0.95.
  step_with(*optimizer, p, {0.5});
  expect_values(p, {1.0 - 0.095}, 1e-12);
}

TEST(MakeOptimizer, SgdWeightDecayAddsTheParameterToTheGradient) {
  at::Tensor p = parameter({2.0});
  OptimizerOptions o;
  o.lr = 0.1;
  o.momentum = 0.0;
  o.weight_decay = 0.25;
  auto optimizer = make_optimizer({p}, o);
  // g + 0.25 p = 0.5 + 0.5 = 1.
  step_with(*optimizer, p, {0.5});
  expect_values(p, {1.9}, 1e-12);
}

TEST(MakeOptimizer, AdamFollowsItsBiasCorrectedUpdate) {
  at::Tensor p = parameter({1.0, -3.0});
  OptimizerOptions o;
  o.name = "adam";
  o.lr = 0.01;
  o.beta1 = 0.5;
  o.beta2 = 0.75;
  o.eps = 0.1;  // large enough to matter
  o.weight_decay = 0.2;
  auto optimizer = make_optimizer({p}, o);
  ASSERT_NE(dynamic_cast<torch::optim::Adam*>(optimizer.get()), nullptr);

  // The reference: L2 weight decay into the gradient, then Adam with bias correction.
  std::vector<double> x{1.0, -3.0}, m{0, 0}, v{0, 0};
  const std::vector<std::vector<double>> grads{{0.5, -1.0}, {-0.25, 2.0}, {1.5, 0.0}};
  for (std::size_t t = 1; t <= grads.size(); ++t) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double g = grads[t - 1][i] + 0.2 * x[i];
      m[i] = 0.5 * m[i] + 0.5 * g;
      v[i] = 0.75 * v[i] + 0.25 * g * g;
      const double m_hat = m[i] / (1 - std::pow(0.5, t));
      const double v_hat = v[i] / (1 - std::pow(0.75, t));
      x[i] -= 0.01 * m_hat / (std::sqrt(v_hat) + 0.1);
    }
    step_with(*optimizer, p, grads[t - 1]);
    SCOPED_TRACE("step " + std::to_string(t));
    expect_values(p, x, 1e-12);
  }
}

TEST(MakeOptimizer, RejectsBadOptionsWithConfigError) {
  const at::Tensor p = parameter({1.0});
  const auto error_of = [&](const OptimizerOptions& o) -> std::string {
    try {
      make_optimizer({p}, o);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  OptimizerOptions o;
  o.name = "rmsprop";
  EXPECT_EQ(error_of(o), "unknown optimizer 'rmsprop'; choose sgd or adam");
  o = {};
  o.lr = 0;
  EXPECT_EQ(error_of(o), "learning rate must be positive, got 0.000000");
  o.lr = std::nan("");
  EXPECT_NE(error_of(o), "") << "a NaN learning rate";
  o = {};
  o.weight_decay = -0.1;
  EXPECT_EQ(error_of(o), "weight decay must not be negative");
  o = {};
  o.momentum = 1.0;
  EXPECT_EQ(error_of(o), "SGD momentum must be in [0, 1)");
  o.momentum = -0.1;
  EXPECT_EQ(error_of(o), "SGD momentum must be in [0, 1)");
  o.momentum = 0.0;
  o.nesterov = true;
  EXPECT_EQ(error_of(o), "Nesterov SGD needs a momentum > 0");
  // Adam ignores the SGD-only settings.
  o.name = "adam";
  EXPECT_EQ(error_of(o), "");
  // A zero learning rate is refused by name for Adam too.
  o.lr = 0;
  EXPECT_EQ(error_of(o), "learning rate must be positive, got 0.000000");
  // Adam's own options, refused before torch::optim would throw its own error type.
  o.lr = 0.1;
  o.beta2 = 1.0;
  EXPECT_EQ(error_of(o), "Adam betas must be in [0, 1), got (0.900000, 1.000000)");
  o.beta2 = 0.999;
  o.beta1 = -0.5;
  EXPECT_EQ(error_of(o), "Adam betas must be in [0, 1), got (-0.500000, 0.999000)");
  o.beta1 = std::nan("");
  EXPECT_EQ(error_of(o), "Adam betas must be in [0, 1), got (nan, 0.999000)");
  o.beta1 = 0.9;
  o.eps = -1e-8;
  EXPECT_EQ(error_of(o), "Adam eps must not be negative");
}

TEST(SetLearningRate, ReachesEveryParameterGroup) {
  at::Tensor a = parameter({1.0});
  at::Tensor b = parameter({1.0});
  OptimizerOptions o;
  o.lr = 0.1;
  o.momentum = 0.0;
  auto optimizer = make_optimizer({a}, o);
  optimizer->add_param_group(
      torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.5)));
  set_learning_rate(*optimizer, 0.02);
  for (auto& group : optimizer->param_groups()) EXPECT_EQ(group.options().get_lr(), 0.02);
  a.mutable_grad() = at::tensor({1.0}, at::kDouble);
  b.mutable_grad() = at::tensor({1.0}, at::kDouble);
  optimizer->step();
  expect_values(a, {0.98}, 1e-12);
  expect_values(b, {0.98}, 1e-12);
}

}  // namespace
}  // namespace ddp::train
