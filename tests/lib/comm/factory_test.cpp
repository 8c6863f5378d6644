#include "ddp/comm/factory.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "ddp/comm/types.h"
#include "ddp/error.h"
#include "ddp/store.h"
#include "multiprocess.h"
#include "scoped_env.h"

namespace ddp {
namespace {

TEST(Factory, GlooIsAlwaysAvailable) {
  auto names = available_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), "gloo"), names.end());
}

TEST(Factory, UnknownBackendListsTheChoices) {
  setenv("DDP_BACKEND", "nccl", 1);
  try {
    backend_from_env();
    FAIL() << "DDP_BACKEND=nccl accepted";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("DDP_BACKEND='nccl'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gloo"), std::string::npos) << msg;
  }
  unsetenv("DDP_BACKEND");
  EXPECT_EQ(backend_from_env(), "gloo");
}

TEST(Factory, SingleRankCommunicatorWorksWithoutPeers) {
  auto store = Store::host(0, std::chrono::seconds(5));
  for (const auto& backend : available_backends()) {
    auto comm = create_communicator(backend, store->with_prefix(backend), 0, 1);
    std::vector<float> v{1, 2, 3};
    comm->allreduce(v, ReduceOp::kAvg);
    EXPECT_EQ(v, (std::vector<float>{1, 2, 3})) << backend;
    EXPECT_STREQ(comm->backend_name(), backend.c_str());
  }
}

// CommOptions::socket_ifname wins over DDP_SOCKET_IFNAME: an interface that does not exist fails
// the construction naming it, although the variable names one that does.
TEST(Factory, TheInterfaceSetInCodeWinsOverTheEnvironment) {
  testing::ScopedEnv lo("DDP_SOCKET_IFNAME", "lo");
  auto store = Store::host(0, std::chrono::seconds(5));
  CommOptions options;
  options.socket_ifname = "ddp-no-such-if";
  try {
    create_communicator("gloo", store->with_prefix("code"), 0, 1, options);
    FAIL() << "gloo listened on an interface that does not exist";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("interface ddp-no-such-if"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(create_communicator("gloo", store->with_prefix("env"), 0, 1));
}

// Run only by the test below, in a process of its own (the kernels are chosen once per process):
// exits 42 when building a communicator under DDP_ISA=sse9 fails with a ConfigError that
// names the setting.
TEST(Factory, DISABLED_ChildBuildsACommunicatorUnderABadIsa) {
  auto store = Store::host(0, std::chrono::seconds(5));
  try {
    create_communicator("gloo", store, 0, 1);
  } catch (const ConfigError& e) {
    if (std::string(e.what()).find("DDP_ISA='sse9'") != std::string::npos) std::_Exit(42);
    FAIL() << e.what();
  }
  FAIL() << "a communicator was built with DDP_ISA=sse9";
}

TEST(Factory, AnUnknownReductionVariantFailsTheCommunicatorsConstruction) {
  const auto outcomes = testing::run_ranks(1, std::chrono::seconds(60), [](int) {
    setenv("DDP_ISA", "sse9", 1);
    execl("/proc/self/exe", "comm_unit_tests", "--gtest_also_run_disabled_tests",
          "--gtest_filter=Factory.DISABLED_ChildBuildsACommunicatorUnderABadIsa",
          static_cast<char*>(nullptr));
    throw std::runtime_error("cannot run this test binary again");
  });
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].exit_code, 42) << testing::describe(outcomes[0]);
}

// A write to a dead peer's socket must become a CommError, not a SIGPIPE death.
TEST(Factory, GlooIgnoresSigpipeUnlessTheProgramHandlesIt) {
  struct sigaction saved {};
  sigaction(SIGPIPE, nullptr, &saved);
  auto store = Store::host(0, std::chrono::seconds(5));

  std::signal(SIGPIPE, SIG_DFL);
  create_communicator("gloo", store->with_prefix("a"), 0, 1);
  struct sigaction now {};
  sigaction(SIGPIPE, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_IGN);

  auto handler = +[](int) {};
  std::signal(SIGPIPE, handler);
  create_communicator("gloo", store->with_prefix("b"), 0, 1);
  sigaction(SIGPIPE, nullptr, &now);
  EXPECT_EQ(now.sa_handler, handler);

  sigaction(SIGPIPE, &saved, nullptr);
}

}  // namespace
}  // namespace ddp
