// ddp::StoreServer on the wire: both dialects from raw sockets, torch's semantics for the
// queries no PyTorch test reaches (1.13 watches, queues, a cancelled wait, GET of a missing key),
// join tokens, and robustness against garbage: a seeded random-bytes client, truncated frames and
// absurd lengths never crash the server, never make it allocate without bound, and close only
// the offending connection while others keep being served.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <time.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "ddp/store.h"
#include "ddp/store_server.h"
#include "raw_client.h"
#include "scoped_env.h"
#include "store/wire.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using store::Dialect;
using store::Op;
using store::Writer;

int64_t as_i64(const std::string& bytes) {
  int64_t v = 0;
  std::memcpy(&v, bytes.data(), sizeof(v));
  return v;
}

std::string vec(const std::string& s) {
  Writer w;
  w.bytes(s);
  return w.data();
}

TEST(StoreServer, ServesBothDialectsOnOnePort) {
  StoreServer server({});
  Raw legacy(server.port());
  Raw modern(server.port());
  Writer set;
  set.u8(code(Dialect::kLegacy, Op::kSet)).bytes("k").bytes("from 1.13");
  ASSERT_TRUE(legacy.send(set.data()));
  Writer get;
  get.u8(code(Dialect::kModern, Op::kGet)).bytes("k");
  ASSERT_TRUE(modern.send(validate() + get.data()));
  EXPECT_EQ(modern.read(8 + 9), vec("from 1.13"));
  // The same query byte means ADD to 1.13 and GET to 2.x: each connection keeps its dialect.
  Writer add;
  add.u8(code(Dialect::kLegacy, Op::kAdd)).bytes("n").value<int64_t>(7);
  ASSERT_TRUE(legacy.send(add.data()));
  EXPECT_EQ(as_i64(legacy.read(8)), 7);
  Writer ping;
  ping.u8(code(Dialect::kModern, Op::kPing)).value<uint32_t>(0xDEADBEEF);
  ASSERT_TRUE(modern.send(ping.data()));
  uint32_t echo = 0;
  std::memcpy(&echo, modern.read(4).data(), 4);
  EXPECT_EQ(echo, 0xDEADBEEFU);
}

TEST(StoreServer, GetOfAMissingKeyAnswersEmptyAndCancelWaitEndsAWait) {
  StoreServer server({});
  Raw c(server.port());
  Writer get;
  get.u8(code(Dialect::kModern, Op::kGet)).bytes("missing");
  ASSERT_TRUE(c.send(validate() + get.data()));
  EXPECT_EQ(c.read(8), vec(""));
  Writer wait;
  wait.u8(code(Dialect::kModern, Op::kWait)).value<uint64_t>(1).bytes("never");
  ASSERT_TRUE(c.send(wait.data()));
  EXPECT_EQ(c.read(1, 200ms), "");  // still waiting
  ASSERT_TRUE(c.send(std::string(1, static_cast<char>(code(Dialect::kModern, Op::kCancelWait)))));
  EXPECT_EQ(c.read(1), std::string(1, static_cast<char>(store::kWaitCanceled)));
  // The cancelled wait is gone: setting the key sends nothing more on this connection.
  Raw other(server.port());
  Writer set;
  set.u8(code(Dialect::kModern, Op::kSet)).bytes("never").bytes("x");
  ASSERT_TRUE(other.send(validate() + set.data()));
  EXPECT_EQ(c.read(1, 300ms), "");
}

TEST(StoreServer, LegacyWatchKeyReportsChanges) {
  StoreServer server({});
  Raw watcher(server.port());
  Writer watch;
  watch.u8(code(Dialect::kLegacy, Op::kWatchKey)).bytes("w");
  ASSERT_TRUE(watcher.send(watch.data()));
  EXPECT_EQ(watcher.read(1), std::string(1, static_cast<char>(store::kWatchCallbackRegistered)));
  Raw writer(server.port());
  Writer set;
  set.u8(code(Dialect::kLegacy, Op::kSet)).bytes("w").bytes("v");
  ASSERT_TRUE(writer.send(set.data()));
  Writer expected;
  expected.u8(store::kWatchKeyCreated).bytes("w").bytes("").bytes("v");
  EXPECT_EQ(watcher.read(expected.data().size()), expected.data());
}

