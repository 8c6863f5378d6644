#include "comm/fabric_module.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <type_traits>

#include "comm/fabric_entry_point.h"
#include "comm/signal_dispositions.h"
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::detail {
namespace {

// dlsym's result is cast to this type: it must be the type the module defines.
static_assert(std::is_same_v<FabricEntryPoint, decltype(&DDP_FABRIC_ENTRY_POINT)>,
              "FabricEntryPoint (fabric_module.h) and the module's entry point "
              "(fabric_entry_point.h) disagree");

// Next to libddp_comm itself (the build tree and an install prefix both keep them together).
std::string module_beside_libddp_comm() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&create_fabric_communicator), &info) == 0 ||
      info.dli_fname == nullptr) {
    return {};
  }
  const auto path = std::filesystem::path(info.dli_fname).parent_path() / DDP_FABRIC_MODULE_FILE;
  return std::filesystem::exists(path) ? path.string() : std::string{};
}

}  // namespace

FabricEntryPoint load_fabric_entry_point(const std::string& where) {
  void* handle = dlopen(where.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw ConfigError(
        "cannot load the fabric backend module " + where + " (" +
        (why != nullptr ? why : "unknown error") +
        "); install it next to libddp_comm (cmake --install) or set DDP_BACKEND=gloo");
  }
  auto entry = reinterpret_cast<FabricEntryPoint>(dlsym(handle, DDP_FABRIC_ENTRY_POINT_NAME));
  if (entry == nullptr) {
    throw ConfigError("the fabric backend module " + where +
                      " was built from other sources than this libddp_comm (it lacks " +
                      DDP_FABRIC_ENTRY_POINT_NAME +
                      "); rebuild or reinstall libddp_comm and libddp_fabric together");
  }
  return entry;
}

namespace {

// Runs fn(module) with the module loaded. Loading it runs library constructors, and the first
// fi_getinfo initialises every provider (PSM among them): both may install signal handlers,
// which the guard puts back, also when fn throws.
template <typename Fn>
auto with_module(Fn&& fn) {
  static std::mutex mutex;
  static FabricEntryPoint entry = nullptr;
  SignalDispositionGuard signals;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (entry == nullptr) {
      std::string where = module_beside_libddp_comm();
      if (where.empty()) where = DDP_FABRIC_MODULE_FILE;  // the loader's search path
      entry = load_fabric_entry_point(where);
    }
  }
  auto result = fn(*entry());
  const auto changed = signals.restore();
  if (!changed.empty()) {
    std::string names;
    for (const auto& n : changed) names += (names.empty() ? "" : ", ") + n;
    log::debug("libfabric's providers took over {}; restored the program's handlers", names);
  }
  return result;
}

}  // namespace

std::unique_ptr<Communicator> create_fabric_communicator(std::shared_ptr<Store> store, int rank,
                                                         int size, const CommOptions& options) {
  return with_module([&](const FabricModule& module) {
    return std::unique_ptr<Communicator>(module.create_communicator(store, rank, size, options));
  });
}

NodeTransport connect_fabric_node(Store& store, int rank, int size, const CommOptions& options,
                                  const std::string& group) {
  return with_module([&](const FabricModule& module) {
    return module.connect_node(store, rank, size, options, group);
  });
}

}  // namespace ddp::detail
