#include "ddp/store_server.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ddp/error.h"
#include "ddp/log.h"
#include "store/wire.h"

namespace ddp {
namespace {

using store::Dialect;
using store::Op;
using store::ProtocolError;
using store::Reader;
using store::Writer;

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr std::size_t kReadChunk = 64 * 1024;
// A connection that has not presented the join token may send only small requests: the
// handshake queries and a token of at most 4 KiB.
constexpr std::size_t kUnadmittedBytes = 16 * 1024;

std::string errno_text(int err) { return std::strerror(err); }

// The peer's address as text, IPv4-mapped IPv6 addresses as plain IPv4.
std::string address_text(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
    return text;
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      in_addr v4{};
      std::memcpy(&v4, a6->sin6_addr.s6_addr + 12, 4);
      inet_ntop(AF_INET, &v4, text, sizeof(text));
    } else {
      inet_ntop(AF_INET6, &a6->sin6_addr, text, sizeof(text));
    }
    return text;
  }
  return "?";
}

int port_of(const sockaddr_storage& addr) {
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
}

bool is_loopback(const std::string& ip) { return ip == "::1" || ip.rfind("127.", 0) == 0; }

// This host's own addresses: its workers and its agent connect from them.
std::unordered_set<std::string> local_addresses() {
  std::unordered_set<std::string> out;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
    sockaddr_storage s{};
    std::memcpy(&s, i->ifa_addr,
                i->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    out.insert(address_text(s));
  }
  freeifaddrs(ifs);
  return out;
}

// A store with 1,000 agents and their workers holds more sockets than the usual soft limit.
void raise_open_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// Compares without an early exit, so the time taken tells nothing of the token but its length.
bool same_token(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

struct Connection {
  int fd = -1;
  std::string peer;  // ip:port, for log lines
  std::string peer_ip;
  std::optional<Dialect> dialect;
  bool admitted = false;
  bool closing = false;  // close once `out` is flushed; read nothing more
  std::string in;
  std::size_t in_pos = 0;  // requests before it are served
  std::size_t need = 0;    // bytes `in` must hold before the next request can be complete
  std::string out;
  std::size_t out_pos = 0;
  std::size_t awaited = 0;                // keys a WAIT still waits for
  std::vector<std::string> awaited_keys;  // to leave the waiting lists on close or cancel
  std::vector<std::string> watched_keys;  // legacy WATCH_KEY registrations
  bool want_write = false;
};

}  // namespace

struct StoreServer::Impl {
  StoreServerOptions options;
  store::Limits limits;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::thread loop;
  std::unordered_set<std::string> admitted_ips;

  std::unordered_map<uint64_t, Connection> conns;
  uint64_t next_id = 2;
  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::string, std::deque<std::string>> queues;
  std::unordered_map<std::string, std::vector<uint64_t>> waiting;   // key -> connections
  std::unordered_map<std::string, std::vector<uint64_t>> watchers;  // key -> connections

  store::Limits unadmitted_limits{256, 4096, 0};
  bool listener_paused = false;  // out of file descriptors: accept again once one closes

  std::atomic<uint64_t> accepted{0}, refused{0}, protocol_errors{0}, open{0};

  explicit Impl(const StoreServerOptions& o) : options(o) {
    limits.max_key = o.max_key_bytes;
    limits.max_value = o.max_value_bytes;
    limits.max_keys_per_query = o.max_keys_per_query;
  }

  void listen_on(int wanted_port);
  void run();
  void accept_all();
  void on_readable(uint64_t id);
  void on_writable(uint64_t id);
  void close_conn(uint64_t id);
  void update_interest(uint64_t id, Connection& c);
  void send(uint64_t id, Connection& c, std::string bytes);
  // Parses and serves one request from the front of c.in: the bytes it used, 0 if incomplete.
  std::size_t serve_one(uint64_t id, Connection& c);
  bool keys_present(const std::vector<std::string>& keys) const;
  // Stores `value` at `key`, then wakes its waiters and tells its watchers (created or updated).
  void put(const std::string& key, std::string value);
  // The key's value, empty when it is missing (as torch's libuv server answers).
  std::string_view value_of(const std::string& key) const;
  void changed(const std::string& key, uint8_t watch_type, const std::string& old_value,
               const std::string& new_value);
  void wake_one(const std::string& key);
  void clear_wait(uint64_t id, Connection& c);
  std::string join(Connection& c, const std::string& token);
  // Closes a connection that is not admitted (after a log line); returns `unread`.
  std::size_t refuse(Connection& c, Op op, std::size_t unread);
  // The request is not all there: remembers how much must arrive first; returns 0.
  static std::size_t incomplete(Connection& c, const Reader& r) {
    c.need = c.in_pos + r.needed();
    return 0;
  }
};

