#include "store/etcd_backend.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "ddp/store.h"
#include "etcd_server.h"
#include "multiprocess.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

class EtcdStore : public testing::EtcdSuite {
 protected:
  static EtcdOptions options() {
    EtcdOptions options;
    options.endpoint = server_->endpoint();
    return options;
  }

  // A client whose keys live under a prefix of this case's own.
  static std::shared_ptr<Store> client(milliseconds timeout = 5s) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return Store::etcd(options(), 5s, timeout)
        ->with_prefix(std::string("/ddp-test/") + info->name());
  }
};

TEST_F(EtcdStore, SetAndGetRoundTripAnyBytes) {
  auto store = client();
  const std::string key("k\0\xff\x80 key", 8);
  const std::string value("v\0\xfe\xff\xc3\x28 not utf-8", 16);
  store->set(key, value);
  EXPECT_EQ(store->get(key), value);
  store->set("empty", "");
  EXPECT_EQ(store->get("empty"), "");
  store->set(key, "replaced");
  EXPECT_EQ(store->get(key), "replaced");
  EXPECT_STREQ(store->backend_name(), "etcd");
  EXPECT_EQ(store->endpoint_host(), "127.0.0.1");
  EXPECT_EQ(store->timeout(), 5s);
}

TEST_F(EtcdStore, GetWaitsForAKeySetLaterByAnotherClient) {
  auto reader = client();
  auto writer = client();
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    writer->set("late", "here");
  });
  const auto start = Clock::now();
  EXPECT_EQ(reader->get("late"), "here");
  EXPECT_GE(since(start), 150ms);
  EXPECT_LT(since(start), 4s);
  setter.join();
}

TEST_F(EtcdStore, WaitTimesOutWithTheKeyAndEndpointInTheMessage) {
  auto store = client();
  const auto start = Clock::now();
  try {
    store->wait({"never-set", "other"}, 300ms);
    FAIL() << "wait for a missing key returned";
  } catch (const StoreError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("never-set"), std::string::npos) << message;
    EXPECT_NE(message.find("2 key(s)"), std::string::npos) << message;
    EXPECT_NE(message.find("timed out"), std::string::npos) << message;
    EXPECT_NE(message.find(server_->endpoint()), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_GE(since(start), 250ms);
  EXPECT_LT(since(start), 3s);
  // get() waits the store's timeout.
  auto quick = client(400ms);
  EXPECT_THROW(quick->get("never-set"), StoreError);
}

TEST_F(EtcdStore, AddFromFourThreadsCountsEveryIncrement) {
  // Two clients of their own and two sharing one: contention across connections and on one.
  auto shared = client();
  std::vector<std::shared_ptr<Store>> stores = {client(), client(), shared, shared};
  std::vector<std::vector<int64_t>> seen(stores.size());
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < stores.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) seen[t].push_back(stores[t]->add("counter", 1));
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(shared->add("counter", 0), 200);
  EXPECT_EQ(shared->get("counter"), "200");
  // Every increment saw a value of its own.
  std::vector<int64_t> all;
  for (const auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  ASSERT_EQ(all.size(), 200u);
  for (int64_t i = 0; i < 200; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], i + 1);
}

TEST_F(EtcdStore, AddOnAMissingKeyStartsFromZero) {
  auto store = client();
  EXPECT_FALSE(store->check({"n"}));
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -7), -2);
  EXPECT_EQ(store->get("n"), "-2");
  store->set("text", "abc");
  try {
    store->add("text", 1);
    FAIL() << "add on a non-integer value returned";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("not an integer"), std::string::npos) << e.what();
  }
}

TEST_F(EtcdStore, CompareSetFollowsTheC10dStore) {
  auto store = client();
  // Missing key, empty expected: sets.
  EXPECT_EQ(store->compare_set("leader", "", "rank0"), "rank0");
  EXPECT_EQ(store->get("leader"), "rank0");
  // Existing key, empty expected: the current value, unchanged.
  EXPECT_EQ(store->compare_set("leader", "", "rank1"), "rank0");
  // Wrong expected: the current value, unchanged.
  EXPECT_EQ(store->compare_set("leader", "rank9", "rank1"), "rank0");
  EXPECT_EQ(store->get("leader"), "rank0");
  // Right expected: swaps.
  EXPECT_EQ(store->compare_set("leader", "rank0", "rank2"), "rank2");
  EXPECT_EQ(store->get("leader"), "rank2");
  // Missing key, non-empty expected: `expected` comes back and nothing is set.
  EXPECT_EQ(store->compare_set("absent", "x", "y"), "x");
  EXPECT_FALSE(store->check({"absent"}));
  // An existing empty value matches an empty expected.
  store->set("blank", "");
  EXPECT_EQ(store->compare_set("blank", "", "filled"), "filled");
  EXPECT_EQ(store->get("blank"), "filled");
}

