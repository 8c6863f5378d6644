// The join handshake (store/join_auth.h) on the wire, and the store's admission by address that
// follows from it: the token never crosses the network, a recorded handshake replayed is
// refused, a seeded fuzz of the handshake never admits a connection without the token nor harms
// the server, and workers are admitted only from the addresses of connected members (the
// loopback network's 127.0.0.2 and 127.0.0.3 play two other hosts).
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "ddp/store.h"
#include "ddp/store_server.h"
#include "raw_client.h"
#include "store/join_auth.h"
#include "store/wire.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using store::Dialect;
using store::Op;
using store::Writer;
namespace ja = store::join_auth;

const std::string kToken = "job-secret-7f3a";

// Loopback is no exception: every connection must prove the token or come from a member.
StoreServerOptions strict() {
  StoreServerOptions options;
  options.join_token = kToken;
  options.admit_local = false;
  return options;
}

// One COMPARE_SET on the join key: the answer, or "" when the server closed the connection.
std::string join_step(Raw& c, const std::string& message) {
  Writer w;
  w.u8(code(Dialect::kModern, Op::kCompareSet))
      .bytes(StoreServer::kJoinKey)
      .bytes(message)
      .bytes("");
  if (!c.send(w.data())) return "";
  const std::string length = c.read(8);
  if (length.size() != 8) return "";
  uint64_t n = 0;
  std::memcpy(&n, length.data(), sizeof(n));
  return n == 0 ? "" : c.read(n);
}

// The whole handshake as an agent holding `token` would run it: the last answer.
std::string handshake(Raw& c, const std::string& token) {
  c.send(validate());
  const std::string agent_nonce = ja::nonce();
  const auto challenge = ja::parse_challenge(join_step(c, std::string(ja::kHello) + agent_nonce));
  if (!challenge) return "no challenge";
  return join_step(
      c, std::string(ja::kProof) + ja::agent_proof(token, challenge->store_nonce, agent_nonce));
}

// Whether the server serves `c` a query only an admitted connection may ask (a GET; a missing
// key is answered at once, empty).
bool served(Raw& c) {
  Writer w;
  w.u8(code(Dialect::kModern, Op::kGet)).bytes("probe");
  return c.send(w.data()) && c.read(8, 2s).size() == 8;
}

// A plain c10d client (a worker) from `source`: whether it is served.
bool worker_served(int port, const char* source) {
  Raw c(port, source);
  return c.send(validate()) && served(c);
}

TEST(JoinAuth, NoncesAreFreshAndProofsBindTokenNoncesAndDirection) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string n = ja::nonce();
    EXPECT_TRUE(ja::is_nonce(n)) << n;
    EXPECT_TRUE(seen.insert(n).second) << "a nonce came twice: " << n;
  }
  const std::string a = ja::nonce(), s = ja::nonce();
  const std::string proof = ja::agent_proof(kToken, s, a);
  EXPECT_EQ(proof.size(), 64u);
  EXPECT_EQ(proof, ja::agent_proof(kToken, s, a));
  EXPECT_NE(proof, ja::agent_proof(kToken + "x", s, a));
  EXPECT_NE(proof, ja::agent_proof(kToken, ja::nonce(), a));
  EXPECT_NE(proof, ja::agent_proof(kToken, s, ja::nonce()));
  // The store's proof over the same nonces cannot stand for the agent's.
  EXPECT_NE(proof, ja::store_proof(kToken, s, a));
  EXPECT_NE(proof, ja::store_proof(kToken, a, s));
  EXPECT_FALSE(ja::is_nonce(a.substr(1)));
  EXPECT_FALSE(ja::is_nonce(std::string(32, 'G')));
  EXPECT_FALSE(ja::parse_challenge("challenge " + a));
  EXPECT_FALSE(ja::parse_challenge("refused: no"));
  ASSERT_TRUE(ja::parse_challenge("challenge " + a + " " + proof));
  EXPECT_EQ(ja::parse_challenge("challenge " + a + " " + proof)->proof, proof);
}

