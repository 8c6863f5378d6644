#pragma once
// Reads /proc/<pid>/stat without exceptions. A process may exit while its stat file is read;
// the read then fails with ESRCH, and libstdc++'s filebuf turns that into an exception that a
// liveness check must never throw (it runs while a collective is failing over a dead peer).
#include <sys/types.h>

#include <optional>
#include <string>

namespace ddp::detail::fabric {

struct ProcStat {
  char state = '?';                   // field 3: R, S, D, Z (zombie), X (dead), ...
  unsigned long flags = 0;            // field 9: the kernel's PF_* flags
  unsigned long long start_time = 0;  // field 22, in clock ticks since boot
};

// nullopt when the file cannot be read or parsed (no such process, no /proc, a short read).
// `gone` (if given) is set when the reason is that the process no longer exists.
std::optional<ProcStat> read_proc_stat(pid_t pid, bool* gone = nullptr);

}  // namespace ddp::detail::fabric
