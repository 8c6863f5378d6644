// The fabric backend end to end: ranks are forked processes on loopback (tests/support
// harness), on each local provider that exercises manual progress (shm and tcp;ofi_rxm).
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "comm/abort_notice.h"
#include "comm/fabric/fabric_communicator.h"
#include "comm/fabric/fabric_connection.h"
#include "comm/fabric/fabric_transport.h"
#include "ddp/comm/factory.h"
#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/store.h"
#include "multiprocess.h"
#include "scoped_env.h"

namespace ddp::detail::fabric {
namespace {

using namespace std::chrono_literals;
using ddp::testing::require;

constexpr auto kDeadline = 60s;

testing::TestStoreServer& server() {
  static testing::TestStoreServer instance;
  return instance;
}

using testing::ScopedEnv;

CommOptions with_timeout(std::chrono::milliseconds timeout) {
  CommOptions options;
  options.timeout = timeout;
  return options;
}

// Runs body(rank, store) on `n` forked ranks sharing a fresh store prefix.
std::vector<testing::RankOutcome> run_group(
    int n, const std::function<void(int rank, std::shared_ptr<Store> store)>& body) {
  const std::string prefix = server().next_group_prefix();
  return testing::run_ranks(n, kDeadline, [&](int rank) {
    log::set_rank(rank);
    body(rank, server().connect_client(prefix));
  });
}

struct ProviderAndRanks {
  const char* provider;
  int ranks;
};

class FabricProcesses : public ::testing::TestWithParam<ProviderAndRanks> {};

TEST_P(FabricProcesses, EveryCollectiveIsExact) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  auto outcomes = run_group(n, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = create_communicator("fabric", store, rank, n, with_timeout(20s));
    auto* fabric = dynamic_cast<FabricCommunicator*>(comm.get());
    require(fabric && fabric->provider() == provider, "unexpected provider");
    const std::int64_t triangle = static_cast<std::int64_t>(n) * (n + 1) / 2;
    // Below and above the ring threshold, and an odd count that splits unevenly.
    for (std::size_t count : {std::size_t{1}, std::size_t{1001}, std::size_t{300001}}) {
      std::vector<float> values(count);
      for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>((rank + 1) * (i % 13));
      comm->allreduce(values, ReduceOp::kSum);
      for (std::size_t i = 0; i < count; ++i) {
        require(values[i] == triangle * (i % 13), "allreduce " + std::to_string(count));
      }
      std::vector<std::int64_t> root_data(count, rank == n - 1 ? 7 : 0);
      comm->broadcast(root_data, n - 1);
      for (auto v : root_data) require(v == 7, "broadcast " + std::to_string(count));

      std::vector<std::int32_t> mine(count, rank);
      std::vector<std::int32_t> all(count * n, -1);
      comm->allgather(mine, all);
      for (int r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < count; ++i) {
          require(all[r * count + i] == r, "allgather " + std::to_string(count));
        }
      }
      std::vector<double> input(count * n);
      for (std::size_t i = 0; i < input.size(); ++i) input[i] = static_cast<double>(i + rank);
      std::vector<double> output(count);
      comm->reduce_scatter(input, output, ReduceOp::kMax);
      for (std::size_t i = 0; i < count; ++i) {
        require(output[i] == static_cast<double>(rank * count + i + n - 1),
                "reduce_scatter " + std::to_string(count));
      }
      comm->barrier();
    }
    // Async ops in flight together, as DDP issues its gradient buckets.
    std::vector<std::vector<float>> buckets(6, std::vector<float>(70000, 1.0f));
    std::vector<Work> works;
    for (auto& b : buckets) works.push_back(comm->allreduce_async(b, ReduceOp::kAvg));
    for (auto& w : works) w.wait();
    for (auto& b : buckets) {
      for (auto v : b) require(v == 1.0f, "async avg");
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST_P(FabricProcesses, MismatchedSizesFailEveryRankQuicklyAndForGood) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  auto outcomes = run_group(n, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = create_communicator("fabric", store, rank, n, with_timeout(30s));
    std::vector<float> values(rank == n - 1 ? 200001 : 200000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->allreduce(values);
    } catch (const TimeoutError& e) {
      require(false, std::string("timed out instead of reporting the mismatch: ") + e.what());
    } catch (const CommError& e) {
      require(std::chrono::steady_clock::now() - start < 5s, "slow to fail");
      require(e.op() == "allreduce", e.what());
      // Later calls fail at once instead of running on a broken endpoint.
      try {
        comm->barrier();
      } catch (const CommError&) {
        return;
      }
      require(false, "barrier after a failure succeeded");
    }
    require(false, "mismatched allreduce succeeded");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST_P(FabricProcesses, SameByteCountButDifferentTypeIsReportedAsAMismatch) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  testing::SharedMemory shared(sizeof(int));
  int* saw_the_mismatch = shared.as<int>();
  auto outcomes = run_group(n, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = create_communicator("fabric", store, rank, n, with_timeout(30s));
    std::vector<float> floats(5000, 1.0f);
    std::vector<std::int32_t> ints(5000, 1);
    try {
      if (rank == 0) {
        comm->allreduce(ints);
      } else {
        comm->allreduce(floats);
      }
    } catch (const TimeoutError& e) {
      require(false, std::string("timed out: ") + e.what());
    } catch (const CommError& e) {
      // Seen first hand ("rank 1 issued ..."), learnt from a peer's abort notice, or, when that
      // notice found no connection up within its 100 ms (tcp;ofi_rxm beside another 4-rank test
      // on 2 cores), from the peer's exit, or from a send to the failed peer that broke before
      // its notice was read (tcp;ofi_rxm, 4 ranks, 1 run in about 40): never a timeout.
      const std::string what = e.what();
      if (what.find(" issued ") != std::string::npos) {
        __atomic_add_fetch(saw_the_mismatch, 1, __ATOMIC_SEQ_CST);
      } else {
        require(what.find("aborted the job's collectives") != std::string::npos ||
                    what.find("exited during the collective") != std::string::npos ||
                    what.find("closed its connection during the collective") != std::string::npos,
                "neither the mismatch nor a peer's abort or exit: " + what);
      }
      return;
    }
    require(false, "allreduce over different types succeeded");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
  EXPECT_GE(*saw_the_mismatch, 1) << "no rank reported that another one issued another collective";
}

// Disagreements an op header used to show and a digest alone would not: a rank that sends only
// small messages where its peer expects a large one (or none where it expects one) must still
// learn of it long before the timeout. Each case: the last rank's buffer (or, for a broadcast,
// the root's) differs from the others'. Every rank that receives fails in that collective.
TEST_P(FabricProcesses, MismatchesAcrossTheEagerSizeFailEveryRankQuickly) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  struct Case {
    const char* name;
    bool broadcast;
    std::size_t odd_count;    // floats on the rank that differs
    std::size_t usual_count;  // floats on the others
  };
  // 1000 floats fit one 4 KiB inject on shm, 1025 do not; 16 are eager everywhere.
  for (const Case& c : {Case{"allreduce, empty against small", false, 0, 16},
                        Case{"allreduce, eager against large", false, 1000, 1025},
                        Case{"broadcast, eager root against large receivers", true, 1000, 1025},
                        Case{"broadcast, large root against eager receivers", true, 1025, 1000}}) {
    SCOPED_TRACE(c.name);
    auto outcomes = run_group(n, [&](int rank, std::shared_ptr<Store> store) {
      auto comm = create_communicator("fabric", store, rank, n, with_timeout(30s));
      const int odd_rank = c.broadcast ? 0 : n - 1;
      std::vector<float> values(rank == odd_rank ? c.odd_count : c.usual_count, 1.0f);
      const auto start = std::chrono::steady_clock::now();
      try {
        if (c.broadcast) {
          comm->broadcast(Buffer(values.data(), values.size()), 0);
        } else {
          comm->allreduce(values);
        }
      } catch (const TimeoutError& e) {
        require(false, std::string("timed out instead of reporting the mismatch: ") + e.what());
      } catch (const CommError& e) {
        require(std::chrono::steady_clock::now() - start < 5s,
                std::string("slow to fail: ") + e.what());
        require(e.op() == (c.broadcast ? "broadcast" : "allreduce"), e.what());
        return;
      }
      // A broadcast's root waits for no one: it learns of the failure in its next collective.
      require(c.broadcast && rank == 0, "the mismatched collective succeeded");
      try {
        comm->barrier();
      } catch (const TimeoutError& e) {
        require(false, std::string("the root's next collective timed out: ") + e.what());
      } catch (const CommError& e) {
        require(std::chrono::steady_clock::now() - start < 5s,
                std::string("the root was slow to fail: ") + e.what());
        return;
      }
      require(false, "the root's collective after the mismatch succeeded");
    });
    EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
  }
}

// Killed between ops and in the middle of a large allreduce: the others fail within the timeout.
TEST_P(FabricProcesses, KilledPeerFailsTheOthersWithinTheTimeout) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  const int victim = n - 1;
  const auto timeout = 4s;
  for (bool mid_op : {false, true}) {
    SCOPED_TRACE(mid_op ? "killed mid-op" : "killed between ops");
    auto outcomes = run_group(n, [&](int rank, std::shared_ptr<Store> store) {
      auto comm = create_communicator("fabric", store, rank, n, with_timeout(timeout));
      std::vector<float> values(4 << 20, 1.0f);
      comm->allreduce(values);
      if (rank == victim) {
        if (mid_op) {
          Work work = comm->allreduce_async(values);
          std::this_thread::sleep_for(2ms);
        }
        ::raise(SIGKILL);
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        for (int i = 0; i < 100; ++i) comm->allreduce(values);
      } catch (const CommError& e) {
        require(std::chrono::steady_clock::now() - start < timeout + 2s, "failed too late");
        return;
      }
      require(false, "allreduce kept succeeding without the victim");
    });
    EXPECT_TRUE(testing::only_victim_was_killed(outcomes, victim));
  }
}

// ddprun's abort notice (a node declared lost): the ranks blocked in an op with a rank that has
// gone silent give up on their next poll with a CommError carrying the launcher's reason, long
// before the op's timeout.
TEST_P(FabricProcesses, TheLaunchersAbortNoticeEndsABlockedOpWithItsReason) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  const int silent = n - 1;
  const auto timeout = 30s;
  auto outcomes = run_group(n, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = create_communicator("fabric", store, rank, n, with_timeout(timeout));
    std::vector<float> values(1 << 16, 1.0f);
    comm->allreduce(values);
    if (rank == silent) {
      std::this_thread::sleep_for(4s);  // as a node that vanished, for the others
      try {
        comm->allreduce(values);
      } catch (const CommError&) {
      }
      return;
    }
    std::thread launcher([] {
      std::this_thread::sleep_for(300ms);
      detail::AbortNotice::raise("node 1 (pod-1) was lost: no heartbeat for 15.0 s");
    });
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->allreduce(values);
      launcher.join();
      require(false, "the allreduce completed without the silent rank");
    } catch (const CommError& e) {
      launcher.join();
      const std::string what = e.what();
      require(what.find("aborted by ddprun: node 1 (pod-1) was lost") != std::string::npos,
              "the error lacks the launcher's reason: " + what);
      require(std::chrono::steady_clock::now() - start < 3s, "gave up too late: " + what);
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// A rank that finished the last op and exited must not fail the ranks still finishing it.
TEST_P(FabricProcesses, RanksThatFinishAndExitFailNobody) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  auto outcomes = run_group(n, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = create_communicator("fabric", store, rank, n, with_timeout(20s));
    std::vector<float> values(1000, 1.0f);
    for (int i = 0; i < 20; ++i) {
      // The root leaves as soon as its last broadcast is sent; the others arrive late.
      if (rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(i == 19 ? 300 : 0));
      comm->broadcast(values, 0);
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// A forked child (a data loader worker, say) that drops its copy of the communicator must
// leave the parent's endpoint alone.
TEST_P(FabricProcesses, ForkedChildThatDestroysItsCopyLeavesTheParentWorking) {
  const auto [provider, n] = GetParam();
  ScopedEnv select("DDP_FABRIC_PROVIDER", provider);
  auto outcomes = run_group(n, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = create_communicator("fabric", store, rank, n, with_timeout(20s));
    std::vector<float> values(300000, 1.0f);
    comm->allreduce(values);
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child == 0) {
      comm.reset();
      _exit(0);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    require(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child did not exit cleanly");
    for (int i = 0; i < 3; ++i) {
      std::fill(values.begin(), values.end(), 1.0f);
      comm->allreduce(values);
      require(values[0] == static_cast<float>(n) && values.back() == static_cast<float>(n),
              "allreduce after the child left");
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
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
  auto outcomes = run_group(2, [&](int rank, std::shared_ptr<Store> store) {
    auto connection = connect_fabric(*store, rank, 2, with_timeout(20s));
    collectives::PeerTransport& t = *connection.transport;
    constexpr int kMessages = 40;
    auto bytes_of = [](int i) { return i % 5 == 0 ? std::size_t{150000} : std::size_t(4 * i + 4); };
    std::size_t total = 0;
    for (int i = 0; i < kMessages; ++i) total += bytes_of(i);
    auto* data = static_cast<unsigned char*>(t.scratch(total));
    t.begin_op(
        CollectiveSignature::make(CollectiveKind::kAllgather, DataType::kInt32, kMessages, 0, 0));
    if (rank == 1) {
      std::size_t offset = 0;
      for (int i = 0; i < kMessages; ++i) {
        for (std::size_t b = 0; b < bytes_of(i); ++b) {
          data[offset + b] = static_cast<unsigned char>(i + b);
        }
        t.send(0, static_cast<std::uint32_t>(i), data + offset, bytes_of(i));
        offset += bytes_of(i);
      }
    } else {
      std::this_thread::sleep_for(300ms);
      std::size_t offset = total;
      for (int i = kMessages - 1; i >= 0; --i) {
        offset -= bytes_of(i);
        t.wait(t.recv(1, static_cast<std::uint32_t>(i), data + offset, bytes_of(i)));
        for (std::size_t b = 0; b < bytes_of(i); ++b) {
          require(data[offset + b] == static_cast<unsigned char>(i + b),
                  "message " + std::to_string(i) + " corrupted");
        }
      }
    }
    t.end_op();
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// A rank that fails tells its peers why; the peers' errors carry the whole reason, also where
// the provider injects only a few bytes (64 over tcp;ofi_rxm).
TEST_P(FabricTransportProcesses, APeersErrorCarriesTheWholeReasonOfTheRankThatFailed) {
  ScopedEnv select("DDP_FABRIC_PROVIDER", GetParam());
  auto outcomes = run_group(2, [&](int rank, std::shared_ptr<Store> store) {
    // Rank 1 gives up first, on its own timeout; rank 0 learns of it only from its notice.
    auto connection = connect_fabric(*store, rank, 2, with_timeout(rank == 1 ? 300ms : 20s));
    collectives::PeerTransport& t = *connection.transport;
    auto* data = static_cast<char*>(t.scratch(64));
    t.begin_op(CollectiveSignature::make(CollectiveKind::kAllgather, DataType::kInt32, 16, 0, 0));
    try {
      t.wait(t.recv(1 - rank, 0, data, 64));
      require(false, "a receive nobody sent completed");
    } catch (const TimeoutError& e) {
      require(rank == 1, std::string("rank 0 timed out: ") + e.what());
    } catch (const CommError& e) {
      const std::string what = e.what();
      require(rank == 0 && what.find("rank 1 aborted the job's collectives") != std::string::npos,
              what);
      // The last words of rank 1's timeout error.
      require(what.find("issued a different collective") != std::string::npos,
              "the reason arrived cut short: " + what);
    }
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

INSTANTIATE_TEST_SUITE_P(LocalProviders, FabricTransportProcesses,
                         ::testing::Values("shm", "tcp;ofi_rxm"), [](const auto& info) {
                           return std::string(info.param) == "shm" ? "shm" : "tcp_ofi_rxm";
                         });

// Sockets this process has open (the links in /proc/self/fd that name a socket).
int open_sockets() {
  int sockets = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    char path[64];
    char target[64];
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    const ssize_t length = readlink(path, target, sizeof(target) - 1);
    if (length > 0 &&
        std::string(target, static_cast<std::size_t>(length)).rfind("socket:", 0) == 0) {
      ++sockets;
    }
  }
  return sockets;
}

// Closing an ofi_rxm endpoint whose peer failed mid-rendezvous can crash libfabric 1.17 (see
// FabricTransport's constructor), so a failed communicator leaves its endpoint, sockets
// included, to process exit; a healthy one closes them when it is destroyed.
TEST(FabricTcpTransport, AFailedCommunicatorLeavesItsEndpointOpenAHealthyOneClosesIt) {
  ScopedEnv select("DDP_FABRIC_PROVIDER", "tcp;ofi_rxm");
  auto outcomes = run_group(2, [&](int rank, std::shared_ptr<Store> store) {
    const int before = open_sockets();
    {
      auto healthy = create_communicator("fabric", store, rank, 2, with_timeout(20s));
      std::vector<float> values(300000, 1.0f);
      healthy->allreduce(values);
      require(open_sockets() > before, "the endpoint opened no socket to count");
    }
    require(open_sockets() == before, "a healthy communicator left " +
                                          std::to_string(open_sockets() - before) +
                                          " sockets open when it was destroyed");
    auto failing = create_communicator("fabric", store, rank, 2, with_timeout(20s));
    const int opened = open_sockets();
    // Over the ring threshold, so the ranks' chunks travel by rendezvous.
    std::vector<float> values(rank == 1 ? 300001 : 300000, 1.0f);
    try {
      failing->allreduce(values);
      require(false, "mismatched allreduce succeeded");
    } catch (const CommError&) {
    }
    failing.reset();
    require(open_sockets() >= opened, "the failed communicator closed its endpoint");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// Over TCP a message longer than its receive (which the op header, agreeing here, cannot catch)
// is reported by rxm as a truncation: it must end the op with an error naming the peer, well
// before the timeout.
TEST(FabricTcpTransport, AMessageLongerThanItsReceiveFailsTheOp) {
  ScopedEnv select("DDP_FABRIC_PROVIDER", "tcp;ofi_rxm");
  constexpr auto kTimeout = 20s;
  auto outcomes = run_group(2, [&](int rank, std::shared_ptr<Store> store) {
    auto connection = connect_fabric(*store, rank, 2, with_timeout(kTimeout));
    collectives::PeerTransport& t = *connection.transport;
    constexpr std::size_t kSent = 150000;
    auto* data = static_cast<char*>(t.scratch(kSent));
    t.begin_op(
        CollectiveSignature::make(CollectiveKind::kBroadcast, DataType::kInt32, kSent / 4, 1, 0));
    if (rank == 1) {
      t.send(0, 0, data, kSent);
      try {
        t.end_op();  // may fail once rank 0 reports the failure; either outcome is fine here
      } catch (const CommError&) {
      }
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      t.wait(t.recv(1, 0, data, kSent - 50000));
      require(false, "a truncated message completed as a success");
    } catch (const TimeoutError& e) {
      require(false, std::string("truncation went unreported until the timeout: ") + e.what());
    } catch (const CommError& e) {
      const std::string message = e.what();
      require(message.find("rank 1") != std::string::npos, "the error names no peer: " + message);
    }
    require(std::chrono::steady_clock::now() - start < kTimeout / 4,
            "the truncation error took a quarter of the timeout");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(FabricProviderChoice, AutomaticChoiceIsShmWhenAllRanksShareTheHost) {
  ScopedEnv no_ddp("DDP_FABRIC_PROVIDER", nullptr);
  ScopedEnv no_fi("FI_PROVIDER", nullptr);
  auto outcomes = run_group(2, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = create_communicator("fabric", store, rank, 2);
    auto* fabric = dynamic_cast<FabricCommunicator*>(comm.get());
    require(fabric && fabric->provider() == "shm", "automatic choice was not shm");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// Runs `world` in a child process with a private mount namespace whose /dev/shm is a tmpfs of
// `megabytes`; returns the child's exit code (77: no mount namespace possible here).
int in_small_dev_shm(int megabytes, const std::function<bool()>& world) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      _exit(77);
    }
    const std::string options = "size=" + std::to_string(megabytes) + "m";
    if (::mount("tmpfs", "/dev/shm", "tmpfs", 0, options.c_str()) != 0) _exit(77);
    _exit(world() ? 0 : 1);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

TEST(FabricProviderChoice, TooSmallDevShmMeansTcpAutomaticallyAndAnErrorWhenShmIsForced) {
  ScopedEnv no_ddp("DDP_FABRIC_PROVIDER", nullptr);
  ScopedEnv no_fi("FI_PROVIDER", nullptr);
  auto world = [](bool forced) {
    return [forced] {
      if (forced) ::setenv("DDP_FABRIC_PROVIDER", "shm", 1);
      auto outcomes = run_group(4, [&](int rank, std::shared_ptr<Store> store) {
        try {
          auto comm = create_communicator("fabric", store, rank, 4, with_timeout(20s));
          auto* fabric = dynamic_cast<FabricCommunicator*>(comm.get());
          require(!forced && fabric && fabric->provider() == "tcp;ofi_rxm", "provider");
          std::vector<float> values(1000, 1.0f);
          comm->allreduce(values);
          require(values[0] == 4.0f, "allreduce over the fallback");
        } catch (const Error& e) {
          // ConfigError on each rank, or a peer's reason relayed through the store.
          require(forced && std::string(e.what()).find("/dev/shm") != std::string::npos, e.what());
        }
      });
      return static_cast<bool>(testing::all_ranks_succeeded(outcomes));
    };
  };
  // Four ranks' regions may grow to 64 MiB; 24 MiB cannot hold them.
  const int automatic = in_small_dev_shm(24, world(false));
  if (automatic == 77) GTEST_SKIP() << "cannot create a private mount namespace here (needs root)";
  EXPECT_EQ(automatic, 0);
  EXPECT_EQ(in_small_dev_shm(24, world(true)), 0);
}

// Drops CAP_SYS_PTRACE from this process, so that it reads another process's memory only where
// plain ptrace rules allow (the same user, a dumpable target), as in a container without
// SYS_PTRACE. With `unreadable`, it also becomes non-dumpable, so that peers without the
// capability cannot read it: as ranks that are siblings under Yama ptrace_scope 1.
void restrict_cross_memory_attach(bool unreadable) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  require(::syscall(SYS_capget, &header, data) == 0, "capget failed");
  constexpr unsigned kBit = 1u << (CAP_SYS_PTRACE % 32);
  data[CAP_SYS_PTRACE / 32].effective &= ~kBit;
  data[CAP_SYS_PTRACE / 32].permitted &= ~kBit;
  require(::syscall(SYS_capset, &header, data) == 0, "capset failed");
  if (unreadable) require(::prctl(PR_SET_DUMPABLE, 0) == 0, "PR_SET_DUMPABLE failed");
}

// Without cross-memory attach libfabric 1.17's shm fails every message above its inject size
// (an I/O error here, where the kernel refuses the reads); automatic choice must take tcp
// instead, and a forced shm must fail at connect. Only rank 1 is unreadable: ranks 0 and 2 see
// the refusal, rank 1 sees none, and all must agree.
TEST(FabricProviderChoice, WithoutCrossMemoryAttachShmIsReplacedByTcpOrRefusedWhenForced) {
  ScopedEnv no_fi("FI_PROVIDER", nullptr);
  for (const bool forced : {false, true}) {
    ScopedEnv select("DDP_FABRIC_PROVIDER", forced ? "shm" : nullptr);
    auto outcomes = run_group(3, [&](int rank, std::shared_ptr<Store> store) {
      restrict_cross_memory_attach(rank == 1);
      try {
        auto comm = create_communicator("fabric", store, rank, 3, with_timeout(20s));
        auto* fabric = dynamic_cast<FabricCommunicator*>(comm.get());
        require(!forced, "forced shm connected without cross-memory attach");
        require(fabric && fabric->provider() == "tcp;ofi_rxm", "automatic choice was not tcp");
        std::vector<float> values(256 * 1024, static_cast<float>(rank + 1));  // 1 MiB
        comm->allreduce(values);
        require(values.front() == 6.0f && values.back() == 6.0f, "allreduce over tcp");
      } catch (const Error& e) {
        // ConfigError on each rank; a peer's reason relayed through the store is a CommError.
        require(forced, e.what());
        require(std::string(e.what()).find("cross-memory attach") != std::string::npos, e.what());
      }
    });
    EXPECT_TRUE(testing::all_ranks_succeeded(outcomes)) << (forced ? "forced shm" : "automatic");
  }
}

// FI_SHM_DISABLE_CMA turns cross-memory attach off inside libfabric whatever the kernel allows.
TEST(FabricProviderChoice, FiShmDisableCmaMeansTcpAutomatically) {
  ScopedEnv no_ddp("DDP_FABRIC_PROVIDER", nullptr);
  ScopedEnv no_fi("FI_PROVIDER", nullptr);
  ScopedEnv no_cma("FI_SHM_DISABLE_CMA", "1");
  auto outcomes = run_group(2, [&](int rank, std::shared_ptr<Store> store) {
    auto comm = create_communicator("fabric", store, rank, 2, with_timeout(20s));
    auto* fabric = dynamic_cast<FabricCommunicator*>(comm.get());
    require(fabric && fabric->provider() == "tcp;ofi_rxm", "automatic choice was not tcp");
    std::vector<float> values(256 * 1024, 1.0f);
    comm->allreduce(values);
    require(values.front() == 2.0f && values.back() == 2.0f, "allreduce over tcp");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(FabricProviderChoice, UnknownProviderIsAConfigErrorListingTheUsableOnes) {
  ScopedEnv select("DDP_FABRIC_PROVIDER", "no_such_provider");
  auto outcomes = run_group(1, [&](int rank, std::shared_ptr<Store> store) {
    try {
      create_communicator("fabric", store, rank, 1);
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      require(what.find("no_such_provider") != std::string::npos, what);
      require(what.find("shm") != std::string::npos, what);
      require(what.find('\n') == std::string::npos, what);
      return;
    }
    require(false, "expected ConfigError");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(FabricProviderChoice, PeersOfARankThatCannotOpenItsEndpointFailWithItsReason) {
  auto outcomes = run_group(2, [&](int rank, std::shared_ptr<Store> store) {
    ::setenv("DDP_FABRIC_PROVIDER", rank == 1 ? "no_such_provider" : "shm", 1);
    try {
      create_communicator("fabric", store, rank, 2, with_timeout(20s));
    } catch (const ConfigError&) {
      require(rank == 1, "rank 0 got the ConfigError");
      return;
    } catch (const CommError& e) {
      require(rank == 0 && e.peer() == 1, e.what());
      require(std::string(e.what()).find("no_such_provider") != std::string::npos, e.what());
      return;
    }
    require(false, "construction succeeded");
  });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// A provider queue set too small for the receives every communicator keeps posted: shm refuses
// the post (ENOMEM), ofi_rxm answers EAGAIN forever. Either way every rank fails at construction,
// within the timeout, with an error naming the variable that sets the queue's depth.
TEST(FabricQueues, AReceiveQueueTooSmallFailsConstructionNamingTheVariable) {
  struct Case {
    const char* provider;
    const char* variable;
  };
  for (const Case c : {Case{"shm", "FI_SHM_RX_SIZE"}, Case{"tcp;ofi_rxm", "FI_OFI_RXM_RX_SIZE"}}) {
    SCOPED_TRACE(c.provider);
    ScopedEnv provider("DDP_FABRIC_PROVIDER", c.provider);
    ScopedEnv depth(c.variable, "1");
    auto outcomes = run_group(2, [&](int rank, std::shared_ptr<Store> store) {
      try {
        create_communicator("fabric", store, rank, 2, with_timeout(2s));
      } catch (const CommError& e) {
        const std::string what = e.what();
        require(what.find(std::string("unset or raise ") + c.variable) != std::string::npos, what);
        return;
      }
      require(false, "construction succeeded with a receive queue 1 deep");
    });
    EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
  }
}

TEST(FabricQueues, ARingWithMoreChunksThanTheSendQueueHoldsCompletes) {
  // 64 chunks per block on 2 ranks against a send queue 16 deep, in chunks above what the
  // provider sends without the receiver (shm's 4 KiB injects, rxm's 64 KiB eager messages): a
  // ring that posts all of a step's chunks before its first receive fills the queue on both
  // ranks with sends neither can take, as a large enough buffer would at the default depth.
  struct Case {
    const char* provider;
    const char* variable;
    const char* chunk_bytes;
  };
  for (const Case c : {Case{"shm", "FI_SHM_TX_SIZE", "8192"},
                       Case{"tcp;ofi_rxm", "FI_OFI_RXM_TX_SIZE", "131072"}}) {
    SCOPED_TRACE(c.provider);
    ScopedEnv provider("DDP_FABRIC_PROVIDER", c.provider);
    ScopedEnv depth(c.variable, "16");
    ScopedEnv algorithm("DDP_ALGORITHM", "ring");
    ScopedEnv chunk("DDP_CHUNK_BYTES", c.chunk_bytes);
    const std::size_t count = 2 * 64 * static_cast<std::size_t>(std::stoi(c.chunk_bytes)) / 4;
    auto outcomes = run_group(2, [&](int rank, std::shared_ptr<Store> store) {
      auto comm = create_communicator("fabric", store, rank, 2, with_timeout(10s));
      std::vector<float> data(count, static_cast<float>(rank + 1));
      comm->allreduce(Buffer(data.data(), data.size(), DataType::kFloat32), ReduceOp::kSum);
      for (float v : data) require(v == 3.0f, "wrong sum " + std::to_string(v));
    });
    EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
  }
}

}  // namespace
}  // namespace ddp::detail::fabric
