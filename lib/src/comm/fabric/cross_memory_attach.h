#pragma once
// Whether the ranks on one host can read each other's memory with cross-memory attach (CMA,
// process_vm_readv), which libfabric's shm provider uses to copy every message larger than its
// inject size. libfabric 1.17's shm does not work without it: where the kernel refuses CMA, those
// copies fail with an I/O error; where FI_SHM_DISABLE_CMA turns it off, shm copies through shared
// bounce buffers ("SAR"), which stall for good on a message that arrives before its receive is
// posted (ofiwg/libfabric#9143, fixed in 1.19), as this backend's large messages do. So the
// ranks check CMA before they choose shm, and choose tcp;ofi_rxm without it.
//
// CMA needs ptrace access between the ranks: the same user, and kernel.yama.ptrace_scope 0 or
// the SYS_PTRACE capability (ranks started by one launcher are siblings, which Yama scope 1
// refuses), and a dumpable target.
#include <sys/types.h>

#include <cstdint>
#include <string>

namespace ddp::detail::fabric {

// The address of a word with a known value in this process, which peers read to test CMA.
std::uintptr_t cma_probe_address();

// Why this process cannot read `address` (a peer's cma_probe_address) in process `pid`;
// empty when it can and reads the expected value.
std::string cma_denied(pid_t pid, std::uintptr_t address);

// Why libfabric will not use CMA whatever the kernel allows (FI_SHM_DISABLE_CMA); empty if not.
std::string cma_disabled_by_environment();

}  // namespace ddp::detail::fabric
