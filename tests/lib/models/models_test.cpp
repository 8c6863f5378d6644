// The models: fused activation kernels against ATen's composite ops (values and gradients, both
// layouts, float32 and bfloat16), output shapes and parameter counts, and that they learn.
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "ddp/models/classifier.h"
#include "ddp/models/model_spec.h"
#include "models/fused_activations.h"
#include "models/mixed_precision_linear.h"
#include "train/bf16_support.h"

namespace ddp::models {
namespace {

namespace F = torch::nn::functional;

at::Tensor composite_pool(const at::Tensor& x) {
  return F::relu(F::max_pool2d(x, F::MaxPool2dFuncOptions(2)));
}

struct Layout {
  at::ScalarType dtype;
  at::MemoryFormat format;
};

void PrintTo(const Layout& l, std::ostream* os) {
  *os << c10::toString(l.dtype) << ", " << l.format;
}

class FusedPool : public ::testing::TestWithParam<Layout> {};

TEST_P(FusedPool, EqualsMaxPoolThenReluWithoutDropout) {
  torch::manual_seed(3);
  // The last shape is wide enough for the kernels' vector loops in both layouts.
  for (auto shape : {std::vector<int64_t>{4, 3, 8, 10}, std::vector<int64_t>{2, 5, 7, 9},
                     std::vector<int64_t>{2, 37, 6, 38}}) {
    at::Tensor base = torch::randn(shape).to(GetParam().dtype).contiguous(GetParam().format);
    at::Tensor a = base.detach().clone(GetParam().format).requires_grad_(true);
    at::Tensor b = base.detach().clone(GetParam().format).requires_grad_(true);
    at::Tensor ya = detail::max_pool2x2_relu_dropout(a, 0.5, /*training=*/false);
    at::Tensor yb = composite_pool(b);
    ASSERT_TRUE(torch::equal(ya, yb));
    at::Tensor g = torch::randn(ya.sizes()).to(GetParam().dtype);
    ya.backward(g);
    yb.backward(g);
    EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
  }
}

TEST_P(FusedPool, DropoutKeepsScaledValuesAndRoutesGradients) {
  torch::manual_seed(5);
  at::Tensor base =
      torch::randn({8, 16, 12, 12}).to(GetParam().dtype).contiguous(GetParam().format);
  at::Tensor x = base.detach().clone(GetParam().format).requires_grad_(true);
  const double p = 0.25;
  at::Tensor y = detail::max_pool2x2_relu_dropout(x, p, /*training=*/true);
  at::Tensor reference = composite_pool(base.to(at::kFloat));
  at::Tensor yf = y.to(at::kFloat);
  at::Tensor kept = (yf != 0);
  at::Tensor positive = (reference > 0);
  // Kept elements are the composite's value / (1 - p); dropped ones are zero.
  EXPECT_TRUE(torch::allclose(yf.masked_select(kept), (reference / (1 - p)).masked_select(kept),
                              1e-2, 1e-6));
  const double keep_rate = kept.sum().item<double>() / positive.sum().item<double>();
  EXPECT_NEAR(keep_rate, 1 - p, 0.03);
  // Gradient: scale at kept maxima, zero elsewhere; the total equals grad_out over kept outputs.
  y.backward(torch::ones_like(y));
  const double total = x.grad().to(at::kFloat).sum().item<double>();
  // bfloat16 rounds the scale 4/3 to 1.3359.
  const double tolerance = GetParam().dtype == at::kBFloat16 ? 3e-3 : 1e-4;
  EXPECT_NEAR(total, kept.sum().item<double>() / (1 - p), tolerance * total);
}

TEST_P(FusedPool, KeptValuesAreRoundedExactlyAsATenRoundsThem) {
  torch::manual_seed(11);
  at::Tensor x = torch::randn({3, 37, 10, 38}).to(GetParam().dtype).contiguous(GetParam().format);
  const double p = 0.25;
  at::Tensor y = detail::max_pool2x2_relu_dropout(x, p, /*training=*/true);
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  // The composite in the tensor's own dtype, scaled in float and rounded back by ATen.
  at::Tensor expected = (composite_pool(x).to(at::kFloat) * scale).to(GetParam().dtype);
  at::Tensor kept = y != 0;
  ASSERT_GT(kept.sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::equal(y.masked_select(kept), expected.masked_select(kept)));
}

INSTANTIATE_TEST_SUITE_P(Layouts, FusedPool,
                         ::testing::Values(Layout{at::kFloat, at::MemoryFormat::Contiguous},
                                           Layout{at::kFloat, at::MemoryFormat::ChannelsLast},
                                           Layout{at::kBFloat16, at::MemoryFormat::Contiguous},
                                           Layout{at::kBFloat16, at::MemoryFormat::ChannelsLast}));

TEST(FusedActivations, ReluDropoutMatchesReluInEvalAndScalesInTraining) {
  torch::manual_seed(7);
  at::Tensor base = torch::randn({64, 128});
  at::Tensor a = base.clone().requires_grad_(true);
  at::Tensor ya = detail::relu_dropout(a, 0.5, false);
  EXPECT_TRUE(torch::equal(ya, F::relu(base)));
  at::Tensor t = detail::relu_dropout(a, 0.5, true);
  at::Tensor kept = t != 0;
  EXPECT_TRUE(torch::equal(t.masked_select(kept), (F::relu(base) * 2).masked_select(kept)));
  EXPECT_NEAR(kept.sum().item<double>() / (base > 0).sum().item<double>(), 0.5, 0.05);
  t.sum().backward();
  EXPECT_TRUE(torch::equal(a.grad(), kept.to(at::kFloat) * 2));
}

TEST(FusedActivations, MasksFollowTorchManualSeed) {
  at::Tensor x = torch::ones({4, 8, 6, 6});
  torch::manual_seed(11);
  at::Tensor first = detail::max_pool2x2_relu_dropout(x, 0.5, true);
  at::Tensor second = detail::max_pool2x2_relu_dropout(x, 0.5, true);
  torch::manual_seed(11);
  at::Tensor again = detail::max_pool2x2_relu_dropout(x, 0.5, true);
  EXPECT_TRUE(torch::equal(first, again));
  EXPECT_FALSE(torch::equal(first, second));
}

TEST(FusedActivations, PropagatesNaNLikeATen) {
  at::Tensor x = torch::full({1, 1, 2, 2}, -1.0);
  x[0][0][1][0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(torch::isnan(detail::max_pool2x2_relu_dropout(x, 0.0, false)).all().item<bool>());
  EXPECT_TRUE(torch::isnan(composite_pool(x)).all().item<bool>());
}

// Under CPU autocast to bfloat16 (and without it), detail::linear gives torch::linear's output
// and gradients bit for bit: the same bfloat16 product, only the casts run in other loops.
struct LinearCase {
  at::ScalarType input_dtype;
  bool autocast;
  bool input_needs_grad;
  int64_t bias_size;  // 23 (one per output), or 1 (broadcast; ours leaves that to torch)
  bool takes_fast_path;
};

void expect_linear_matches_torch(const LinearCase& c) {
  SCOPED_TRACE(std::string(c10::toString(c.input_dtype)) + (c.autocast ? " autocast" : "") +
               (c.input_needs_grad ? " x.grad" : "") + " bias " + std::to_string(c.bias_size));
  torch::manual_seed(5);
  const at::Tensor x0 = torch::randn({9, 37}).to(c.input_dtype);
  const at::Tensor w0 = torch::randn({23, 37}), b0 = torch::randn({c.bias_size});
  at::Tensor grad;
  at::Tensor outputs[2], grads[2][3];
  for (int ours = 0; ours < 2; ++ours) {
    at::Tensor x = x0.clone().requires_grad_(c.input_needs_grad),
               w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    at::autocast::set_cpu_enabled(c.autocast);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    outputs[ours] = ours ? detail::linear(x, w, b) : F::linear(x, w, b);
    at::autocast::set_cpu_enabled(false);
    at::autocast::clear_cache();
    if (ours) {
      const bool fast = outputs[ours].grad_fn()->name().find("Bfloat16Linear") != std::string::npos;
      EXPECT_EQ(fast, c.takes_fast_path) << outputs[ours].grad_fn()->name();
    }
    if (!grad.defined()) grad = torch::randn(outputs[ours].sizes()).to(outputs[ours].dtype());
    outputs[ours].backward(grad);
    grads[ours][0] = x.grad(), grads[ours][1] = w.grad(), grads[ours][2] = b.grad();
  }
  EXPECT_EQ(outputs[0].scalar_type(), outputs[1].scalar_type());
  EXPECT_TRUE(torch::equal(outputs[0], outputs[1]));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(grads[0][i].defined(), grads[1][i].defined()) << "gradient " << i;
    if (!grads[0][i].defined()) continue;
    EXPECT_EQ(grads[0][i].scalar_type(), grads[1][i].scalar_type()) << "gradient " << i;
    EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i])) << "gradient " << i;
  }
}

