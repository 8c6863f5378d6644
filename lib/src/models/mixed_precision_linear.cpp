#include "models/mixed_precision_linear.h"

#include <ATen/ExpandUtils.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/functional/linear.h>

#include "models/activation_kernels.h"

namespace ddp::models::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool autocasting_to_bfloat16(const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& bias) {
  return at::autocast::is_cpu_enabled() &&
         at::autocast::get_autocast_cpu_dtype() == at::kBFloat16 && x.device().is_cpu() &&
         x.dim() == 2 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
         weight.device().is_cpu() && weight.scalar_type() == at::kFloat && weight.dim() == 2 &&
         weight.is_contiguous() && bias.defined() && bias.scalar_type() == at::kFloat &&
         bias.dim() == 1 && bias.size(0) == weight.size(0);
}

at::Tensor to_bfloat16(const at::Tensor& t) {
  at::Tensor out = at::empty(t.sizes(), t.options().dtype(at::kBFloat16));
  activation_kernels().to_bfloat16(t.data_ptr<float>(), reinterpret_cast<uint16_t*>(out.data_ptr()),
                                   t.numel());
  return out;
}

at::Tensor to_float32(const at::Tensor& t) {
  const at::Tensor in = t.contiguous();
  at::Tensor out = at::empty(in.sizes(), in.options().dtype(at::kFloat));
  activation_kernels().to_float32(reinterpret_cast<const uint16_t*>(in.data_ptr()),
                                  out.data_ptr<float>(), in.numel());
  return out;
}

// The operations autocast's linear performs (cast, then addmm(bias, x, weight.t())) and the
// ones their backward formulas perform, in the same order, so every bit agrees.
struct Bfloat16Linear : torch::autograd::Function<Bfloat16Linear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    const at::Tensor x16 = x.to(at::kBFloat16);
    const at::Tensor w16 = to_bfloat16(weight);
    at::Tensor out = at::addmm(bias.to(at::kBFloat16), x16, w16.t());
    ctx->save_for_backward({x16, w16});
    ctx->saved_data["x_is_float"] = x.scalar_type() == at::kFloat;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x16 = saved[0];
    const at::Tensor& w16 = saved[1];
    const at::Tensor& grad = grads[0];
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) {
      grad_x = grad.mm(w16);
      if (ctx->saved_data["x_is_float"].toBool()) grad_x = grad_x.to(at::kFloat);
    }
    if (ctx->needs_input_grad(1)) grad_w = to_float32(grad.t().mm(x16));
    if (ctx->needs_input_grad(2)) grad_b = at::sum_to(grad, w16.sizes().slice(0, 1)).to(at::kFloat);
    return {grad_x, grad_w, grad_b};
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!autocasting_to_bfloat16(x, weight, bias)) {
    return torch::nn::functional::linear(x, weight, bias);
  }
  return Bfloat16Linear::apply(x, weight, bias);
}

}  // namespace ddp::models::detail
