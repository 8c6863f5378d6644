// How libddp loads its backends, checked in a process of its own (one test, run in order): a
// gloo program never maps libfabric, and loading the fabric module leaves the process's signal
// dispositions as the program set them (libfabric's PSM dependency installs handlers that
// exit(1) on SIGTERM, which turned a launcher's stop signal into a plain failure).
#include <algorithm>
#include <csignal>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/comm/factory.h"
#include "ddp/store.h"

namespace ddp {
namespace {

bool libfabric_is_mapped() {
  std::ifstream maps("/proc/self/maps");
  const std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
  return text.find("/libfabric.so") != std::string::npos;
}

void* handler_of(int signal) {
  struct sigaction action {};
  sigaction(signal, nullptr, &action);
  return reinterpret_cast<void*>(action.sa_handler);
}

TEST(BackendLoading, FabricIsLoadedOnlyWhenChosenAndKeepsTheSignalHandlers) {
  auto store = Store::host(0, std::chrono::seconds(5));
  ASSERT_FALSE(libfabric_is_mapped()) << "libddp must not link libfabric itself";
  auto gloo = create_communicator("gloo", store->with_prefix("gloo"), 0, 1);
  EXPECT_FALSE(libfabric_is_mapped()) << "a gloo communicator loaded libfabric";

  const auto names = available_backends();
  if (std::find(names.begin(), names.end(), "fabric") == names.end()) {
    GTEST_SKIP() << "this build has no fabric backend (-DDDP_WITH_FABRIC=OFF)";
  }
  auto program_handler = +[](int) {};
  std::signal(SIGINT, program_handler);
  std::signal(SIGTERM, SIG_DFL);
  const void* before_segv = handler_of(SIGSEGV);
  const void* before_abrt = handler_of(SIGABRT);

  auto fabric = create_communicator("fabric", store->with_prefix("fabric"), 0, 1);
  EXPECT_TRUE(libfabric_is_mapped());
  EXPECT_EQ(handler_of(SIGTERM), reinterpret_cast<void*>(SIG_DFL));
  EXPECT_EQ(handler_of(SIGINT), reinterpret_cast<void*>(program_handler));
  EXPECT_EQ(handler_of(SIGSEGV), before_segv);
  EXPECT_EQ(handler_of(SIGABRT), before_abrt);
  std::vector<float> v{1, 2};
  fabric->allreduce(v, ReduceOp::kSum);
  EXPECT_EQ(v, (std::vector<float>{1, 2}));
  EXPECT_EQ(handler_of(SIGTERM), reinterpret_cast<void*>(SIG_DFL)) << "changed by the first op";
  std::signal(SIGINT, SIG_DFL);
}

}  // namespace
}  // namespace ddp
