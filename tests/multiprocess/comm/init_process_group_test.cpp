// init_process_group() as a launched worker uses it: the torchrun environment in, a working
// communicator out, in both store modes.
#include <chrono>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "ddp/distributed.h"
#include "ddp/error.h"
#include "ddp/exit_codes.h"
#include "multiprocess.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using testing::require;

void set_worker_env(int rank, int world, int port, bool agent_store) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("DDP_TIMEOUT_SEC", "20", 1);
  if (agent_store) setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
}

void allreduce_ranks(ProcessGroup& group) {
  std::vector<double> v{static_cast<double>(group.env.rank)};
  group.comm->allreduce(v, ReduceOp::kSum);
  const int n = group.env.world_size;
  require(v[0] == n * (n - 1) / 2.0,
          "allreduce over init_process_group gave " + std::to_string(v[0]));
}

TEST(InitProcessGroup, RankZeroHostsTheStoreWithoutALauncher) {
  const int port = testing::free_tcp_port();
  auto outcomes = testing::run_ranks(3, 60s, [&](int rank) {
    set_worker_env(rank, 3, port, false);
    auto group = init_process_group();
    allreduce_ranks(group);
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(InitProcessGroup, WorkersAreClientsOfTheAgentStore) {
  testing::TestStoreServer agent_store;
  auto outcomes = testing::run_ranks(2, 60s, [&](int rank) {
    set_worker_env(rank, 2, agent_store.port(), true);
    auto group = init_process_group();
    require(group.env.use_agent_store, "TORCHELASTIC_USE_AGENT_STORE not honoured");
    allreduce_ranks(group);
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(InitProcessGroup, UnreachableMasterFailsWithARendezvousExitCode) {
  const int port = testing::free_tcp_port();  // nobody listens there
  auto outcomes = testing::run_ranks(1, 60s, [&](int) {
    set_worker_env(1, 2, port, false);
    setenv("DDP_TIMEOUT_SEC", "2", 1);
    try {
      init_process_group();
    } catch (const StoreError& e) {
      require(exit_code::for_exception(e) == exit_code::kRendezvous, "wrong exit code mapping");
      require(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)) != std::string::npos,
              e.what());
      return;
    }
    require(false, "init_process_group reached a master that does not exist");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

}  // namespace
}  // namespace ddp
