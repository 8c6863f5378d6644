#include "comm/fabric/cross_memory_attach.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "ddp/env_vars.h"

namespace ddp::detail::fabric {
namespace {

constexpr std::uint64_t kProbeValue = 0x64647072756e434dULL;  // "ddprunCM"
// volatile: the word must stay in memory at its address, not be folded into the reader.
const volatile std::uint64_t probe_word = kProbeValue;

}  // namespace

std::uintptr_t cma_probe_address() {
  return reinterpret_cast<std::uintptr_t>(const_cast<const std::uint64_t*>(&probe_word));
}

std::string cma_denied(pid_t pid, std::uintptr_t address) {
  std::uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(address), sizeof(value)};
  const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (got < 0) return std::string("process_vm_readv: ") + std::strerror(errno);
  if (got != static_cast<ssize_t>(sizeof(value)) || value != kProbeValue) {
    return "process_vm_readv read something else than the probe word";
  }
  return "";
}

std::string cma_disabled_by_environment() {
  return env::get_bool("FI_SHM_DISABLE_CMA").value_or(false) ? "FI_SHM_DISABLE_CMA is set" : "";
}

}  // namespace ddp::detail::fabric
