// The fabric backend end to end: forked ranks on loopback, through create_communicator, on each
// local provider that exercises manual progress (shm and tcp;ofi_rxm).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "comm/fabric/fabric_communicator.h"
#include "comm/fabric/fabric_connection.h"
#include "comm/fabric/fabric_transport.h"
#include "ddp/comm/factory.h"
#include "ddp/error.h"
#include "ddp/store.h"
#include "forked_ranks.h"

namespace ddp::detail::fabric {
namespace {

using testing::RankExit;
using testing::run_forked_ranks;

constexpr auto kDeadline = std::chrono::seconds(60);

// Sets an environment variable for the scope of a test (children inherit it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void expect_all_exit_zero(const std::vector<RankExit>& exits) {
  for (std::size_t r = 0; r < exits.size(); ++r) {
    EXPECT_FALSE(exits[r].timed_out) << "rank " << r << " hit the test deadline";
    EXPECT_TRUE(exits[r].exited && exits[r].code == 0)
        << "rank " << r << " exit code " << exits[r].code << " signal " << exits[r].signal;
  }
}

CommOptions with_timeout(std::chrono::milliseconds timeout) {
  CommOptions options;
  options.timeout = timeout;
  return options;
}

#define CHILD_CHECK(condition)                                                                    \
  do {                                                                                            \
    if (!(condition)) {                                                                           \
      std::fprintf(stderr, "rank %d: check failed at line %d: %s\n", rank, __LINE__, #condition); \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

struct ProviderAndRanks {
  const char* provider;
  int ranks;
};

class FabricProcesses : public ::testing::TestWithParam<ProviderAndRanks> {};

TEST_P(FabricProcesses, EveryCollectiveIsExact) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  auto exits = run_forked_ranks(n, kDeadline, [&](int rank, std::shared_ptr<Store> store) {
    auto comm =
        create_communicator("fabric", store, rank, n, with_timeout(std::chrono::seconds(20)));
    auto* fabric = dynamic_cast<FabricCommunicator*>(comm.get());
    CHILD_CHECK(fabric && fabric->provider() == provider);
    const std::int64_t triangle = static_cast<std::int64_t>(n) * (n + 1) / 2;
    // Below and above the ring threshold, and an odd count that splits unevenly.
    for (std::size_t count : {std::size_t{1}, std::size_t{1001}, std::size_t{300001}}) {
      std::vector<float> values(count);
      for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>((rank + 1) * (i % 13));
      comm->allreduce(values, ReduceOp::kSum);
      for (std::size_t i = 0; i < count; ++i) CHILD_CHECK(values[i] == triangle * (i % 13));

      std::vector<std::int64_t> root_data(count, rank == n - 1 ? 7 : 0);
      comm->broadcast(root_data, n - 1);
      for (auto v : root_data) CHILD_CHECK(v == 7);

      std::vector<std::int32_t> mine(count, rank);
      std::vector<std::int32_t> all(count * n, -1);
      comm->allgather(mine, all);
      for (int r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < count; ++i) CHILD_CHECK(all[r * count + i] == r);
      }

      std::vector<double> input(count * n);
      for (std::size_t i = 0; i < input.size(); ++i) input[i] = static_cast<double>(i + rank);
      std::vector<double> output(count);
      comm->reduce_scatter(input, output, ReduceOp::kMax);
      for (std::size_t i = 0; i < count; ++i) {
        CHILD_CHECK(output[i] == static_cast<double>(rank * count + i + n - 1));
      }
      comm->barrier();
    }
    // Async ops in flight together, as DDP issues its gradient buckets.
    std::vector<std::vector<float>> buckets(6, std::vector<float>(70000, 1.0f));
    std::vector<Work> works;
    for (auto& b : buckets) works.push_back(comm->allreduce_async(b, ReduceOp::kAvg));
    for (auto& w : works) w.wait();
    for (auto& b : buckets) {
      for (auto v : b) CHILD_CHECK(v == 1.0f);
    }
    return 0;
  });
  expect_all_exit_zero(exits);
}

TEST_P(FabricProcesses, MismatchedSizesFailEveryRankQuicklyWithCommError) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  auto exits = run_forked_ranks(n, kDeadline, [&](int rank, std::shared_ptr<Store> store) {
    auto comm =
        create_communicator("fabric", store, rank, n, with_timeout(std::chrono::seconds(30)));
    std::vector<float> values(rank == n - 1 ? 200001 : 200000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->allreduce(values);
    } catch (const TimeoutError& e) {
      std::fprintf(stderr, "rank %d: timed out instead of reporting the mismatch: %s\n", rank,
                   e.what());
      return 2;
    } catch (const CommError& e) {
      CHILD_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
      CHILD_CHECK(e.op() == "allreduce");
      // Later calls fail at once instead of running on a broken endpoint.
      try {
        comm->barrier();
        return 4;
      } catch (const CommError&) {
      }
      return 0;
    }
    return 3;
  });
  expect_all_exit_zero(exits);
}

// Killed between ops and in the middle of a large allreduce: the others fail within the timeout.
TEST_P(FabricProcesses, KilledPeerFailsTheOthersWithinTheTimeout) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  const int victim = n - 1;
  const auto timeout = std::chrono::seconds(4);
  for (bool mid_op : {false, true}) {
    SCOPED_TRACE(mid_op ? "killed mid-op" : "killed between ops");
    auto exits = run_forked_ranks(n, kDeadline, [&](int rank, std::shared_ptr<Store> store) {
      auto comm = create_communicator("fabric", store, rank, n, with_timeout(timeout));
      std::vector<float> values(4 << 20, 1.0f);
      comm->allreduce(values);
      if (rank == victim) {
        if (mid_op) {
          Work work = comm->allreduce_async(values);
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        ::raise(SIGKILL);
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        for (int i = 0; i < 100; ++i) comm->allreduce(values);
      } catch (const CommError& e) {
        const auto waited = std::chrono::steady_clock::now() - start;
        CHILD_CHECK(waited < timeout + std::chrono::seconds(2));
        std::fprintf(stderr, "rank %d saw: %s\n", rank, e.what());
        return 0;
      }
      return 1;
    });
    for (int r = 0; r < n; ++r) {
      if (r == victim) {
        EXPECT_EQ(exits[r].signal, SIGKILL);
      } else {
        EXPECT_TRUE(exits[r].exited && exits[r].code == 0) << "rank " << r;
      }
    }
  }
}

TEST_P(FabricProcesses, SameByteCountButDifferentTypeIsReportedAsAMismatch) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  auto exits = run_forked_ranks(n, kDeadline, [&](int rank, std::shared_ptr<Store> store) {
    auto comm =
        create_communicator("fabric", store, rank, n, with_timeout(std::chrono::seconds(30)));
    std::vector<float> floats(5000, 1.0f);
    std::vector<std::int32_t> ints(5000, 1);
    try {
      if (rank == 0) {
        comm->allreduce(ints);
      } else {
        comm->allreduce(floats);
      }
    } catch (const TimeoutError& e) {
      std::fprintf(stderr, "rank %d: timed out: %s\n", rank, e.what());
      return 2;
    } catch (const CommError& e) {
      return 0;
    }
    return 1;
  });
  expect_all_exit_zero(exits);
}