TEST(StoreServer, QueuesPushPopAndWakeOneWaiter) {
  StoreServer server({});
  Raw a(server.port());
  Raw b(server.port());
  ASSERT_TRUE(a.send(validate()));
  ASSERT_TRUE(b.send(validate()));
  Writer wait;
  wait.u8(code(Dialect::kModern, Op::kWait)).value<uint64_t>(1).bytes("q");
  ASSERT_TRUE(a.send(wait.data()));
  Writer push;
  push.u8(code(Dialect::kModern, Op::kQueuePush)).bytes("q").bytes("item");
  Writer len;
  len.u8(code(Dialect::kModern, Op::kQueueLen)).bytes("q");
  ASSERT_TRUE(b.send(push.data() + len.data()));
  EXPECT_EQ(as_i64(b.read(8)), 1);
  EXPECT_EQ(a.read(1), std::string(1, static_cast<char>(store::kStopWaiting)));
  Writer pop;
  pop.u8(code(Dialect::kModern, Op::kQueuePop)).bytes("q");
  ASSERT_TRUE(a.send(pop.data() + pop.data()));
  EXPECT_EQ(as_i64(a.read(8)), 1);
  EXPECT_EQ(a.read(12), vec("item"));
  EXPECT_EQ(as_i64(a.read(8)), 0);  // empty now: the size alone
}

TEST(StoreServer, ListKeysAnswersEveryKeySortedWithoutQueues) {
  // Byte 17 is PyTorch 2.10's LIST_KEYS; the answer is a count, then each key as
  // (length, bytes), as its servers send it.
  ASSERT_EQ(code(Dialect::kModern, Op::kListKeys), 17);
  EXPECT_FALSE(store::encode_op(Dialect::kLegacy, Op::kListKeys).has_value());
  StoreServer server({});
  Raw c(server.port());
  Writer setup;
  setup.u8(code(Dialect::kModern, Op::kSet)).bytes("b/2").bytes("x");
  setup.u8(code(Dialect::kModern, Op::kSet)).bytes("a").bytes("y");
  setup.u8(code(Dialect::kModern, Op::kQueuePush)).bytes("q").bytes("item");
  Writer list;
  list.u8(17);
  ASSERT_TRUE(c.send(validate() + setup.data() + list.data()));
  Writer expected;
  expected.value<int64_t>(2).bytes("a").bytes("b/2");
  EXPECT_EQ(c.read(expected.data().size()), expected.data());
}

TEST(StoreServer, BarrierReleasesEveryArrivalWhenTheLastOneComes) {
  // Byte 18 is BARRIER on PyTorch main: a key and the world size; each arrival waits for
  // STOP_WAITING, which the last one gets at once and which wakes the others.
  ASSERT_EQ(code(Dialect::kModern, Op::kBarrier), 18);
  StoreServer server({});
  Raw a(server.port());
  Raw b(server.port());
  Raw c(server.port());
  Writer arrive;
  arrive.u8(18).bytes("bar").value<int64_t>(3);
  ASSERT_TRUE(a.send(validate() + arrive.data()));
  ASSERT_TRUE(b.send(validate() + arrive.data()));
  EXPECT_EQ(a.read(1, 200ms), "");  // two of three: both wait
  EXPECT_EQ(b.read(1, 50ms), "");
  ASSERT_TRUE(c.send(validate() + arrive.data()));
  const std::string stop(1, static_cast<char>(store::kStopWaiting));
  EXPECT_EQ(c.read(1), stop);
  EXPECT_EQ(a.read(1), stop);
  EXPECT_EQ(b.read(1), stop);
  Writer get;
  get.u8(code(Dialect::kModern, Op::kGet)).bytes("bar");
  ASSERT_TRUE(a.send(get.data()));
  EXPECT_EQ(a.read(9), vec("3"));  // the counter, as torch keeps it
}

