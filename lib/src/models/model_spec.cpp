#include "ddp/models/model_spec.h"

#include <mutex>

#include <ATen/CPUGeneratorImpl.h>

#include "ddp/error.h"
#include "ddp/models/cifar_cnn.h"
#include "ddp/models/mnist_cnn.h"
#include "ddp/models/resnet.h"
#include "models/activation_kernels.h"

namespace ddp::models {

std::vector<std::string> model_names() {
  return {"mnist_cnn", "cifar_cnn", "resnet8", "resnet20", "resnet32", "resnet56"};
}

std::shared_ptr<Classifier> create_model(const ModelSpec& spec, uint64_t seed) {
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  (void)detail::activation_kernels();  // a bad DDP_ISA is a ConfigError here, not mid-step
  if (spec.in_channels < 1 || spec.num_classes < 1) {
    throw ConfigError("model '" + spec.name + "' needs at least one input channel and one class");
  }
  if (spec.name == "mnist_cnn") return std::make_shared<MnistCnn>(spec);
  if (spec.name == "cifar_cnn") return std::make_shared<CifarCnn>(spec);
  if (spec.name.rfind("resnet", 0) == 0 && spec.name.size() > 6 &&
      spec.name.find_first_not_of("0123456789", 6) == std::string::npos) {
    return std::make_shared<ResNet>(spec, std::stoi(spec.name.substr(6)));
  }
  std::string known;
  for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError("unknown model '" + spec.name + "'; choose one of " + known);
}

}  // namespace ddp::models