void StoreServer::Impl::listen_on(int wanted_port) {
  raise_open_file_limit();
  std::string why;
  for (int family : {AF_INET6, AF_INET}) {
    const int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = errno_text(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      int zero = 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
      a6->sin6_family = AF_INET6;
      a6->sin6_addr = in6addr_any;
      a6->sin6_port = htons(static_cast<uint16_t>(wanted_port));
      len = sizeof(sockaddr_in6);
    } else {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
      a4->sin_family = AF_INET;
      a4->sin_addr.s_addr = htonl(INADDR_ANY);
      a4->sin_port = htons(static_cast<uint16_t>(wanted_port));
      len = sizeof(sockaddr_in);
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, SOMAXCONN) != 0) {
      const int err = errno;
      close(fd);
      if (err == EADDRINUSE) {
        throw StoreError("rendezvous store: port " + std::to_string(wanted_port) +
                         " is already in use; stop what holds it or choose another port");
      }
      why = errno_text(err);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t blen = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
    listen_fd = fd;
    port = port_of(bound);
    return;
  }
  throw StoreError("rendezvous store: cannot listen on port " + std::to_string(wanted_port) + ": " +
                   why);
}

void StoreServer::Impl::update_interest(uint64_t id, Connection& c) {
  // A closing connection waits for EPOLLOUT only: on_writable closes it once its answers are out
  // (at once when there are none left).
  const bool want = c.out_pos < c.out.size() || c.closing;
  // A connection with a backlog of answers is not read until the client takes them.
  const bool backlog = c.out.size() - c.out_pos > limits.max_value + kReadChunk;
  epoll_event ev{};
  ev.data.u64 = id;
  ev.events = (want ? EPOLLOUT : 0U) | (backlog || c.closing ? 0U : EPOLLIN | EPOLLRDHUP);
  epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
  c.want_write = want;
}

void StoreServer::Impl::send(uint64_t id, Connection& c, std::string bytes) {
  if (c.out_pos == c.out.size()) {
    c.out.clear();
    c.out_pos = 0;
  }
  c.out += bytes;
  // Try at once: most answers fit the socket buffer, and the loop then needs no EPOLLOUT turn.
  while (c.out_pos < c.out.size()) {
    const ssize_t n =
        ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN (EPOLLOUT resumes) or an error (the next read or write reports it)
  }
  if ((c.out_pos < c.out.size()) != c.want_write) update_interest(id, c);
}

void StoreServer::Impl::close_conn(uint64_t id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  Connection& c = it->second;
  clear_wait(id, c);
  for (const auto& key : c.watched_keys) {
    auto w = watchers.find(key);
    if (w == watchers.end()) continue;
    w->second.erase(std::remove(w->second.begin(), w->second.end(), id), w->second.end());
    if (w->second.empty()) watchers.erase(w);
  }
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
  conns.erase(it);
  --open;
  if (listener_paused) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerId;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, listen_fd, &ev);
    listener_paused = false;
  }
}

void StoreServer::Impl::clear_wait(uint64_t id, Connection& c) {
  for (const auto& key : c.awaited_keys) {
    auto w = waiting.find(key);
    if (w == waiting.end()) continue;
    w->second.erase(std::remove(w->second.begin(), w->second.end(), id), w->second.end());
    if (w->second.empty()) waiting.erase(w);
  }
  c.awaited_keys.clear();
  c.awaited = 0;
}

bool StoreServer::Impl::keys_present(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) {
    if (data.count(k) != 0) return true;
    auto q = queues.find(k);
    return q != queues.end() && !q->second.empty();
  });
}

void StoreServer::Impl::put(const std::string& key, std::string value) {
  auto pos = data.find(key);
  if (pos == data.end()) {
    const std::string& stored = data[key] = std::move(value);
    changed(key, store::kWatchKeyCreated, "", stored);
  } else {
    std::string old = std::exchange(pos->second, std::move(value));
    changed(key, store::kWatchKeyUpdated, old, pos->second);
  }
}