TEST(StoreServer, AnUnknownQueryClosesOnlyThatConnection) {
  StoreServer server({});
  Raw good(server.port());
  ASSERT_TRUE(good.send(validate()));
  Raw bad(server.port());
  ASSERT_TRUE(bad.send(validate() + std::string(1, static_cast<char>(200))));
  EXPECT_TRUE(bad.closed());
  EXPECT_EQ(server.stats().protocol_errors, 1u);
  Writer num;
  num.u8(code(Dialect::kModern, Op::kNumKeys));
  ASSERT_TRUE(good.send(num.data()));
  EXPECT_EQ(good.read(8).size(), 8u);
}

TEST(StoreServer, AbsurdLengthsAreRejectedWithoutAllocating) {
  StoreServer server({});
  const long before = rss_kib();
  for (const uint64_t n :
       {uint64_t{1} << 40, uint64_t{1} << 63, ~uint64_t{0}, uint64_t{65} << 20}) {
    Raw c(server.port());
    Writer w;  // a 2.x SET whose key claims n bytes
    w.u8(code(Dialect::kModern, Op::kSet)).value<uint64_t>(n);
    ASSERT_TRUE(c.send(validate() + w.data() + std::string(64, 'x')));
    EXPECT_TRUE(c.closed()) << n;
    Raw legacy(server.port());
    Writer count;  // a 1.13 WAIT on 2^40 keys
    count.u8(code(Dialect::kLegacy, Op::kWait)).value<uint64_t>(n);
    ASSERT_TRUE(legacy.send(count.data()));
    EXPECT_TRUE(legacy.closed()) << n;
  }
  // A value over the limit whose bytes do arrive is refused before it is all buffered.
  {
    Raw c(server.port());
    Writer w;
    w.u8(code(Dialect::kModern, Op::kSet)).bytes("k").value<uint64_t>(uint64_t{1} << 30);
    ASSERT_TRUE(c.send(validate() + w.data()));
    EXPECT_TRUE(c.closed());
  }
  EXPECT_LT(rss_kib() - before, 64 * 1024) << "the server's process grew by more than 64 MiB";
  EXPECT_EQ(server.stats().protocol_errors, 9u);
}

TEST(StoreServer, SeededGarbageNeverCrashesItAndAWellBehavedClientIsServedThroughout) {
  StoreServer server({});
  auto store = Store::connect("127.0.0.1", server.port(), 10s);
  std::mt19937_64 rng(20261127);
  const long before = rss_kib();
  for (int round = 0; round < 300; ++round) {
    Raw c(server.port());
    std::string bytes;
    const int kind = round % 3;
    if (kind == 0) {  // pure noise
      bytes.resize(1 + rng() % 512);
      for (auto& b : bytes) b = static_cast<char>(rng());
    } else {  // a valid-looking request, then truncated or with one byte flipped
      Writer w;
      const Dialect d = rng() % 2 ? Dialect::kModern : Dialect::kLegacy;
      if (d == Dialect::kModern) w.u8(0).value(store::kValidationMagic);
      const auto op = static_cast<Op>(1 + rng() % 17);
      if (const auto byte = store::encode_op(d, op)) w.u8(*byte);
      w.bytes(std::string(rng() % 40, 'k')).bytes(std::string(rng() % 200, 'v')).value(rng());
      bytes = w.data();
      if (kind == 1) {
        bytes.resize(rng() % bytes.size());
      } else {
        bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
      }
    }
    c.send(bytes);
    if (round % 25 == 0) {
      store->set("alive", std::to_string(round));
      ASSERT_EQ(store->get("alive"), std::to_string(round));
    }
  }
  EXPECT_EQ(store->add("still", 1), 1);
  EXPECT_LT(rss_kib() - before, 64 * 1024);
}