TEST_F(EtcdStore, AppendCreatesThenExtends) {
  auto store = client();
  store->append("log", "a");
  store->append("log", std::string("\0b", 2));
  store->append("log", "c");
  EXPECT_EQ(store->get("log"), std::string("a\0bc", 4));
}

TEST_F(EtcdStore, CheckTellsWhetherEveryKeyExists) {
  auto store = client();
  EXPECT_TRUE(store->check({}));
  EXPECT_FALSE(store->check({"x"}));
  store->set("x", "1");
  EXPECT_TRUE(store->check({"x"}));
  EXPECT_FALSE(store->check({"x", "y"}));
  store->set("y", "");
  EXPECT_TRUE(store->check({"x", "y"}));
}

TEST_F(EtcdStore, MultiSetAndMultiGetCrossTheTransactionLimit) {
  auto store = client();
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("key" + std::to_string(i));
    values.push_back("value" + std::to_string(i) + std::string(1, '\0'));
  }
  store->multi_set(keys, values);
  EXPECT_TRUE(store->check(keys));
  EXPECT_EQ(store->multi_get(keys), values);
  EXPECT_EQ(store->get("key299"), values[299]);
  EXPECT_THROW(store->multi_set({"a", "b"}, {"1"}), StoreError);
}

TEST_F(EtcdStore, RemoveSaysWhetherTheKeyExisted) {
  auto store = client();
  store->set("gone", "1");
  EXPECT_TRUE(store->remove("gone"));
  EXPECT_FALSE(store->check({"gone"}));
  EXPECT_FALSE(store->remove("gone"));
}

TEST_F(EtcdStore, PrefixesSeparateKeySpaces) {
  auto store = client();
  auto a = store->with_prefix("a");
  auto b = store->with_prefix("b");
  a->set("x", "1");
  b->set("x", "2");
  EXPECT_EQ(a->get("x"), "1");
  EXPECT_EQ(b->get("x"), "2");
  EXPECT_EQ(store->get("a/x"), "1");
  EXPECT_FALSE(a->check({"b/x"}));
  EXPECT_EQ(a->add("n", 1), 1);
  EXPECT_EQ(b->add("n", 10), 10);
}

TEST_F(EtcdStore, NumKeysCountsEveryKeyOfTheCluster) {
  auto store = client();
  const int64_t before = store->num_keys();
  store->multi_set({"one", "two", "three"}, {"1", "2", "3"});
  EXPECT_EQ(store->num_keys(), before + 3);
  store->remove("two");
  EXPECT_EQ(store->num_keys(), before + 2);
}

TEST_F(EtcdStore, ListKeysGivesTheKeysUnderThePrefixSorted) {
  auto store = client();
  store->with_prefix("a")->set("y/z", "1");
  store->with_prefix("a")->set("x", "2");
  store->with_prefix("ab")->set("x", "3");      // not under "a/"
  store->set(std::string("\xff\xff", 2), "4");  // a prefix range's end past 0xff bytes
  EXPECT_EQ(store->with_prefix("a")->list_keys(), (std::vector<std::string>{"x", "y/z"}));
  EXPECT_EQ(store->list_keys(),
            (std::vector<std::string>{"a/x", "a/y/z", "ab/x", std::string("\xff\xff", 2)}));
  EXPECT_TRUE(store->with_prefix("none")->list_keys().empty());
}

TEST_F(EtcdStore, AnEtcdErrorNamesTheOperationKeyAndEndpoint) {
  // The root view with an empty key: etcd refuses a put of no key.
  auto root = Store::etcd(options(), 5s);
  try {
    root->set("", "x");
    FAIL() << "a put of an empty key succeeded";
  } catch (const StoreError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("etcd at " + server_->endpoint() + ": put '': HTTP 400: "),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("key is not provided"), std::string::npos) << message;
  }
}

// ---- without an etcd --------------------------------------------------------------------------