std::string_view StoreServer::Impl::value_of(const std::string& key) const {
  auto pos = data.find(key);
  return pos == data.end() ? std::string_view() : std::string_view(pos->second);
}

// A key was created or changed: wake its waiters, tell its watchers (1.13's watchKey).
void StoreServer::Impl::changed(const std::string& key, uint8_t watch_type,
                                const std::string& old_value, const std::string& new_value) {
  if (auto w = waiting.find(key); w != waiting.end()) {
    std::vector<uint64_t> ids = std::move(w->second);
    waiting.erase(w);
    for (uint64_t id : ids) {
      auto c = conns.find(id);
      if (c == conns.end() || c->second.awaited == 0) continue;
      if (--c->second.awaited == 0) {
        c->second.awaited_keys.clear();
        send(id, c->second, std::string(1, static_cast<char>(store::kStopWaiting)));
      }
    }
  }
  if (auto w = watchers.find(key); w != watchers.end()) {
    Writer msg;
    msg.u8(watch_type).bytes(key).bytes(old_value).bytes(new_value);
    for (uint64_t id : w->second) {
      if (auto c = conns.find(id); c != conns.end()) send(id, c->second, msg.data());
    }
  }
}

// QUEUE_PUSH wakes one waiter of the queue, as torch does: the first one that waits for no other
// key; waiters for more keys in front of it have this one counted.
void StoreServer::Impl::wake_one(const std::string& key) {
  auto w = waiting.find(key);
  while (w != waiting.end() && !w->second.empty()) {
    const uint64_t id = w->second.front();
    w->second.erase(w->second.begin());
    auto c = conns.find(id);
    if (c == conns.end() || c->second.awaited == 0) continue;
    if (--c->second.awaited == 0) {
      if (w->second.empty()) waiting.erase(w);
      clear_wait(id, c->second);
      send(id, c->second, std::string(1, static_cast<char>(store::kStopWaiting)));
      return;
    }
  }
  if (w != waiting.end()) waiting.erase(w);
}

std::string StoreServer::Impl::join(Connection& c, const std::string& token) {
  if (options.join_token.empty()) return "open";
  if (!same_token(token, options.join_token)) {
    ++refused;
    ddp::log::warn(
        "rendezvous store: refused {}: {} join token; every agent of the job needs the same "
        "--rdzv-conf token_file",
        c.peer, token.empty() ? "no" : "a wrong");
    c.closing = true;
    return token.empty() ? "refused: this job requires a join token (--rdzv-conf token_file or "
                           "DDPRUN_RDZV_TOKEN_FILE)"
                         : "refused: wrong join token; give every agent of the job the same "
                           "--rdzv-conf token_file";
  }
  if (!c.admitted) {
    c.admitted = true;
    admitted_ips.insert(c.peer_ip);
  }
  return "ok";
}

