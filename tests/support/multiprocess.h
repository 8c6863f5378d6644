#pragma once
// Runs test code as real processes: forks one child per rank, bounds them by a hard deadline,
// and kills every child by PID when it passes. Children report failure through their exit
// status and say why on stderr, prefixed with their rank.
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/comm/communicator.h"
#include "ddp/store.h"

namespace ddp::testing {

struct RankOutcome {
  int rank = 0;
  pid_t pid = 0;
  int exit_code = -1;  // valid when exited normally
  int signal = 0;      // the signal that killed it, or 0
  bool killed_at_deadline = false;
  std::chrono::milliseconds elapsed{0};
  // For a rank killed at the deadline: its threads' stacks just before, so that a hang seen once
  // (in CI, say) shows where it hung; or why they could not be taken.
  std::string stacks_at_deadline;
};

// Every thread's stack of a running process of this user, as gdb prints it ("Thread ...",
// "#0 ..." lines), taken within `limit`; a one-line reason instead when that fails.
std::string stacks_of(pid_t pid, std::chrono::milliseconds limit);

// Forks `world_size` children running body(rank). A child exits 0 when body returns, 1 when it
// throws (the message goes to stderr). Children die with the parent (PR_SET_PDEATHSIG).
std::vector<RankOutcome> run_ranks(int world_size, std::chrono::milliseconds deadline,
                                   const std::function<void(int rank)>& body);

// Success when every rank exited 0 before the deadline; otherwise says which did not and why.
::testing::AssertionResult all_ranks_succeeded(const std::vector<RankOutcome>& outcomes);
std::string describe(const RankOutcome& outcome);

// Success when rank `victim` died of SIGKILL and every other rank exited 0 before the deadline:
// the outcome of the tests that kill one rank mid-collective.
::testing::AssertionResult only_victim_was_killed(const std::vector<RankOutcome>& outcomes,
                                                  int victim);

// A rendezvous store served by a process of its own, so the test process stays single-threaded
// when it forks ranks (a requirement of ThreadSanitizer, and of fork safety in general).
// Children connect their own clients, under a prefix unique per group.
class TestStoreServer {
 public:
  TestStoreServer();
  ~TestStoreServer();
  TestStoreServer(const TestStoreServer&) = delete;
  TestStoreServer& operator=(const TestStoreServer&) = delete;
  int port() const { return port_; }
  // A fresh key space for one group of ranks.
  std::string next_group_prefix();
  // Called in a child: a client of this server, scoped to `prefix`.
  std::shared_ptr<Store> connect_client(const std::string& prefix) const;

 private:
  pid_t server_pid_ = 0;
  int port_ = 0;
  int groups_ = 0;
};

// Runs body(comm) on `world_size` forked ranks, each with a communicator of `backend`.
// `before_connect(rank)`, when given, runs in each child first (to set its environment, say).
std::vector<RankOutcome> run_with_communicators(
    TestStoreServer& server, const std::string& backend, int world_size, const CommOptions& options,
    std::chrono::milliseconds deadline, const std::function<void(Communicator& comm)>& body,
    const std::function<void(int rank)>& before_connect = nullptr);

// A TCP port on 127.0.0.1 that was free a moment ago (bound, then released), chosen at random
// below the kernel's ephemeral range, so that no outgoing connection or bind(0) (Open MPI's
// listeners, another test's clients) takes it before the test binds it.
int free_tcp_port();

// Throws (failing the rank) with a message when `condition` is false.
void require(bool condition, const std::string& message);

// Memory shared by the parent and all forked ranks (MAP_SHARED | MAP_ANONYMOUS), for tests
// that need to observe cross-rank ordering without using the code under test.
class SharedMemory {
 public:
  explicit SharedMemory(std::size_t bytes);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_;
  std::size_t bytes_;
};

}  // namespace ddp::testing
