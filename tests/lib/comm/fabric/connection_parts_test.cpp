// The pieces of fabric bring-up that need no fabric: provider choice, host identity, and the
// address records exchanged through the store.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/fabric/address_exchange.h"
#include "comm/fabric/cross_memory_attach.h"
#include "comm/fabric/fabric_info.h"
#include "comm/fabric/host_identity.h"
#include "comm/fabric/peer_liveness.h"
#include "comm/fabric/proc_stat.h"
#include "comm/fabric/provider_selection.h"
#include "comm/fabric/shm_region_names.h"
#include "ddp/error.h"
#include "ddp/store.h"
#include "scoped_env.h"

namespace ddp::detail::fabric {
namespace {

using testing::ScopedEnv;

TEST(FabricEnvironment, SetsLibfabricDefaultsTheCallerDidNotSet) {
  {
    ScopedEnv fork_safe("FI_EFA_FORK_SAFE", nullptr);
    ScopedEnv buffer("FI_OFI_RXM_BUFFER_SIZE", nullptr);
    ScopedEnv receives("FI_OFI_RXM_MSG_RX_SIZE", nullptr);
    prepare_fabric_environment();
    EXPECT_STREQ(std::getenv("FI_EFA_FORK_SAFE"), "1");
    EXPECT_STREQ(std::getenv("FI_OFI_RXM_BUFFER_SIZE"), "65536");
    EXPECT_STREQ(std::getenv("FI_OFI_RXM_MSG_RX_SIZE"), "128");
  }
  ScopedEnv fork_safe("FI_EFA_FORK_SAFE", "0");
  ScopedEnv buffer("FI_OFI_RXM_BUFFER_SIZE", "16384");
  ScopedEnv receives("FI_OFI_RXM_MSG_RX_SIZE", "1024");
  prepare_fabric_environment();
  EXPECT_STREQ(std::getenv("FI_EFA_FORK_SAFE"), "0");
  EXPECT_STREQ(std::getenv("FI_OFI_RXM_BUFFER_SIZE"), "16384");
  EXPECT_STREQ(std::getenv("FI_OFI_RXM_MSG_RX_SIZE"), "1024");
}

TEST(ChooseProvider, ExplicitSettingsWinInOrder) {
  EXPECT_EQ(choose_provider("shm", "tcp", true, 3, 8).provider, "shm");
  EXPECT_EQ(choose_provider(std::nullopt, "tcp", true, 3, 8).provider, "tcp");
  EXPECT_EQ(choose_provider(std::nullopt, "tcp", true, 3, 8).reason, "set by FI_PROVIDER");
}

// CommOptions::fabric_provider wins over both variables; the EFA probe does not run.
TEST(ChooseProvider, TheProviderSetInCodeWinsOverTheEnvironment) {
  ScopedEnv ddp_provider("DDP_FABRIC_PROVIDER", "shm");
  ScopedEnv fi_provider("FI_PROVIDER", "efa");
  bool probed = false;
  const auto probe = [&] {
    probed = true;
    return true;
  };
  const auto chosen = choose_provider_from_env(probe, 2, 4, "", std::string("tcp;ofi_rxm"));
  EXPECT_EQ(chosen.provider, "tcp;ofi_rxm");
  EXPECT_EQ(chosen.reason, "set by CommOptions::fabric_provider");
  EXPECT_EQ(choose_provider_from_env(probe, 2, 4, "").provider, "shm");
  EXPECT_FALSE(probed);
}

TEST(ChooseProvider, FiProviderFiltersAreNotAChoice) {
  EXPECT_EQ(choose_provider(std::nullopt, "^efa", false, 1, 2).provider, "shm");
  EXPECT_EQ(choose_provider(std::nullopt, "tcp,shm", false, 2, 2).provider, "tcp;ofi_rxm");
}

TEST(ChooseProvider, ShmOnOneHostThenEfaThenTcp) {
  // The ranks of one node use shared memory even beside an EFA device (a hierarchical job's
  // node groups), and EFA when shm cannot run.
  EXPECT_EQ(choose_provider(std::nullopt, std::nullopt, true, 1, 8).provider, "shm");
  EXPECT_EQ(choose_provider(std::nullopt, std::nullopt, true, 1, 8, "no room").provider, "efa");
  EXPECT_EQ(choose_provider(std::nullopt, std::nullopt, true, 4, 32).provider, "efa");
  const auto one_host = choose_provider(std::nullopt, std::nullopt, false, 1, 4);
  EXPECT_EQ(one_host.provider, "shm");
  EXPECT_NE(one_host.reason.find("4 ranks"), std::string::npos);
  const auto spread = choose_provider(std::nullopt, std::nullopt, false, 2, 4);
  EXPECT_EQ(spread.provider, "tcp;ofi_rxm");
  EXPECT_NE(spread.reason.find("2 hosts"), std::string::npos);
}

TEST(ChooseProvider, FallsBackToTcpWhenShmRegionsWouldNotFit) {
  const auto choice = choose_provider(std::nullopt, std::nullopt, false, 1, 8, "no room");
  EXPECT_EQ(choice.provider, "tcp;ofi_rxm");
  EXPECT_NE(choice.reason.find("no room"), std::string::npos);
  EXPECT_EQ(choose_provider("shm", std::nullopt, false, 1, 8, "no room").provider, "shm");
}

TEST(ChooseProvider, RecognisesSocketProviders) {
  EXPECT_TRUE(binds_to_ip_address("tcp;ofi_rxm"));
  EXPECT_TRUE(binds_to_ip_address("tcp"));
  EXPECT_TRUE(binds_to_ip_address("sockets"));
  EXPECT_FALSE(binds_to_ip_address("shm"));
  EXPECT_FALSE(binds_to_ip_address("efa"));
}

TEST(HostIdentity, DescribesThisProcessAndRoundTrips) {
  const auto self = HostIdentity::current("127.0.0.1");
  EXPECT_EQ(self.pid, ::getpid());
  EXPECT_EQ(self.route_address, "127.0.0.1");
  EXPECT_FALSE(self.host_key.empty());
  const auto back = HostIdentity::parse(self.serialize());
  EXPECT_EQ(back.host_key, self.host_key);
  EXPECT_EQ(back.pid, self.pid);
  EXPECT_EQ(back.route_address, self.route_address);
  EXPECT_NE(self.cma_probe, 0u);
  EXPECT_EQ(back.cma_probe, self.cma_probe);
  EXPECT_THROW(HostIdentity::parse("no pid line"), ConfigError);
  EXPECT_THROW(HostIdentity::parse("key\nnot-a-pid\n"), ConfigError);
}

TEST(CrossMemoryAttach, ReadsAPeersProbeWordAndSaysWhyNot) {
  // A child is a peer this process may read (its parent, with the same probe address).
  const pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    _exit(0);
  }
  EXPECT_EQ(cma_denied(child, cma_probe_address()), "");
  const std::string wrong_word = cma_denied(child, cma_probe_address() + 1);
  EXPECT_NE(wrong_word, "");
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  const std::string gone = cma_denied(child, cma_probe_address());
  EXPECT_NE(gone.find("process_vm_readv"), std::string::npos) << gone;
}

TEST(CrossMemoryAttach, FiShmDisableCmaIsReadAsLibfabricReadsIt) {
  ::unsetenv("FI_SHM_DISABLE_CMA");
  EXPECT_EQ(cma_disabled_by_environment(), "");
  ::setenv("FI_SHM_DISABLE_CMA", "0", 1);
  EXPECT_EQ(cma_disabled_by_environment(), "");
  ::setenv("FI_SHM_DISABLE_CMA", "yes", 1);
  EXPECT_NE(cma_disabled_by_environment().find("FI_SHM_DISABLE_CMA"), std::string::npos);
  ::setenv("FI_SHM_DISABLE_CMA", "maybe", 1);
  EXPECT_THROW(cma_disabled_by_environment(), ConfigError);
  ::unsetenv("FI_SHM_DISABLE_CMA");
}

TEST(HostIdentity, CountsHostsAndLocalIndices) {
  auto at = [](const char* key) {
    HostIdentity id;
    id.host_key = key;
    return id;
  };
  const std::vector<HostIdentity> ranks{at("a"), at("b"), at("a"), at("b"), at("a")};
  EXPECT_EQ(count_hosts(ranks), 2);
  EXPECT_EQ(local_index(ranks, 0), 0);
  EXPECT_EQ(local_index(ranks, 2), 1);
  EXPECT_EQ(local_index(ranks, 4), 2);
  EXPECT_EQ(local_index(ranks, 3), 1);
}

TEST(PeerLiveness, SeesExitedAndZombieProcesses) {
  EXPECT_FALSE(process_exited(::getpid()));
  EXPECT_FALSE(process_exiting(::getpid()));
  const pid_t child = ::fork();
  if (child == 0) _exit(0);
  // Unreaped, the child is a zombie: it counts as exited.
  for (int i = 0; i < 200 && !process_exited(child); ++i) ::usleep(5000);
  EXPECT_TRUE(process_exited(child));
  // A zombie has been through the kernel's exit: PF_EXITING is read from field 9.
  const auto stat = read_proc_stat(child);
  ASSERT_TRUE(stat);
  EXPECT_NE(stat->flags & 0x4, 0u) << "flags " << stat->flags;
  EXPECT_EQ(read_proc_stat(::getpid())->flags & 0x4, 0u);
  EXPECT_TRUE(process_exiting(child));
  PeerLiveness liveness({std::nullopt, ::getpid(), child});
  EXPECT_EQ(liveness.first_exited({true, true, true}), 2);
  EXPECT_EQ(liveness.first_exited({true, true, false}), std::nullopt);
  EXPECT_EQ(liveness.first_exited(), 2);
  EXPECT_FALSE(liveness.exiting(0));  // not watched: on another host
  EXPECT_FALSE(liveness.exiting(1));
  EXPECT_TRUE(liveness.exiting(2));
  EXPECT_FALSE(liveness.exiting(3));  // no such rank
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(process_exited(child));
  EXPECT_EQ(PeerLiveness({std::nullopt, ::getpid()}).first_exited({true, true}), std::nullopt);
}

// A peer reaped while its /proc/<pid>/stat is being read makes the read fail with ESRCH, which
// libstdc++'s filebuf turns into an exception. The checks run while a collective fails over a
// dead peer and must answer instead. The window is narrow, so race many children against a
// thread that reaps them.
TEST(PeerLiveness, ChecksNeverThrowWhileThePeerIsReaped) {
  int throws = 0, exits_seen = 0;
  for (int i = 0; i < 400; ++i) {
    const pid_t child = ::fork();
    if (child == 0) _exit(0);
    std::thread reaper([child] { ::waitpid(child, nullptr, 0); });
    // Keep checking until the child is seen gone (however slowly it exits, as under
    // sanitizers), and a while longer, so that checks straddle its exit and its reaping.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    bool seen = false;
    for (int k = 0; (k < 60 || !seen) && std::chrono::steady_clock::now() < give_up; ++k) {
      try {
        seen = process_exited(child) || seen;
        (void)process_start_time(child);
      } catch (const std::exception&) {
        ++throws;
      }
    }
    reaper.join();
    exits_seen += seen;
    EXPECT_TRUE(process_exited(child));
  }
  EXPECT_EQ(throws, 0);
  EXPECT_EQ(exits_seen, 400);
}

TEST(AddressExchange, HexRoundTripsArbitraryBytes) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  EXPECT_EQ(from_hex(to_hex(bytes)), bytes);
  EXPECT_EQ(to_hex("\x01\xab"), "01ab");
  EXPECT_THROW(from_hex("abc"), ConfigError);
  EXPECT_THROW(from_hex("zz"), ConfigError);
}