TEST(JoinAuth, AnAgentIsAdmittedByItsProofAndLearnsItsAddress) {
  StoreServer server(strict());
  auto agent = Store::connect("127.0.0.1", server.port(), 5s, {kToken});
  EXPECT_EQ(agent->seen_as(), "127.0.0.1");
  agent->set("k", "v");
  EXPECT_EQ(agent->get("k"), "v");
  EXPECT_EQ(server.stats().agents, 1u);
  EXPECT_EQ(server.stats().refused, 0u);
  // An agent given no token, or the wrong one, is refused with the reason.
  try {
    Store::connect("127.0.0.1", server.port(), 5s, {std::string("not-the-token")});
    ADD_FAILURE() << "a wrong token was admitted";
  } catch (const JoinRefusedError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong join token"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Store::connect("127.0.0.1", server.port(), 5s, {std::string()}), JoinRefusedError);
  EXPECT_EQ(server.stats().refused, 2u);
  EXPECT_EQ(server.stats().agents, 1u);
}

// Relays a client's connections to the store in turn, recording what the client sent, until
// one that sent something closes (the client's reachability check sends nothing).
class RecordingProxy {
 public:
  explicit RecordingProxy(int server_port) : server_port_(server_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(listen_fd_, 1), 0);
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { relay(); });
  }
  ~RecordingProxy() {
    if (thread_.joinable()) thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }
  // What the client sent, once it closed its connection.
  std::string sent() {
    if (thread_.joinable()) thread_.join();
    return sent_;
  }

 private:
  void relay() {
    while (sent_.empty()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 10000) <= 0) return;
      relay_one(accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC));
    }
  }

  void relay_one(int client) {
    Raw upstream(server_port_);
    const int server = upstream.fd();
    char buf[4096];
    for (bool open = client >= 0; open;) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(p, 2, 10000) <= 0) break;
      for (int i = 0; i < 2 && open; ++i) {
        if (p[i].revents == 0) continue;
        const ssize_t n = recv(p[i].fd, buf, sizeof(buf), 0);
        if (n <= 0) {
          open = false;
          break;
        }
        if (i == 0) sent_.append(buf, static_cast<std::size_t>(n));
        ::send(i == 0 ? server : client, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL);
      }
    }
    if (client >= 0) close(client);
  }

  int server_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::string sent_;
  std::thread thread_;
};

TEST(JoinAuth, TheTokenNeverCrossesTheWireAndARecordedHandshakeReplayedIsRefused) {
  StoreServer server(strict());
  std::string recorded;
  {
    RecordingProxy proxy(server.port());
    {
      auto agent = Store::connect("127.0.0.1", proxy.port(), 5s, {kToken, StoreProtocol::kModern});
      agent->set("written-through-the-proxy", "1");
    }
    recorded = proxy.sent();
  }
  ASSERT_NE(recorded.find(std::string(ja::kProof)), std::string::npos) << "no handshake recorded";
  EXPECT_EQ(recorded.find(kToken), std::string::npos) << "the token crossed the wire";
  // The agent's bytes replayed verbatim on a connection of its own: the proof answers a
  // challenge the store has forgotten, so the SET in them never lands.
  const uint64_t refused_before = server.stats().refused;
  {
    Raw replay(server.port());
    replay.send(recorded);
    EXPECT_TRUE(replay.drained_to_eof(5s)) << "the replayed handshake's connection stayed open";
  }
  EXPECT_EQ(server.stats().refused, refused_before + 1);
  auto check = Store::connect("127.0.0.1", server.port(), 5s, {kToken});
  EXPECT_EQ(check->num_keys(), 1) << "only the proxied agent's key";
}

TEST(JoinAuth, AProofAnswersOnlyItsOwnChallengeOnce) {
  StoreServer server(strict());
  const auto refused_after = [&](const std::function<std::string(Raw&)>& steps) {
    Raw c(server.port());
    c.send(validate());
    const std::string answer = steps(c);
    EXPECT_TRUE(c.closed()) << answer;
    EXPECT_FALSE(served(c));
    return answer;
  };
  const std::string a = ja::nonce();
  // A proof with no challenge before it.
  EXPECT_EQ(refused_after([&](Raw& c) {
              return join_step(c, std::string(ja::kProof) + ja::agent_proof(kToken, a, a));
            }).rfind("refused: a join proof without a challenge", 0),
            0u);
  // A proof for another connection's challenge.
  Raw other(server.port());
  other.send(validate());
  const auto theirs = ja::parse_challenge(join_step(other, std::string(ja::kHello) + a));
  ASSERT_TRUE(theirs);
  EXPECT_EQ(refused_after([&](Raw& c) {
              join_step(c, std::string(ja::kHello) + a);
              return join_step(
                  c, std::string(ja::kProof) + ja::agent_proof(kToken, theirs->store_nonce, a));
            }).rfind("refused: wrong join token", 0),
            0u);
  // Two hellos on one connection, and a malformed nonce.
  EXPECT_NE(refused_after([&](Raw& c) {
              join_step(c, std::string(ja::kHello) + a);
              return join_step(c, std::string(ja::kHello) + a);
            }).find("second join handshake"),
            std::string::npos);
  EXPECT_NE(refused_after([&](Raw& c) {
              return join_step(c, std::string(ja::kHello) + "xyz");
            }).find("malformed"),
            std::string::npos);
  // The right token sent in clear, as an older ddprun does, is refused all the same.
  EXPECT_NE(refused_after([&](Raw& c) { return join_step(c, kToken); }).find("in clear"),
            std::string::npos);
  // After all that, a proper agent is admitted; and a spent challenge is not reused.
  Raw ok(server.port());
  EXPECT_EQ(handshake(ok, kToken), "ok 127.0.0.1");
  EXPECT_TRUE(served(ok));
  EXPECT_EQ(
      join_step(ok, std::string(ja::kProof) + ja::agent_proof(kToken, a, a)).rfind("refused", 0),
      0u);
  EXPECT_EQ(server.stats().refused, 6u);
}

