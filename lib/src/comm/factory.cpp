#include "ddp/comm/factory.h"

#include <algorithm>

#include "comm/gloo/gloo_communicator.h"
#include "ddp/error.h"
#include "ddp/settings.h"
#include "ddp/store.h"
#ifdef DDP_WITH_FABRIC
#include "comm/fabric_module.h"
#endif

namespace ddp {

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"gloo"};
#ifdef DDP_WITH_FABRIC
  names.emplace_back("fabric");
#endif
  return names;
}

namespace {

std::string joined_backends() {
  std::string text;
  for (const auto& name : available_backends()) text += (text.empty() ? "" : ", ") + name;
  return text;
}

void require_available(const std::string& backend, const char* origin) {
  const auto names = available_backends();
  if (std::find(names.begin(), names.end(), backend) == names.end()) {
    throw ConfigError(std::string(origin) + "='" + backend +
                      "' is not a backend of this build; choose one of: " + joined_backends());
  }
}

}  // namespace

std::string backend_from_env() {
  const std::string backend = settings::spelling_or_default(settings::kBackend);
  require_available(backend, "DDP_BACKEND");
  return backend;
}

std::unique_ptr<Communicator> create_communicator(const std::string& backend,
                                                  std::shared_ptr<Store> store, int rank, int size,
                                                  const CommOptions& options) {
  require_available(backend, "backend");
  // Each backend keeps its rendezvous keys apart, so several can share one store.
  auto scoped = store->with_prefix(backend);
  if (backend == "gloo") {
    return std::make_unique<detail::GlooCommunicator>(scoped, rank, size, options);
  }
#ifdef DDP_WITH_FABRIC
  if (backend == "fabric") {
    return detail::create_fabric_communicator(scoped, rank, size, options);
  }
#endif
  throw ConfigError("backend '" + backend + "' is not available");
}

}  // namespace ddp