TEST(AddressExchange, CollectsAddressesOfVariableLengthInRankOrder) {
  auto store = Store::host(0, std::chrono::seconds(5));
  publish_endpoint(*store, 0, "shm", std::string("\0\1", 2));
  publish_endpoint(*store, 1, "shm", "a much longer address blob");
  const auto addresses = collect_addresses(*store, 0, 2, "shm");
  ASSERT_EQ(addresses.size(), 2u);
  EXPECT_EQ(addresses[0], std::string("\0\1", 2));
  EXPECT_EQ(addresses[1], "a much longer address blob");
}

TEST(AddressExchange, NamesThePeerThatFailedOrChoseAnotherProvider) {
  auto store = Store::host(0, std::chrono::seconds(5));
  publish_endpoint(*store, 0, "shm", "x");
  publish_failure(*store, 1, "fi_domain failed: no device");
  try {
    collect_addresses(*store, 0, 2, "shm");
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("no device"), std::string::npos);
  }
  auto other = Store::host(0, std::chrono::seconds(5));
  publish_endpoint(*other, 0, "shm", "x");
  publish_endpoint(*other, 1, "tcp;ofi_rxm", "y");
  try {
    collect_addresses(*other, 0, 2, "shm");
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_EQ(e.peer(), 1);
    EXPECT_NE(std::string(e.what()).find("DDP_FABRIC_PROVIDER"), std::string::npos);
  }
}

}  // namespace
}  // namespace ddp::detail::fabric