std::size_t StoreServer::Impl::serve_one(uint64_t id, Connection& c) {
  const std::string_view in = std::string_view(c.in).substr(c.in_pos);
  if (in.empty()) return 0;
  if (!c.dialect) {
    if (in[0] == 0) {
      if (in.size() < 5) return 0;
      uint32_t magic = 0;
      std::memcpy(&magic, in.data() + 1, 4);
      c.dialect = magic == store::kValidationMagic ? Dialect::kModern : Dialect::kLegacy;
    } else {
      c.dialect = Dialect::kLegacy;
    }
  }
  Reader r(in, c.admitted ? limits : unadmitted_limits);
  uint8_t byte = 0;
  r.u8(byte);
  const auto op = store::decode_op(*c.dialect, byte);
  if (!op) {
    throw ProtocolError("unknown query byte " + std::to_string(byte) + " in PyTorch's " +
                        store::dialect_name(*c.dialect) +
                        " store protocol (a PyTorch newer than this ddprun, or not a c10d "
                        "client; upgrade ddprun if it is PyTorch)");
  }
  Writer out;
  std::string key, a, b;
  switch (*op) {
    case Op::kValidate: {
      uint32_t magic = 0;
      if (!r.value(magic)) return incomplete(c, r);
      if (magic != store::kValidationMagic) throw ProtocolError("a wrong validation number");
      break;
    }
    case Op::kPing: {
      uint32_t nonce = 0;
      if (!r.value(nonce)) return incomplete(c, r);
      out.value(nonce);
      break;
    }
    case Op::kNumKeys:
      out.value<int64_t>(static_cast<int64_t>(data.size()));
      break;
    case Op::kCompareSet: {
      if (!r.key(key)) return incomplete(c, r);
      // Refused before the values are read: they may be large.
      if (!c.admitted && key != kJoinKey) return refuse(c, *op, in.size());
      if (!r.payload(a) || !r.payload(b)) return incomplete(c, r);
      if (key == kJoinKey) {
        out.bytes(join(c, a));
        break;
      }
      auto pos = data.find(key);
      if (pos == data.end() ? a.empty() : pos->second == a) {
        out.bytes(b);
        put(key, std::move(b));
      } else {
        // torch answers `expected` for a missing key, else the current value
        out.bytes(pos == data.end() ? std::string_view(a) : std::string_view(pos->second));
      }
      break;
    }
    default:
      if (!c.admitted) return refuse(c, *op, in.size());
      switch (*op) {
        case Op::kSet: {
          if (!r.key(key) || !r.payload(a)) return incomplete(c, r);
          put(key, std::move(a));
          break;
        }
        case Op::kGet: {
          if (!r.key(key)) return incomplete(c, r);
          out.bytes(value_of(key));
          break;
        }
        case Op::kAdd: {
          int64_t delta = 0;
          if (!r.key(key) || !r.value(delta)) return incomplete(c, r);
          int64_t value = delta;
          if (auto pos = data.find(key); pos != data.end()) {
            const std::string& old = pos->second;
            errno = 0;
            char* end = nullptr;
            const long long current = std::strtoll(old.c_str(), &end, 10);
            // torch's std::stoll: a leading integer is enough ("5x" counts as 5).
            if (end == old.c_str() || errno != 0) {
              throw ProtocolError("ADD on key '" + key + "', whose value is not an integer");
            }
            value =
                static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(delta));
          }
          put(key, std::to_string(value));
          out.value<int64_t>(value);
          break;
        }
        case Op::kCheck:
        case Op::kWait:
        case Op::kMultiGet: {
          uint64_t n = 0;
          if (!r.count(n)) return incomplete(c, r);
          std::vector<std::string> keys(static_cast<std::size_t>(n));
          for (auto& k : keys) {
            if (!r.key(k)) return incomplete(c, r);
          }
          if (*op == Op::kCheck) {
            out.u8(keys_present(keys) ? store::kCheckReady : store::kCheckNotReady);
          } else if (*op == Op::kMultiGet) {
            std::vector<std::string_view> values;
            values.reserve(keys.size());
            std::size_t size = 0;
            for (const auto& k : keys) {
              values.push_back(value_of(k));
              size += 8 + values.back().size();
            }
            if (size > options.max_request_bytes) {
              throw ProtocolError("a MULTI_GET whose answer would be " + std::to_string(size) +
                                  " bytes (the limit is " +
                                  std::to_string(options.max_request_bytes) + ")");
            }
            for (const auto v : values) out.bytes(v);
          } else if (keys_present(keys)) {
            out.u8(store::kStopWaiting);
          } else {
            clear_wait(id, c);
            for (const auto& k : keys) {
              if (data.count(k) != 0) continue;
              waiting[k].push_back(id);
              c.awaited_keys.push_back(k);
              ++c.awaited;
            }
          }
          break;
        }
        case Op::kDeleteKey: {
          if (!r.key(key)) return incomplete(c, r);
          auto pos = data.find(key);
          int64_t deleted = 0;
          if (pos != data.end()) {
            std::string old = std::move(pos->second);
            data.erase(pos);
            deleted = 1;
            if (auto w = watchers.find(key); w != watchers.end()) {
              Writer msg;
              msg.u8(store::kWatchKeyDeleted).bytes(key).bytes(old).bytes("");
              for (uint64_t wid : w->second) {
                if (auto wc = conns.find(wid); wc != conns.end()) send(wid, wc->second, msg.data());
              }
            }
          }
          out.value<int64_t>(deleted);
          break;
        }
        case Op::kAppend: {
          if (!r.key(key) || !r.payload(a)) return incomplete(c, r);
          auto pos = data.find(key);
          const bool created = pos == data.end();
          if (created) {
            data[key] = a;
          } else if (pos->second.size() + a.size() > limits.max_value) {
            throw ProtocolError("APPEND would grow key '" + key + "' beyond the value limit of " +
                                std::to_string(limits.max_value) + " bytes");
          } else {
            pos->second += a;
          }
          changed(key, created ? store::kWatchKeyCreated : store::kWatchKeyAppended, "", a);
          break;
        }
        case Op::kMultiSet: {
          uint64_t n = 0;
          if (!r.count(n)) return incomplete(c, r);
          std::vector<std::pair<std::string, std::string>> kvs(static_cast<std::size_t>(n));
          for (auto& [k, v] : kvs) {
            if (!r.key(k) || !r.payload(v)) return incomplete(c, r);
          }
          for (auto& [k, v] : kvs) put(k, std::move(v));
          break;
        }
        case Op::kCancelWait:
          clear_wait(id, c);
          out.u8(store::kWaitCanceled);
          break;
        case Op::kWatchKey:
          if (!r.key(key)) return incomplete(c, r);
          watchers[key].push_back(id);
          c.watched_keys.push_back(key);
          out.u8(store::kWatchCallbackRegistered);
          break;
        case Op::kQueuePush:
          if (!r.key(key) || !r.payload(a)) return incomplete(c, r);
          queues[key].push_back(std::move(a));
          wake_one(key);
          break;
        case Op::kQueuePop: {
          if (!r.key(key)) return incomplete(c, r);
          auto q = queues.find(key);
          const int64_t size = q == queues.end() ? 0 : static_cast<int64_t>(q->second.size());
          out.value<int64_t>(size);
          if (size > 0) {
            out.bytes(q->second.front());
            q->second.pop_front();
            if (q->second.empty()) queues.erase(q);
          }
          break;
        }
        case Op::kQueueLen: {
          if (!r.key(key)) return incomplete(c, r);
          auto q = queues.find(key);
          out.value<int64_t>(q == queues.end() ? 0 : static_cast<int64_t>(q->second.size()));
          break;
        }
        default:
          break;
      }
  }
  if (!out.data().empty()) send(id, c, std::move(out.data()));
  return r.consumed();
}