TEST(MixedPrecisionLinear, EqualsTorchLinearBitForBit) {
  expect_linear_matches_torch({at::kFloat, false, true, 23, false});
  // The autocast cases (the second field) multiply in bfloat16. Where this libtorch cannot
  // (Debian's arm64 torch on a CPU with BF16: train/bf16_support.h), torch's own linear, the
  // reference, throws, and the trainer never turns bf16 autocast on: that is what holds there.
  if (!ddp::train::detail::torch_multiplies_bf16()) {
    EXPECT_FALSE(ddp::train::detail::bf16_autocast_enabled(true));
    return;
  }
  expect_linear_matches_torch({at::kFloat, true, true, 1, false});
  expect_linear_matches_torch({at::kFloat, true, true, 23, true});
  expect_linear_matches_torch({at::kBFloat16, true, true, 23, true});
  expect_linear_matches_torch({at::kBFloat16, true, false, 23, true});
}

int64_t parameter_count(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

TEST(Models, MnistCnnHasTheClassicArchitecture) {
  auto model = create_model({"mnist_cnn", 1, 28, 28, 10});
  // conv1 320 + conv2 18,496 + fc1 1,179,776 + fc2 1,290, as PyTorch's MNIST example.
  EXPECT_EQ(parameter_count(*model), 1199882);
  EXPECT_EQ(model->forward(torch::randn({5, 1, 28, 28})).sizes(), at::IntArrayRef({5, 10}));
  EXPECT_EQ(model->spec().name, "mnist_cnn");
}

TEST(Models, CifarModelsGiveLogitsPerClass) {
  for (const std::string name : {"cifar_cnn", "resnet8", "resnet20"}) {
    auto model = create_model({name, 3, 32, 32, 10});
    model->eval();
    EXPECT_EQ(model->forward(torch::randn({2, 3, 32, 32})).sizes(), at::IntArrayRef({2, 10}))
        << name;
  }
  // ResNet-20 with projection shortcuts: 0.27 M parameters.
  const int64_t n = parameter_count(*create_model({"resnet20", 3, 32, 32, 10}));
  EXPECT_GT(n, 270000);
  EXPECT_LT(n, 280000);
}

TEST(Models, RejectUnknownNamesAndImpossibleShapes) {
  try {
    create_model({"vgg16", 3, 32, 32, 10});
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("mnist_cnn, cifar_cnn"), std::string::npos);
  }
  EXPECT_THROW(create_model({"resnet21", 3, 32, 32, 10}), ConfigError);
  EXPECT_THROW(create_model({"mnist_cnn", 1, 4, 4, 10}), ConfigError);
}

TEST(Models, EveryModelLearnsAFixedBatch) {
  for (const std::string name : {"mnist_cnn", "cifar_cnn", "resnet8"}) {
    torch::manual_seed(0);
    const bool rgb = name != "mnist_cnn";
    auto model = create_model({name, rgb ? 3 : 1, rgb ? 32 : 28, rgb ? 32 : 28, 10});
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
    at::Tensor x = torch::randn({10, rgb ? 3 : 1, rgb ? 32 : 28, rgb ? 32 : 28});
    at::Tensor y = torch::arange(10);
    std::vector<double> losses;
    for (int step = 0; step < 30; ++step) {
      opt.zero_grad();
      at::Tensor loss = F::cross_entropy(model->forward(x), y);
      loss.backward();
      opt.step();
      losses.push_back(loss.item<double>());
    }
    const double last = (losses[27] + losses[28] + losses[29]) / 3;
    EXPECT_LT(last, 0.5 * losses[0]) << name << ": from " << losses[0] << " to " << last;
  }
}

}  // namespace
}  // namespace ddp::models
