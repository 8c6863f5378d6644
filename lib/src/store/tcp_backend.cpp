#include "store/tcp_backend.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>

#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/net/tcp_probe.h"
#include "ddp/settings.h"
#include "store/join_auth.h"
#include "store/wire.h"

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using store::Dialect;
using store::Op;

// How long the protocol probe waits for a 2.1+ answer before it takes the server for 1.13: a
// 1.13 server closes the connection at once, and any server answers a PING in microseconds.
constexpr auto kProbeLimit = std::chrono::seconds(2);

std::string seconds(milliseconds t) {
  return std::to_string(t.count() / 1000.0).substr(0, 6) + " s";
}

enum class Got { kOk, kClosed, kTimeout };

int millis_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 60'000));
}

// Reads exactly n bytes by `deadline`. Throws on a socket error other than a reset.
Got read_exact(int fd, char* out, std::size_t n, Clock::time_point deadline) {
  std::size_t got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, millis_until(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (Clock::now() >= deadline) return Got::kTimeout;
      continue;
    }
    const ssize_t r = recv(fd, out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
    } else if (r == 0 || errno == ECONNRESET) {
      return Got::kClosed;
    } else if (errno != EINTR && errno != EAGAIN) {
      throw StoreError(std::string("receive failed: ") + std::strerror(errno));
    }
  }
  return Got::kOk;
}

void write_all(int fd, const std::string& data, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t w =
        ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      sent += static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, millis_until(deadline)) == 0 && Clock::now() >= deadline) {
        throw StoreError("send timed out");
      }
      continue;
    }
    throw StoreError(std::string("send failed: ") + std::strerror(errno));
  }
}

// One TCP connection to host:port (TCP_NODELAY: requests are small and answered at once).
int open_connection(const std::string& host, int port, Clock::time_point deadline) {
  std::string why;
  const int fd =
      net::connect_tcp(host, port, milliseconds(std::max(1, millis_until(deadline))), why);
  if (fd < 0) throw StoreError(why);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

StoreProtocol protocol_from_env(StoreProtocol asked) {
  if (asked != StoreProtocol::kAuto) return asked;
  return settings::choice<StoreProtocol>(settings::kStoreProtocol,
                                         {{"auto", StoreProtocol::kAuto},
                                          {"legacy", StoreProtocol::kLegacy},
                                          {"modern", StoreProtocol::kModern}})
      .value_or(StoreProtocol::kAuto);
}

}  // namespace

struct TcpStoreBackend::Impl {
  std::string host;
  int port = 0;
  milliseconds timeout{};
  StoreConnectOptions options;
  std::shared_ptr<const void> owned;  // the server, when this process hosts the store
  std::mutex mu;
  int fd = -1;
  Dialect dialect = Dialect::kModern;
  StoreProtocol wanted = StoreProtocol::kAuto;
  // Legacy dialect: whether the server is 2.0 (APPEND, MULTI_GET/SET, CANCEL_WAIT), not 1.13.
  std::optional<bool> legacy_extensions;
  std::string seen_as;  // the address the server answered the join handshake with

  ~Impl() { drop(); }

  std::string where() const { return host + ":" + std::to_string(port); }

  void drop() {
    if (fd >= 0) close(fd);
    fd = -1;
  }

  // Opens the connection and settles the protocol (first time: the probe) and the join token.
  void open(Clock::time_point deadline) {
    if (wanted == StoreProtocol::kAuto) {
      bool sure = true;
      dialect = probe(deadline, sure);
      const StoreProtocol found =
          dialect == Dialect::kModern ? StoreProtocol::kModern : StoreProtocol::kLegacy;
      // A probe that timed out is not remembered: a reconnection probes again.
      if (sure) wanted = found;
      log::debug("rendezvous store at {} speaks the {} protocol{}", where(), to_string(found),
                 sure ? "" : " (it did not answer the probe in time)");
    } else {
      dialect = wanted == StoreProtocol::kModern ? Dialect::kModern : Dialect::kLegacy;
      fd = open_connection(host, port, deadline);
      if (dialect == Dialect::kModern) {
        store::Writer w;
        w.u8(0).value(store::kValidationMagic);
        write_all(fd, w.data(), deadline);
      }
    }
    if (options.join_token) present_token(deadline);
  }