std::size_t StoreServer::Impl::refuse(Connection& c, Op op, std::size_t unread) {
  ++refused;
  ddp::log::warn(
      "rendezvous store: refused {} from {}: the address is not a member of this job and "
      "presented no join token (agents join with --rdzv-conf token_file)",
      store::op_name(op), c.peer);
  c.closing = true;
  return unread;
}

void StoreServer::Impl::accept_all() {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    const int fd =
        accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Level-triggered: the listener would fire again at once. Accept again once a
        // connection closes.
        ddp::log::warn(
            "rendezvous store: out of file descriptors ({}) with {} connections open; new "
            "connections wait until one closes (raise the nofile limit)",
            errno_text(errno), conns.size());
        epoll_event ev{};
        ev.data.u64 = kListenerId;
        epoll_ctl(epoll_fd, EPOLL_CTL_MOD, listen_fd, &ev);
        listener_paused = true;
      }
      return;  // EAGAIN: none left
    }
    Connection c;
    c.fd = fd;
    c.peer_ip = address_text(addr);
    c.peer = (c.peer_ip.find(':') != std::string::npos ? "[" + c.peer_ip + "]" : c.peer_ip) + ":" +
             std::to_string(port_of(addr));
    if (conns.size() >= options.max_connections) {
      ddp::log::warn("rendezvous store: closed a connection from {}: {} connections are open",
                     c.peer, conns.size());
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c.admitted = options.join_token.empty() || admitted_ips.count(c.peer_ip) != 0 ||
                 (options.admit_local && is_loopback(c.peer_ip));
    const uint64_t id = next_id++;
    epoll_event ev{};
    ev.data.u64 = id;
    ev.events = EPOLLIN | EPOLLRDHUP;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
    conns.emplace(id, std::move(c));
    ++accepted;
    ++open;
  }
}

void StoreServer::Impl::on_writable(uint64_t id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  Connection& c = it->second;
  while (c.out_pos < c.out.size()) {
    const ssize_t n =
        ::send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_pos += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;
    } else {
      close_conn(id);
      return;
    }
  }
  c.out.clear();
  c.out_pos = 0;
  if (c.closing) {
    close_conn(id);
    return;
  }
  update_interest(id, c);
  if (!c.in.empty()) on_readable(id);  // requests held back while answers were pending
}

