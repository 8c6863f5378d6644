// The pieces of fabric bring-up that need no fabric: provider choice, host identity, and the
// address records exchanged through the store.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/fabric/address_exchange.h"
#include "comm/fabric/host_identity.h"
#include "comm/fabric/peer_liveness.h"
#include "comm/fabric/provider_selection.h"
#include "ddp/error.h"
#include "ddp/store.h"

namespace ddp::detail::fabric {
namespace {

TEST(ChooseProvider, ExplicitSettingsWinInOrder) {
  EXPECT_EQ(choose_provider("shm", "tcp", true, 3, 8).provider, "shm");
  EXPECT_EQ(choose_provider(std::nullopt, "tcp", true, 3, 8).provider, "tcp");
  EXPECT_EQ(choose_provider(std::nullopt, "tcp", true, 3, 8).reason, "set by FI_PROVIDER");
}

TEST(ChooseProvider, FiProviderFiltersAreNotAChoice) {
  EXPECT_EQ(choose_provider(std::nullopt, "^efa", false, 1, 2).provider, "shm");
  EXPECT_EQ(choose_provider(std::nullopt, "tcp,shm", false, 2, 2).provider, "tcp;ofi_rxm");
}

TEST(ChooseProvider, EfaThenShmOnOneHostThenTcp) {
  EXPECT_EQ(choose_provider(std::nullopt, std::nullopt, true, 1, 8).provider, "efa");
  EXPECT_EQ(choose_provider(std::nullopt, std::nullopt, true, 4, 32).provider, "efa");
  const auto one_host = choose_provider(std::nullopt, std::nullopt, false, 1, 4);
  EXPECT_EQ(one_host.provider, "shm");
  EXPECT_NE(one_host.reason.find("4 ranks"), std::string::npos);
  const auto spread = choose_provider(std::nullopt, std::nullopt, false, 2, 4);
  EXPECT_EQ(spread.provider, "tcp;ofi_rxm");
  EXPECT_NE(spread.reason.find("2 hosts"), std::string::npos);
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
  EXPECT_THROW(HostIdentity::parse("no pid line"), ConfigError);
  EXPECT_THROW(HostIdentity::parse("key\nnot-a-pid\n"), ConfigError);
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
  const pid_t child = ::fork();
  if (child == 0) _exit(0);
  // Unreaped, the child is a zombie: it counts as exited.
  for (int i = 0; i < 200 && !process_exited(child); ++i) ::usleep(5000);
  EXPECT_TRUE(process_exited(child));
  PeerLiveness liveness({std::nullopt, ::getpid(), child});
  EXPECT_EQ(liveness.first_exited(), 2);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(process_exited(child));
  EXPECT_EQ(PeerLiveness({std::nullopt, ::getpid()}).first_exited(), std::nullopt);
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