  // VALIDATE + GETNUMKEYS + PING: a 2.1+ server answers the count, then the nonce (2.1 and 2.2
  // know no PING and close the connection after the count). A 1.13/2.0 server reads the bytes
  // after its query byte 0 (its SET) as a key length; the nonce's bit 15 makes that length at
  // least 2^63, which it rejects at once without allocating, and it closes the connection.
  Dialect probe(Clock::time_point deadline, bool& sure) {
    fd = open_connection(host, port, deadline);
    std::random_device rd;
    const uint32_t nonce = (rd() & 0xFFFF7FFFU) | 0x8000U;
    store::Writer w;
    w.u8(0).value(store::kValidationMagic);
    w.u8(*store::encode_op(Dialect::kModern, Op::kNumKeys));
    w.u8(*store::encode_op(Dialect::kModern, Op::kPing)).value(nonce);
    write_all(fd, w.data(), deadline);
    const auto probe_deadline = std::min(deadline, Clock::now() + kProbeLimit);
    char count[8];
    const Got got = read_exact(fd, count, sizeof(count), probe_deadline);
    if (got != Got::kOk) {
      // 1.13/2.0: it closed the connection, or waits for more bytes of what it took for a SET.
      sure = got == Got::kClosed;
      drop();
      fd = open_connection(host, port, deadline);
      return Dialect::kLegacy;
    }
    uint32_t echo = 0;
    const Got pong = read_exact(fd, reinterpret_cast<char*>(&echo), sizeof(echo), probe_deadline);
    if (pong == Got::kOk && echo != nonce) {
      drop();
      throw StoreError("the server answered PING with a wrong nonce; is " + where() +
                       " a c10d store?");
    }
    if (pong != Got::kOk) {  // a 2.1/2.2 server: no PING
      drop();
      fd = open_connection(host, port, deadline);
      store::Writer v;
      v.u8(0).value(store::kValidationMagic);
      write_all(fd, v.data(), deadline);
    }
    return Dialect::kModern;
  }

  // One COMPARE_SET on kJoinKey carrying `message`: the server's answer.
  std::string join_step(const std::string& message, Clock::time_point deadline) {
    store::Writer w;
    w.u8(*store::encode_op(dialect, Op::kCompareSet))
        .bytes(store::kJoinKey)
        .bytes(message)
        .bytes("");
    write_all(fd, w.data(), deadline);
    return read_bytes(deadline);
  }

  // The join handshake (store/join_auth.h): proves the token without sending it, and checks
  // that the store knows it too. No token (""): presents "" in clear, for an open store.
  void present_token(Clock::time_point deadline) {
    namespace ja = store::join_auth;
    const std::string& token = *options.join_token;
    if (token.empty()) {
      const std::string answer = join_step("", deadline);
      if (answer != "open") refused_by(answer);
      return;
    }
    const std::string agent_nonce = ja::nonce();
    const std::string answer = join_step(std::string(ja::kHello) + agent_nonce, deadline);
    const auto challenge = ja::parse_challenge(answer);
    if (!challenge) refused_by(answer);
    const bool store_knows =
        ja::same(challenge->proof, ja::store_proof(token, agent_nonce, challenge->store_nonce));
    // The proof goes even to a store that failed its own, which then refuses it and logs who.
    const std::string verdict = join_step(
        std::string(ja::kProof) + ja::agent_proof(token, challenge->store_nonce, agent_nonce),
        deadline);
    if (!store_knows) {
      drop();
      throw JoinRefusedError("the rendezvous store at " + where() +
                             " refused: wrong join token (the store's and this agent's differ; "
                             "or is it another job's store?); give every agent of the job the "
                             "same --rdzv-conf token_file");
    }
    if (verdict.rfind("ok ", 0) != 0) refused_by(verdict);
    seen_as = verdict.substr(3);
  }

