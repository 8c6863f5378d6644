#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "ddp/net/local_address.h"
#include "ddp/net/tcp_probe.h"
#include "ddp/store.h"
#include "multiprocess.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;

TEST(Store, SetGetAddAcrossClients) {
  auto server = Store::host(0, 5s);
  auto client = Store::connect("127.0.0.1", server->port(), 5s);
  server->set("k", std::string("v\0w", 3));
  EXPECT_EQ(client->get("k"), std::string("v\0w", 3));
  EXPECT_EQ(client->add("n", 2), 2);
  EXPECT_EQ(server->add("n", 3), 5);
  EXPECT_TRUE(client->check({"k", "n"}));
  EXPECT_FALSE(client->check({"missing"}));
  EXPECT_TRUE(client->remove("k"));
  EXPECT_FALSE(client->check({"k"}));
}

TEST(Store, TcpStoresNameTheirBackend) {
  auto server = Store::host(0, 5s);
  EXPECT_STREQ(server->backend_name(), "tcp");
  EXPECT_STREQ(server->with_prefix("p")->backend_name(), "tcp");
  EXPECT_EQ(server->protocol(), StoreProtocol::kModern);
}

TEST(Store, PrefixesSeparateKeySpaces) {
  auto server = Store::host(0, 5s);
  auto a = server->with_prefix("a");
  auto b = server->with_prefix("b");
  a->set("x", "1");
  b->set("x", "2");
  EXPECT_EQ(a->get("x"), "1");
  EXPECT_EQ(b->get("x"), "2");
  EXPECT_EQ(server->get("a/x"), "1");
  EXPECT_EQ(a->with_prefix("inner")->prefix(), "a/inner");
}

TEST(Store, ListKeysGivesTheKeysUnderThePrefixSorted) {
  auto server = Store::host(0, 5s);
  auto client = Store::connect("127.0.0.1", server->port(), 5s);
  client->set("top", "1");
  client->with_prefix("a")->set("y/z", "2");
  client->with_prefix("a")->set("x", "3");
  client->with_prefix("ab")->set("x", "4");  // "ab/x": not under "a/"
  EXPECT_EQ(client->with_prefix("a")->list_keys(), (std::vector<std::string>{"x", "y/z"}));
  EXPECT_EQ(client->list_keys(), (std::vector<std::string>{"a/x", "a/y/z", "ab/x", "top"}));
  EXPECT_TRUE(client->with_prefix("none")->list_keys().empty());
  EXPECT_EQ(server->list_keys(), client->list_keys());
}

TEST(Store, ListKeysFromALegacyClientSaysWhichPyTorchHasIt) {
  auto server = Store::host(0, 5s);
  auto legacy = Store::connect("127.0.0.1", server->port(), 5s, {{}, StoreProtocol::kLegacy});
  try {
    legacy->list_keys();
    FAIL() << "a legacy connection listed keys";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("LIST_KEYS needs a PyTorch 2.10+ store"),
              std::string::npos)
        << e.what();
  }
}

TEST(Store, CompareSetOnlyReplacesTheExpectedValue) {
  auto server = Store::host(0, 5s);
  EXPECT_EQ(server->compare_set("leader", "", "rank0"), "rank0");
  EXPECT_EQ(server->compare_set("leader", "", "rank1"), "rank0");
  EXPECT_EQ(server->compare_set("leader", "rank0", "rank2"), "rank2");
}

TEST(Store, GetOfAMissingKeyTimesOutWithTheKeyInTheMessage) {
  auto server = Store::host(0, 300ms);
  try {
    server->get("never-set");
    FAIL() << "get of a missing key returned";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("never-set"), std::string::npos) << e.what();
  }
}

TEST(Store, WaitReturnsOnceAnotherClientSetsTheKey) {
  auto server = Store::host(0, 5s);
  auto client = Store::connect("127.0.0.1", server->port(), 5s);
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    server->set("ready", "1");
  });
  EXPECT_NO_THROW(client->wait({"ready"}, 5s));
  setter.join();
}

TEST(Store, UnreachableStoreFailsWithinTheTimeoutNamingTheEndpoint) {
  // Port 1 on loopback is never served here; the connect must give up, not hang.
  const auto start = std::chrono::steady_clock::now();
  try {
    Store::connect("127.0.0.1", 1, 1s);
    FAIL() << "connect to a closed port succeeded";
  } catch (const StoreError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("127.0.0.1:1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MASTER_ADDR"), std::string::npos) << msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

// Workers start while ddprun is still bringing its store up: connecting must wait for it.
TEST(Store, ConnectWaitsForAStoreThatComesUpLater) {
  const int port = testing::free_tcp_port();
  std::shared_ptr<Store> server;
  std::thread host([&] {
    std::this_thread::sleep_for(300ms);
    server = Store::host(port, 5s);
  });
  std::shared_ptr<Store> client;
  EXPECT_NO_THROW(client = Store::connect("127.0.0.1", port, 10s));
  host.join();
  ASSERT_TRUE(client && server);
  client->set("k", "v");
  EXPECT_EQ(server->get("k"), "v");
}

TEST(TcpProbe, NamesTheAddressAndTheCauseWhenNothingListens) {
  const int port = testing::free_tcp_port();
  const std::string why = net::probe_tcp("127.0.0.1", port);
  EXPECT_NE(why.find("127.0.0.1:" + std::to_string(port) + ": Connection refused"),
            std::string::npos)
      << why;
  EXPECT_NE(net::probe_tcp("no-such-host.invalid", port).find("cannot resolve"), std::string::npos);
  auto server = Store::host(port, 5s);
  EXPECT_EQ(net::probe_tcp("127.0.0.1", port), "");
}

TEST(LocalAddress, LoopbackRoutesThroughLoopback) {
  EXPECT_EQ(net::local_address_towards("127.0.0.1"), "127.0.0.1");
  EXPECT_TRUE(net::is_loopback("127.0.1.1"));
  EXPECT_FALSE(net::is_loopback("10.0.0.1"));
}

TEST(LocalAddress, UnresolvableHostIsAConfigError) {
  EXPECT_THROW(net::local_address_towards("no-such-host.invalid"), ConfigError);
}

}  // namespace
}  // namespace ddp