// One fuzzed handshake: a valid one with one thing wrong, picked by `kind`. Returns whether the
// connection it ran on should be admitted (only the untouched handshake).
bool fuzzed_handshake(Raw& c, std::mt19937_64& rng, int kind) {
  c.send(validate());
  std::string agent_nonce = ja::nonce();
  const auto flip = [&](std::string s) {
    if (!s.empty()) s[rng() % s.size()] ^= static_cast<char>(1 + rng() % 255);
    return s;
  };
  if (kind == 0) {  // noise where the hello goes
    std::string noise(rng() % 300, '\0');
    for (auto& b : noise) b = static_cast<char>(rng());
    join_step(c, noise);
    return false;
  }
  if (kind == 1) agent_nonce = flip(agent_nonce);  // a malformed nonce (or a valid other one)
  const auto challenge = ja::parse_challenge(join_step(c, std::string(ja::kHello) + agent_nonce));
  if (!challenge) return false;
  std::string proof = ja::agent_proof(kind == 2 ? flip(kToken) : kToken,
                                      kind == 3 ? ja::nonce() : challenge->store_nonce,
                                      kind == 4 ? ja::nonce() : agent_nonce);
  if (kind == 5) proof = flip(proof);
  if (kind == 6) proof.resize(rng() % proof.size());
  if (kind == 7) {  // the message cut anywhere, the connection then closed by this client
    Writer w;
    w.u8(code(Dialect::kModern, Op::kCompareSet))
        .bytes(StoreServer::kJoinKey)
        .bytes(std::string(ja::kProof) + proof)
        .bytes("");
    std::string bytes = w.data();
    bytes.resize(rng() % bytes.size());
    c.send(bytes);
    return false;
  }
  const std::string verdict = join_step(c, std::string(ja::kProof) + proof);
  return verdict.rfind("ok ", 0) == 0;
}

TEST(JoinAuth, SeededHandshakeFuzzNeverAdmitsWithoutTheTokenNorHarmsTheServer) {
  StoreServer server(strict());
  auto agent = Store::connect("127.0.0.1", server.port(), 10s, {kToken});
  std::mt19937_64 rng(20261204);
  const long before = rss_kib();
  int admitted = 0, should = 0;
  for (int round = 0; round < 400; ++round) {
    const int kind = static_cast<int>(rng() % 9);  // 8: untouched
    Raw c(server.port());
    const bool ok = fuzzed_handshake(c, rng, kind);
    const bool expected = kind == 8 || (kind == 1 && ok);  // a flipped nonce may stay valid
    EXPECT_EQ(ok, expected) << "round " << round << " kind " << kind;
    if (kind == 7) continue;  // a request cut short: the next bytes would complete it
    const bool got = served(c);
    EXPECT_EQ(got, expected) << "round " << round << " kind " << kind;
    admitted += got;
    should += expected;
    if (round % 25 == 0) {
      agent->set("alive", std::to_string(round));
      ASSERT_EQ(agent->get("alive"), std::to_string(round));
    }
  }
  EXPECT_EQ(admitted, should);
  EXPECT_GT(should, 20);
  EXPECT_EQ(agent->num_keys(), 1) << "a connection that was not admitted wrote a key";
  EXPECT_LT(rss_kib() - before, 64 * 1024);
}

TEST(JoinAuth, WorkersAreAdmittedOnlyFromTheAddressesOfConnectedMembers) {
  StoreServer server(strict());
  auto agent = std::make_unique<Raw>(server.port(), "127.0.0.2");
  ASSERT_EQ(handshake(*agent, kToken), "ok 127.0.0.2");
  EXPECT_TRUE(worker_served(server.port(), "127.0.0.2"));
  EXPECT_FALSE(worker_served(server.port(), "127.0.0.3")) << "no agent there";
  // The agents name the round's members: .2 is not one, although its agent is connected.
  server.admit_members({"127.0.0.3"});
  EXPECT_FALSE(worker_served(server.port(), "127.0.0.2"));
  EXPECT_FALSE(worker_served(server.port(), "127.0.0.3")) << "a member with no agent connected";
  server.admit_members({"127.0.0.2", "127.0.0.3"});
  EXPECT_TRUE(worker_served(server.port(), "127.0.0.2"));
  // A worker connected now keeps its connection; the node that leaves takes its address's
  // admission with it, so a pod that later gets the address is refused.
  Raw running(server.port(), "127.0.0.2");
  running.send(validate());
  EXPECT_TRUE(served(running));
  agent.reset();
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server.stats().agents != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(server.stats().agents, 0u);
  EXPECT_FALSE(worker_served(server.port(), "127.0.0.2")) << "a recycled address was admitted";
  EXPECT_TRUE(served(running));
}

}  // namespace
}  // namespace ddp