TEST(EtcdConnect, AnUnreachableEndpointFailsWithinTheTimeoutNamingIt) {
  const auto start = Clock::now();
  EtcdOptions options;
  options.endpoint = "127.0.0.1:1";  // never served here
  try {
    Store::etcd(options, 1s);
    FAIL() << "connecting to a closed port succeeded";
  } catch (const StoreUnreachableError& e) {
    const std::string message = e.what();
    // The cause alone, for a caller that retries and words its own message (ddprun).
    EXPECT_EQ(e.cause(), "connection refused") << message;
    EXPECT_NE(message.find("cannot reach etcd at 127.0.0.1:1 within 1.0 s"), std::string::npos)
        << message;
    EXPECT_NE(message.find("refused"), std::string::npos) << message;
    EXPECT_NE(message.find("--rdzv-endpoint"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_GE(since(start), 900ms);
  EXPECT_LT(since(start), 5s);
}

// An HTTP server that answers every request 404, as a server that is not etcd would.
class NotFoundServer {
 public:
  NotFoundServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd_, 16) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("cannot listen on loopback");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~NotFoundServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  int port() const { return port_; }
  int answered() const { return answered_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      // Reads the request (headers, then Content-Length bytes of body) for at most 2 s.
      std::string in;
      const auto deadline = Clock::now() + 2s;
      std::size_t want = std::string::npos;
      while (Clock::now() < deadline && (want == std::string::npos || in.size() < want)) {
        pollfd q{c, POLLIN, 0};
        if (poll(&q, 1, 50) <= 0) continue;
        char buf[4096];
        const ssize_t r = recv(c, buf, sizeof(buf), 0);
        if (r <= 0) break;
        in.append(buf, static_cast<std::size_t>(r));
        const auto end = in.find("\r\n\r\n");
        if (want == std::string::npos && end != std::string::npos) {
          std::size_t length = 0;
          std::string lower = in.substr(0, end);
          std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
          const auto at = lower.find("content-length:");
          if (at != std::string::npos) length = std::stoul(lower.substr(at + 15));
          want = end + 4 + length;
        }
      }
      const std::string answer =
          "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n"
          "Connection: close\r\n\r\nNot Found\n";
      // Counted before the answer goes: the client may check the count as soon as it reads it.
      ++answered_;
      (void)!send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      close(c);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> answered_{0};
  std::thread thread_;
};

TEST(EtcdConnect, AServerThatIsNotEtcdFailsAtOnceSayingSo) {
  NotFoundServer server;
  EtcdOptions options;
  options.endpoint = "http://127.0.0.1:" + std::to_string(server.port());
  const auto start = Clock::now();
  try {
    Store::etcd(options, 5s);
    FAIL() << "a 404 server passed for etcd";
  } catch (const StoreError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos)
        << message;
    EXPECT_NE(message.find("answered HTTP 404 to /v3/kv/range"), std::string::npos) << message;
    EXPECT_NE(message.find("is this etcd 3.4 or newer?"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  // Not retried until the timeout: an answer that is not etcd's will not become one.
  EXPECT_LT(since(start), 3s);
  EXPECT_GE(server.answered(), 1);
}

TEST(EtcdConnect, OptionsThatCannotWorkAreConfigErrors) {
  EtcdOptions options;
  options.endpoint = "127.0.0.1:2379";
  options.protocol = "grpc";
  EXPECT_THROW(Store::etcd(options, 1s), ConfigError);
  options.protocol = "https";
  options.cacert = "/nonexistent/ca.pem";
  EXPECT_THROW(Store::etcd(options, 1s), ConfigError);
  options.endpoint = "ftp://127.0.0.1:2379";
  EXPECT_THROW(Store::etcd(options, 1s), ConfigError);
}

TEST(EtcdEndpoint, ParsesHostPortAndScheme) {
  using detail::parse_etcd_endpoint;
  auto e = parse_etcd_endpoint("10.0.0.5");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->scheme, "");
  EXPECT_EQ(e->host, "10.0.0.5");
  EXPECT_EQ(e->port, 2379);
  e = parse_etcd_endpoint("etcd.default.svc:12379");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->host, "etcd.default.svc");
  EXPECT_EQ(e->port, 12379);
  e = parse_etcd_endpoint("https://etcd:2379/");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->scheme, "https");
  EXPECT_EQ(e->host, "etcd");
  e = parse_etcd_endpoint("http://[::1]:23790");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->scheme, "http");
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, 23790);
  e = parse_etcd_endpoint("fe80::1");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->host, "fe80::1");
  EXPECT_EQ(e->port, 2379);
  for (const char* bad : {"", "ftp://h:1", "h:", "h:0", "h:x", "h:70000", "a:1,b:2", "[::1",
                          "http://", "h:1/v3", ":2379"}) {
    EXPECT_FALSE(parse_etcd_endpoint(bad)) << bad;
  }
}

}  // namespace
}  // namespace ddp
