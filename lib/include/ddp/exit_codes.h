#pragma once
// Process exit codes shared by ddprun and the trainers it runs. They are stable: Kubernetes
// podFailurePolicy rules key on them (see the "Exit codes" table of launcher/README.md). They
// follow sysexits(3) where one fits.
#include <exception>

namespace ddp::exit_code {

constexpr int kSuccess = 0;
constexpr int kFailure = 1;      // any other failure (a worker's own code passes through)
constexpr int kConfig = 64;      // EX_USAGE: bad flag, environment variable or option
constexpr int kData = 65;        // EX_DATAERR: dataset or checkpoint missing or corrupt
constexpr int kRendezvous = 69;  // EX_UNAVAILABLE: store/peers unreachable, join timed out
constexpr int kComm = 70;        // EX_SOFTWARE: a collective failed (peer died, timeout)
constexpr int kPreempted = 75;  // EX_TEMPFAIL: stopped by SIGTERM after a checkpoint; rerun resumes
constexpr int kNodeBad = 78;    // EX_CONFIG: ddprun doctor found this node, or a link of it, unfit
constexpr int kSignalBase = 128;  // 128 + N: killed by signal N

// The exit code for an exception escaping main(): ConfigError -> kConfig, DataError -> kData,
// StoreError -> kRendezvous, CommError -> kComm, anything else -> kFailure.
int for_exception(const std::exception& e);

}  // namespace ddp::exit_code