void StoreServer::Impl::on_readable(uint64_t id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  Connection& c = it->second;
  bool eof = false;
  char chunk[kReadChunk];
  const std::size_t input_limit = c.admitted ? options.max_request_bytes : kUnadmittedBytes;
  while (c.in.size() <= input_limit) {
    const ssize_t n = recv(c.fd, chunk, sizeof(chunk), 0);
    if (n > 0) {
      c.in.append(chunk, static_cast<std::size_t>(n));
      if (static_cast<std::size_t>(n) < sizeof(chunk)) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    eof = true;  // closed by the peer, or an error
    break;
  }
  try {
    bool incomplete_request = false;
    // A request whose bytes have not all arrived is not parsed again until they have.
    while (!c.closing && c.in.size() >= c.need &&
           c.out.size() - c.out_pos <= limits.max_value + kReadChunk) {
      const std::size_t n = serve_one(id, c);
      if (n == 0) {
        incomplete_request = true;
        break;
      }
      c.in_pos += n;
      c.need = 0;
    }
    c.need -= std::min(c.need, c.in_pos);
    c.in.erase(0, c.in_pos);
    c.in_pos = 0;
    incomplete_request = incomplete_request || c.in.size() < c.need;
    const std::size_t limit = c.admitted ? options.max_request_bytes : kUnadmittedBytes;
    if (incomplete_request && (c.in.size() > limit || c.need > limit)) {
      throw ProtocolError("a request larger than " + std::to_string(limit) + " bytes" +
                          (c.admitted ? "" : " before presenting the join token"));
    }
  } catch (const ProtocolError& e) {
    ++protocol_errors;
    ddp::log::warn("rendezvous store: closed the connection from {}: {}", c.peer, e.what());
    close_conn(id);
    return;
  } catch (const std::bad_alloc&) {
    ++protocol_errors;
    ddp::log::warn("rendezvous store: closed the connection from {}: out of memory", c.peer);
    close_conn(id);
    return;
  }
  if (eof || (c.closing && c.out_pos == c.out.size())) {
    close_conn(id);
    return;
  }
  if (c.closing) c.in.clear();
  update_interest(id, c);
}

void StoreServer::Impl::run() {
  std::vector<epoll_event> events(256);
  for (;;) {
    const int n = epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      ddp::log::error("rendezvous store: epoll_wait failed: {}", errno_text(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kWakeId) return;
      if (id == kListenerId) {
        accept_all();
        continue;
      }
      const uint32_t ev = events[i].events;
      if (ev & EPOLLOUT) on_writable(id);
      if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) on_readable(id);
    }
  }
}

StoreServer::StoreServer(const StoreServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {
  Impl& s = *impl_;
  s.listen_on(options.port);
  s.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.epoll_fd < 0 || s.wake_fd < 0) {
    const std::string why = errno_text(errno);
    if (s.epoll_fd >= 0) close(s.epoll_fd);
    if (s.wake_fd >= 0) close(s.wake_fd);
    close(s.listen_fd);
    throw StoreError("rendezvous store: cannot create its event loop: " + why);
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.listen_fd, &ev);
  ev.data.u64 = kWakeId;
  epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.wake_fd, &ev);
  if (!options.join_token.empty() && options.admit_local) s.admitted_ips = local_addresses();
  // Leave the process (the agent: its pipes, its workers) descriptors of its own.
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const auto usable = lim.rlim_cur > 512 ? lim.rlim_cur - 256 : lim.rlim_cur / 2;
    s.options.max_connections = std::min<std::size_t>(s.options.max_connections, usable);
  }
  s.loop = std::thread([&s] { s.run(); });
}

StoreServer::~StoreServer() {
  Impl& s = *impl_;
  const uint64_t one = 1;
  if (write(s.wake_fd, &one, sizeof(one)) < 0) {
    // The loop cannot miss it: eventfd writes fail only on overflow.
  }
  if (s.loop.joinable()) s.loop.join();
  for (auto& [id, c] : s.conns) close(c.fd);
  close(s.listen_fd);
  close(s.epoll_fd);
  close(s.wake_fd);
}

int StoreServer::port() const { return impl_->port; }

StoreServerStats StoreServer::stats() const {
  return {impl_->accepted.load(), impl_->refused.load(), impl_->protocol_errors.load(),
          impl_->open.load()};
}

}  // namespace ddp