namespace ddp::detail::fabric {
namespace {

class ShmRegionNames : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ddp-shm-names-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    directory_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }
  void touch(const std::string& name) { std::ofstream(directory_ + "/" + name) << "x"; }
  bool exists(const std::string& name) { return std::filesystem::exists(directory_ + "/" + name); }
  std::string directory_;
};

TEST_F(ShmRegionNames, NameThisProcessAndParseBack) {
  const std::string name = shm_region_name(3);
  const auto owner = parse_region_owner(name);
  ASSERT_TRUE(owner) << name;
  EXPECT_EQ(owner->pid, ::getpid());
  EXPECT_EQ(owner->start_time, process_start_time(::getpid()).value());
  EXPECT_NE(shm_region_name(4), name);
  EXPECT_FALSE(parse_region_owner("12345:0:0"));
  EXPECT_FALSE(parse_region_owner("ddp-1-2"));
  EXPECT_FALSE(parse_region_owner("ddp-ns-notapid-1-0"));
}

TEST_F(ShmRegionNames, ReportsTheRoomLeftInTheirFilesystem) {
  const auto available = shm_bytes_available(directory_);
  ASSERT_TRUE(available);
  EXPECT_GT(*available, 0u);
  EXPECT_FALSE(shm_bytes_available(directory_ + "/missing"));
}

