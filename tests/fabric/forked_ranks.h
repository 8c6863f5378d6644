#pragma once
// Runs a world of ranks as forked processes on loopback, with a hard deadline. Rank 0 hosts the
// rendezvous store on a free port and passes the port to the others through pipes, so the test
// process itself starts no threads before forking. Ranks that outlive the deadline are killed
// by PID and reaped.
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

namespace ddp {
class Store;
}

namespace ddp::detail::fabric::testing {

struct RankExit {
  bool exited = false;     // exited normally (else: killed by a signal or by the deadline)
  int code = -1;           // exit status when exited
  int signal = 0;          // terminating signal otherwise
  bool timed_out = false;  // still running at the deadline
};

// `body(rank, store)` runs in each child; its return value is the child's exit code, and an
// exception escaping it exits with 99 after printing what().
std::vector<RankExit> run_forked_ranks(
    int ranks, std::chrono::milliseconds deadline,
    const std::function<int(int rank, std::shared_ptr<Store> store)>& body);

}  // namespace ddp::detail::fabric::testing