  // Every answer but the expected one ends the connection with the reason.
  [[noreturn]] void refused_by(const std::string& answer) {
    drop();
    if (answer == "open") {
      throw JoinRefusedError("the rendezvous store at " + where() +
                             " checks no join token, but this agent was given one; give node 0 "
                             "the same --rdzv-conf token_file");
    }
    if (answer.rfind("refused: wrong join token", 0) == 0 && options.join_token->size() > 0) {
      // The only answer an older store gives to a handshake it cannot read.
      throw JoinRefusedError("the rendezvous store at " + where() +
                             " refused the join handshake: wrong join token, or a store of an "
                             "older ddprun that takes the token in clear; give every agent the "
                             "same --rdzv-conf token_file and run one ddprun version on every "
                             "node");
    }
    if (answer.rfind("refused", 0) == 0) {
      throw JoinRefusedError("the rendezvous store at " + where() + " " + answer);
    }
    throw StoreError("the server at " + where() +
                     " does not check ddprun join tokens; is it another job's store?");
  }

  std::string read_bytes(Clock::time_point deadline) {
    uint64_t n = 0;
    expect(read_exact(fd, reinterpret_cast<char*>(&n), sizeof(n), deadline));
    if (n > (1ULL << 32))
      throw StoreError("the server sent a value of " + std::to_string(n) + " bytes");
    std::string out(static_cast<std::size_t>(n), '\0');
    if (n > 0) expect(read_exact(fd, out.data(), out.size(), deadline));
    return out;
  }
  template <typename T>
  T read_value(Clock::time_point deadline) {
    T v{};
    expect(read_exact(fd, reinterpret_cast<char*>(&v), sizeof(v), deadline));
    return v;
  }
  void expect(Got got) {
    if (got == Got::kClosed) throw StoreError("the server closed the connection");
    if (got == Got::kTimeout) throw StoreError("no answer within " + seconds(timeout));
  }

  // A 2.0 server answers CANCEL_WAIT with WAIT_CANCELED; 1.13 knows no such query and closes the
  // connection. Asked once, on a connection of its own, before the first 2.0-only request.
  bool has_legacy_extensions(Clock::time_point deadline) {
    if (!legacy_extensions) {
      const int probe_fd = open_connection(host, port, deadline);
      std::string cancel(1,
                         static_cast<char>(*store::encode_op(Dialect::kLegacy, Op::kCancelWait)));
      uint8_t answer = 0;
      Got got = Got::kClosed;
      try {
        write_all(probe_fd, cancel, deadline);
        got = read_exact(probe_fd, reinterpret_cast<char*>(&answer), 1,
                         std::min(deadline, Clock::now() + kProbeLimit));
      } catch (const StoreError&) {
      }
      close(probe_fd);
      legacy_extensions = got == Got::kOk && answer == store::kWaitCanceled;
    }
    return *legacy_extensions;
  }

  // Whether the server knows `op` (a 1.13 server lacks 2.0's APPEND, MULTI_GET, MULTI_SET and
  // CANCEL_WAIT); on an open connection, whose dialect is known.
  bool knows(Op op, Clock::time_point deadline) {
    const bool extension =
        op == Op::kAppend || op == Op::kMultiGet || op == Op::kMultiSet || op == Op::kCancelWait;
    return dialect != Dialect::kLegacy || !extension || has_legacy_extensions(deadline);
  }

  store::Writer request(Op op, Clock::time_point deadline) {
    store::Writer w;
    auto byte = store::encode_op(dialect, op);
    if (!knows(op, deadline)) byte.reset();
    if (!byte) {
      const bool newest = op == Op::kListKeys;
      throw StoreError(std::string(store::op_name(op)) + " needs a PyTorch " +
                       (newest ? "2.10" : "2.0") + "+ store; the one at " + where() +
                       " speaks only the " + (newest ? "1.13/2.0" : "1.13") + " protocol");
    }
    w.u8(*byte);
    return w;
  }

  // Runs `fn` (which sends a request and reads its answer) under the lock, on a connection that
  // is open; any failure leaves the connection closed (the next call reopens it) and becomes one
  // StoreError line naming the operation.
  template <typename Fn>
  auto call(const std::string& what, Fn&& fn) -> decltype(fn(Clock::time_point())) {
    std::lock_guard<std::mutex> lock(mu);
    const auto deadline = Clock::now() + timeout;
    try {
      if (fd < 0) open(deadline);
      return fn(deadline);
    } catch (const JoinRefusedError&) {
      drop();
      throw;
    } catch (const StoreError& e) {
      drop();
      throw StoreError("rendezvous store at " + where() + ": " + what + " failed: " + e.what());
    } catch (...) {
      drop();  // never leave a connection in the middle of an answer
      throw;
    }
  }
};