TEST_F(ShmRegionNames, ReclaimRemovesOnlyOurRegionsWhoseOwnerIsGone) {
  const pid_t child = ::fork();
  if (child == 0) _exit(0);
  ::waitpid(child, nullptr, 0);
  const auto self = parse_region_owner(shm_region_name(0)).value();
  const std::string ns = self.pid_namespace;
  const std::string live = shm_region_name(0);
  const std::string dead = "ddp-" + ns + "-" + std::to_string(child) + "-1-0";
  const std::string reused_pid = "ddp-" + ns + "-" + std::to_string(::getpid()) + "-" +
                                 std::to_string(self.start_time + 1) + "-0";
  const std::string other_namespace = "ddp-1-" + std::to_string(child) + "-1-0";
  for (const auto& name : {live, dead, reused_pid, other_namespace, std::string("12345:0:0")}) {
    touch(name);
  }
  EXPECT_EQ(reclaim_dead_shm_regions(directory_), 2);
  EXPECT_TRUE(exists(live));
  EXPECT_FALSE(exists(dead));
  EXPECT_FALSE(exists(reused_pid));
  EXPECT_TRUE(exists(other_namespace));
  EXPECT_TRUE(exists("12345:0:0"));
}

}  // namespace
}  // namespace ddp::detail::fabric