INSTANTIATE_TEST_SUITE_P(LocalProviders, FabricProcesses,
                         ::testing::Values(ProviderAndRanks{"shm", 2}, ProviderAndRanks{"shm", 3},
                                           ProviderAndRanks{"shm", 4},
                                           ProviderAndRanks{"tcp;ofi_rxm", 2},
                                           ProviderAndRanks{"tcp;ofi_rxm", 3},
                                           ProviderAndRanks{"tcp;ofi_rxm", 4}),
                         [](const auto& info) {
                           std::string name = info.param.provider;
                           for (auto& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name + "_ranks" + std::to_string(info.param.ranks);
                         });

class FabricTransportProcesses : public ::testing::TestWithParam<const char*> {};

// Messages posted long before their receives sit in the provider's unexpected queue; receives
// posted later, in reverse order, must still find every one of them.
TEST_P(FabricTransportProcesses, MessagesThatArriveBeforeTheirReceivesAreAllMatched) {
  ScopedEnv select("DDP_FABRIC_PROVIDER", GetParam());
  auto exits = run_forked_ranks(2, kDeadline, [&](int rank, std::shared_ptr<Store> store) {
    auto connection = connect_fabric(*store, rank, 2, std::chrono::seconds(20), AlgorithmConfig{});
    PeerTransport& t = *connection.transport;
    constexpr int kMessages = 40;
    auto bytes_of = [](int i) { return i % 5 == 0 ? std::size_t{150000} : std::size_t(4 * i + 4); };
    std::size_t total = 0;
    for (int i = 0; i < kMessages; ++i) total += bytes_of(i);
    auto* data = static_cast<unsigned char*>(t.scratch(total));
    t.begin_op(OpKind::kAllgather, 42);
    if (rank == 1) {
      std::size_t offset = 0;
      for (int i = 0; i < kMessages; ++i) {
        for (std::size_t b = 0; b < bytes_of(i); ++b)
          data[offset + b] = static_cast<unsigned char>(i + b);
        t.send(0, static_cast<std::uint32_t>(i), data + offset, bytes_of(i));
        offset += bytes_of(i);
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::size_t offset = total;
      for (int i = kMessages - 1; i >= 0; --i) {
        offset -= bytes_of(i);
        t.wait(t.recv(1, static_cast<std::uint32_t>(i), data + offset, bytes_of(i)));
        for (std::size_t b = 0; b < bytes_of(i); ++b) {
          CHILD_CHECK(data[offset + b] == static_cast<unsigned char>(i + b));
        }
      }
    }
    t.end_op();
    return 0;
  });
  expect_all_exit_zero(exits);
}

INSTANTIATE_TEST_SUITE_P(LocalProviders, FabricTransportProcesses,
                         ::testing::Values("shm", "tcp;ofi_rxm"), [](const auto& info) {
                           return std::string(info.param) == "shm" ? "shm" : "tcp_ofi_rxm";
                         });

TEST(FabricProviderChoice, AutomaticChoiceIsShmWhenAllRanksShareTheHost) {
  ScopedEnv no_ddp("DDP_FABRIC_PROVIDER", nullptr);
  ScopedEnv no_fi("FI_PROVIDER", nullptr);
  auto exits = run_forked_ranks(2, kDeadline, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = create_communicator("fabric", store, rank, 2);
    auto* fabric = dynamic_cast<FabricCommunicator*>(comm.get());
    CHILD_CHECK(fabric && fabric->provider() == "shm");
    return 0;
  });
  expect_all_exit_zero(exits);
}

TEST(FabricProviderChoice, UnknownProviderIsAConfigErrorListingTheUsableOnes) {
  ScopedEnv select("DDP_FABRIC_PROVIDER", "no_such_provider");
  auto store = Store::host(0, std::chrono::seconds(10));
  try {
    create_communicator("fabric", store, 0, 1);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no_such_provider"), std::string::npos) << what;
    EXPECT_NE(what.find("shm"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST(FabricProviderChoice, PeersOfARankThatCannotOpenItsEndpointFailWithItsReason) {
  auto exits = run_forked_ranks(2, kDeadline, [&](int rank, std::shared_ptr<Store> store) {
    ::setenv("DDP_FABRIC_PROVIDER", rank == 1 ? "no_such_provider" : "shm", 1);
    try {
      create_communicator("fabric", store, rank, 2, with_timeout(std::chrono::seconds(20)));
    } catch (const ConfigError&) {
      return rank == 1 ? 0 : 1;
    } catch (const CommError& e) {
      CHILD_CHECK(rank == 0 && e.peer() == 1);
      CHILD_CHECK(std::string(e.what()).find("no_such_provider") != std::string::npos);
      return 0;
    }
    return 2;
  });
  expect_all_exit_zero(exits);
}

}  // namespace
}  // namespace ddp::detail::fabric