TcpStoreBackend::TcpStoreBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreBackend::~TcpStoreBackend() = default;

std::shared_ptr<TcpStoreBackend> TcpStoreBackend::connect(const std::string& host, int port,
                                                          milliseconds timeout,
                                                          const StoreConnectOptions& options) {
  const auto deadline = Clock::now() + timeout;
  const auto unreachable = [&](const std::string& cause) {
    return StoreError("cannot reach the rendezvous store at " + host + ":" + std::to_string(port) +
                      " within " + seconds(timeout) + " (" + cause +
                      "); check MASTER_ADDR/MASTER_PORT and that the rank-0 host is running");
  };
  if (!net::wait_for_listener(host, port, deadline)) {
    throw unreachable("nothing accepted a connection there");
  }
  auto impl = std::make_unique<Impl>();
  impl->host = host;
  impl->port = port;
  impl->timeout = timeout;
  impl->options = options;
  impl->wanted = protocol_from_env(options.protocol);
  try {
    impl->open(std::max(deadline, Clock::now() + milliseconds(1000)));
  } catch (const JoinRefusedError&) {
    throw;  // not a reachability problem: say it as the server did
  } catch (const StoreError& e) {
    impl->drop();
    throw unreachable(e.what());
  }
  return std::shared_ptr<TcpStoreBackend>(new TcpStoreBackend(std::move(impl)));
}

void TcpStoreBackend::keep_alive(std::shared_ptr<const void> owned) {
  impl_->owned = std::move(owned);
}

void TcpStoreBackend::set(const std::string& key, const std::string& value) {
  impl_->call("set '" + key + "'", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kSet, deadline);
    w.bytes(key).bytes(value);
    write_all(impl_->fd, w.data(), deadline);
  });
}

std::string TcpStoreBackend::get(const std::string& key) {
  return impl_->call("get '" + key + "'", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kGet, deadline);
    w.bytes(key);
    write_all(impl_->fd, w.data(), deadline);
    return impl_->read_bytes(deadline);
  });
}

int64_t TcpStoreBackend::add(const std::string& key, int64_t delta) {
  return impl_->call("add '" + key + "'", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kAdd, deadline);
    w.bytes(key).value(delta);
    write_all(impl_->fd, w.data(), deadline);
    return impl_->read_value<int64_t>(deadline);
  });
}

std::string TcpStoreBackend::compare_set(const std::string& key, const std::string& expected,
                                         const std::string& desired) {
  return impl_->call("compare_set '" + key + "'", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kCompareSet, deadline);
    w.bytes(key).bytes(expected).bytes(desired);
    write_all(impl_->fd, w.data(), deadline);
    return impl_->read_bytes(deadline);
  });
}

bool TcpStoreBackend::check(const std::vector<std::string>& keys) {
  return impl_->call("check", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kCheck, deadline);
    w.value<uint64_t>(keys.size());
    for (const auto& k : keys) w.bytes(k);
    write_all(impl_->fd, w.data(), deadline);
    return impl_->read_value<uint8_t>(deadline) == store::kCheckReady;
  });
}

