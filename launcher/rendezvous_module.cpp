#include "rendezvous_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <string>
#include <vector>

#include "ddp/error.h"

namespace ddprun {
namespace {

// Next to the executable in the build tree; DDPRUN_MODULE_DIR (relative to it) when installed.
std::vector<std::string> module_candidates() {
  char exe[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  std::string dir = n > 0 ? std::string(exe, static_cast<std::size_t>(n)) : std::string();
  dir = dir.substr(0, dir.rfind('/') + 1);
  return {dir + "ddprun_rendezvous.so", dir + DDPRUN_MODULE_DIR "/ddprun_rendezvous.so"};
}

}  // namespace

RendezvousModule::RendezvousModule() {
  factory_ = std::async(std::launch::async, []() -> Factory {
    std::string errors;
    for (const auto& path : module_candidates()) {
      if (access(path.c_str(), R_OK) != 0) continue;
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        errors += std::string(" ") + dlerror();
        continue;
      }
      // Never unloaded: libtorch does not support being unloaded.
      if (void* symbol = dlsym(handle, "ddprun_create_rendezvous")) {
        return reinterpret_cast<Factory>(symbol);
      }
      errors += " " + path + " has no ddprun_create_rendezvous";
    }
    throw ddp::Error(
        "cannot load ddprun's rendezvous module (looked next to the executable and "
        "in " DDPRUN_MODULE_DIR ")" +
        errors + "; reinstall ddprun");
  });
}

RendezvousModule::~RendezvousModule() {
  if (factory_.valid()) factory_.wait();
}

std::unique_ptr<Rendezvous> RendezvousModule::create(const LaunchConfig& config,
                                                     const HostFacts& host,
                                                     std::function<void()> poll_interrupt) {
  Factory factory = factory_.get();
  return std::unique_ptr<Rendezvous>(factory(config, host, std::move(poll_interrupt)));
}

}  // namespace ddprun