TEST(StoreServer, JoinTokenAdmitsOnlyAgentsThatPresentIt) {
  StoreServerOptions options;
  options.join_token = "s3cret";
  StoreServer server(options);
  // The right token is accepted (and loopback is this host: its workers need none).
  EXPECT_NO_THROW(Store::connect("127.0.0.1", server.port(), 5s, {std::string("s3cret")}));
  EXPECT_NO_THROW(Store::connect("127.0.0.1", server.port(), 5s));
  try {
    Store::connect("127.0.0.1", server.port(), 5s, {std::string("wrong")});
    ADD_FAILURE() << "a wrong token was accepted";
  } catch (const JoinRefusedError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong join token"), std::string::npos) << e.what();
  }
  try {
    Store::connect("127.0.0.1", server.port(), 5s, {std::string()});
    ADD_FAILURE() << "a missing token was accepted";
  } catch (const JoinRefusedError& e) {
    EXPECT_NE(std::string(e.what()).find("requires a join token"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server.stats().refused, 2u);
  // An agent with a token against a store that checks none is a misconfiguration too.
  StoreServer open_server({});
  EXPECT_THROW(Store::connect("127.0.0.1", open_server.port(), 5s, {std::string("s3cret")}),
               JoinRefusedError);
}

// A connection that has not presented the token (admit_local=false makes loopback such a one).
StoreServerOptions strict() {
  StoreServerOptions options;
  options.join_token = "s3cret";
  options.admit_local = false;
  return options;
}

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

TEST(StoreServer, AConnectionWithoutTheTokenMayOnlyHandshake) {
  StoreServer server(strict());
  {
    Raw c(server.port());
    Writer ping;
    ping.u8(code(Dialect::kModern, Op::kPing)).value<uint32_t>(7);
    Writer num;
    num.u8(code(Dialect::kModern, Op::kNumKeys));
    ASSERT_TRUE(c.send(validate() + ping.data() + num.data()));
    EXPECT_EQ(c.read(12).size(), 12u);
    Writer set;
    set.u8(code(Dialect::kModern, Op::kSet)).bytes("k").bytes("v");
    ASSERT_TRUE(c.send(set.data()));
    EXPECT_TRUE(c.closed());
  }
  {
    // A COMPARE_SET on another key is refused on its key, before its (declared 64 MiB) values.
    Raw c(server.port());
    Writer cas;
    cas.u8(code(Dialect::kModern, Op::kCompareSet)).bytes("k").value<uint64_t>(64 << 20);
    ASSERT_TRUE(c.send(validate() + cas.data()));
    EXPECT_TRUE(c.closed());
  }
  {
    // A token longer than 4 KiB is not buffered.
    Raw c(server.port());
    Writer cas;
    cas.u8(code(Dialect::kModern, Op::kCompareSet))
        .bytes(StoreServer::kJoinKey)
        .value<uint64_t>(1 << 20);
    ASSERT_TRUE(c.send(validate() + cas.data()));
    EXPECT_TRUE(c.closed());
  }
  EXPECT_EQ(server.stats().refused, 2u);
  EXPECT_EQ(server.stats().protocol_errors, 1u);
  // The token admits it.
  EXPECT_NO_THROW(Store::connect("127.0.0.1", server.port(), 5s, {std::string("s3cret")}));
}

TEST(StoreServer, AHalfClosedRefusedClientThatReadsNothingIsClosedWithoutSpinning) {
  StoreServer server(strict());
  Raw c(server.port());
  Writer ping;
  ping.u8(code(Dialect::kModern, Op::kPing)).value<uint32_t>(7);
  std::string flood = validate();
  // 20 MB of pongs it does not read: more than the socket buffers hold.
  for (int i = 0; i < 5000000; ++i) flood += ping.data();
  Writer set;
  set.u8(code(Dialect::kModern, Op::kSet)).bytes("k").bytes("v");
  ASSERT_TRUE(c.send(flood + set.data()));
  c.shutdown_write();
  // Once the SET is refused the server has read the whole flood: from then on it has nothing
  // to do but wait for the client to read.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (server.stats().refused == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(server.stats().refused, 1u);
  std::this_thread::sleep_for(200ms);
  const double before = cpu_seconds();
  std::this_thread::sleep_for(1s);
  EXPECT_LT(cpu_seconds() - before, 0.5) << "the server's thread spins";
  EXPECT_TRUE(c.drained_to_eof(10s));
}

TEST(StoreServer, ClientFallsBackToThe113ProtocolWhenTheServerClosesOnTheProbe) {
  // A stand-in for a 1.13 server: it closes any connection whose first query byte is 0 with an
  // absurd length (as 1.13 does), and answers a legacy ADD.
  const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(lfd, 8), 0);
  socklen_t len = sizeof(a);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread server([lfd] {
    for (int served = 0; served < 2;) {
      const int c = accept(lfd, nullptr, nullptr);
      char first = 0;
      if (recv(c, &first, 1, MSG_WAITALL) != 1) {  // the client's reachability probe
        close(c);
        continue;
      }
      ++served;
      if (first == 0) {
        uint64_t n = 0;
        recv(c, &n, 8, MSG_WAITALL);
        EXPECT_GE(n, uint64_t{1} << 63) << "the probe's length must be rejected without allocating";
        close(c);
        continue;
      }
      EXPECT_EQ(first, 3);  // legacy ADD
      uint64_t klen = 0;
      recv(c, &klen, 8, MSG_WAITALL);
      std::string key(klen, '\0');
      recv(c, key.data(), klen, MSG_WAITALL);
      int64_t delta = 0;
      recv(c, &delta, 8, MSG_WAITALL);
      send(c, &delta, 8, MSG_NOSIGNAL);
      close(c);
    }
  });
  auto store = Store::connect("127.0.0.1", ntohs(a.sin_port), 5s);
  EXPECT_EQ(store->protocol(), StoreProtocol::kLegacy);
  EXPECT_EQ(store->add("n", 42), 42);
  server.join();
  close(lfd);
}

TEST(StoreServer, DdpStoreProtocolSkipsTheProbe) {
  StoreServer server({});
  {
    testing::ScopedEnv env("DDP_STORE_PROTOCOL", "legacy");
    auto store = Store::connect("127.0.0.1", server.port(), 5s);
    EXPECT_EQ(store->protocol(), StoreProtocol::kLegacy);
    store->set("k", "legacy");
    EXPECT_EQ(store->get("k"), "legacy");
    EXPECT_THROW(store->wait({"never"}, 100ms), StoreError);  // closes the connection
    EXPECT_EQ(store->add("n", 2), 2);                         // and the next call reopens it
    store->append("k", "+");                                  // this server knows the 2.0 queries
    EXPECT_EQ(store->get("k"), "legacy+");
  }
  {
    testing::ScopedEnv env("DDP_STORE_PROTOCOL", "modern");
    auto store = Store::connect("127.0.0.1", server.port(), 5s);
    EXPECT_EQ(store->protocol(), StoreProtocol::kModern);
    EXPECT_EQ(store->get("k"), "legacy+");
    EXPECT_THROW(store->wait({"never"}, 100ms), StoreError);  // CANCEL_WAIT, same connection
    EXPECT_EQ(store->add("n", 1), 3);
  }
  testing::ScopedEnv env("DDP_STORE_PROTOCOL", "1.13");
  EXPECT_THROW(Store::connect("127.0.0.1", server.port(), 5s), ConfigError);
}

}  // namespace
}  // namespace ddp