void TcpStoreBackend::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const std::string what = "wait for " + std::to_string(keys.size()) + " key(s) starting '" +
                           (keys.empty() ? std::string() : keys.front()) + "' (" +
                           seconds(timeout) + ")";
  impl_->call(what, [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kWait, deadline);
    w.value<uint64_t>(keys.size());
    for (const auto& k : keys) w.bytes(k);
    write_all(impl_->fd, w.data(), deadline);
    uint8_t answer = 0;
    const Got got =
        read_exact(impl_->fd, reinterpret_cast<char*>(&answer), 1, Clock::now() + timeout);
    if (got == Got::kOk) {
      if (answer != store::kStopWaiting) throw StoreError("unexpected answer to WAIT");
      return;
    }
    impl_->expect(got == Got::kClosed ? got : Got::kOk);
    // 1.13 has no CANCEL_WAIT: closing the connection ends the server's wait (call() reopens).
    if (impl_->dialect == Dialect::kLegacy) throw StoreError("timed out");
    // 2.1+: cancel; an answer that crossed the cancel still counts.
    const auto cancel_deadline = Clock::now() + std::max(impl_->timeout, milliseconds(5000));
    auto cancel = impl_->request(Op::kCancelWait, cancel_deadline);
    write_all(impl_->fd, cancel.data(), cancel_deadline);
    answer = impl_->read_value<uint8_t>(cancel_deadline);
    if (answer == store::kStopWaiting) {
      if (impl_->read_value<uint8_t>(cancel_deadline) != store::kWaitCanceled) {
        throw StoreError("unexpected answer to CANCEL_WAIT");
      }
      return;
    }
    if (answer != store::kWaitCanceled) throw StoreError("unexpected answer to CANCEL_WAIT");
    throw StoreError("timed out");
  });
}

bool TcpStoreBackend::remove(const std::string& key) {
  return impl_->call("delete '" + key + "'", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kDeleteKey, deadline);
    w.bytes(key);
    write_all(impl_->fd, w.data(), deadline);
    return impl_->read_value<int64_t>(deadline) > 0;
  });
}

void TcpStoreBackend::append(const std::string& key, const std::string& value) {
  impl_->call("append '" + key + "'", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kAppend, deadline);
    w.bytes(key).bytes(value);
    write_all(impl_->fd, w.data(), deadline);
  });
}

std::vector<std::string> TcpStoreBackend::multi_get(const std::vector<std::string>& keys) {
  const bool one_request = impl_->call("multi_get", [&](Clock::time_point deadline) {
    return impl_->knows(Op::kMultiGet, deadline);
  });
  if (!one_request) {
    // A 1.13 server (torchrun 1.13 hosting the job's store): one GET per key, each after a wait
    // of its own, as Store::get does.
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const auto& key : keys) {
      wait({key}, impl_->timeout);
      values.push_back(get(key));
    }
    return values;
  }
  return impl_->call("multi_get", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kMultiGet, deadline);
    w.value<uint64_t>(keys.size());
    for (const auto& k : keys) w.bytes(k);
    write_all(impl_->fd, w.data(), deadline);
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) values.push_back(impl_->read_bytes(deadline));
    return values;
  });
}

void TcpStoreBackend::multi_set(const std::vector<std::string>& keys,
                                const std::vector<std::string>& values) {
  impl_->call("multi_set", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kMultiSet, deadline);
    w.value<uint64_t>(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) w.bytes(keys[i]).bytes(values[i]);
    write_all(impl_->fd, w.data(), deadline);
  });
}

int64_t TcpStoreBackend::num_keys() {
  return impl_->call("num_keys", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kNumKeys, deadline);
    write_all(impl_->fd, w.data(), deadline);
    return impl_->read_value<int64_t>(deadline);
  });
}

std::vector<std::string> TcpStoreBackend::list_keys(const std::string& prefix) {
  return impl_->call("list_keys", [&](Clock::time_point deadline) {
    auto w = impl_->request(Op::kListKeys, deadline);
    write_all(impl_->fd, w.data(), deadline);
    std::vector<std::string> keys;
    try {
      const auto n = impl_->read_value<int64_t>(deadline);
      for (int64_t i = 0; i < n; ++i) {
        std::string key = impl_->read_bytes(deadline);
        if (key.rfind(prefix, 0) == 0) keys.push_back(std::move(key));
      }
    } catch (const StoreError& e) {
      throw StoreError(std::string(e.what()) +
                       " (a PyTorch store server older than 2.10 has no LIST_KEYS and closes the "
                       "connection)");
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  });
}

const std::string& TcpStoreBackend::endpoint_host() const { return impl_->host; }
std::string TcpStoreBackend::seen_as() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->seen_as;
}
int TcpStoreBackend::port() const { return impl_->port; }
milliseconds TcpStoreBackend::timeout() const { return impl_->timeout; }
StoreProtocol TcpStoreBackend::protocol() const {
  return impl_->dialect == Dialect::kModern ? StoreProtocol::kModern : StoreProtocol::kLegacy;
}

}  // namespace ddp::detail
