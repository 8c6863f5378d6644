// The store server's sockets and event loop; its queries are in server_queries.cpp.
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
#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ddp/error.h"
#include "ddp/log.h"
#include "store/server_impl.h"
#include "store/wire.h"

namespace ddp {
namespace {

using store::ProtocolError;

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

}  // namespace

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
  if (c.agent) {
    // An agent's address stays admitted while another of its connections is open.
    auto a = agent_ips.find(c.peer_ip);
    if (a != agent_ips.end() && --a->second <= 0) agent_ips.erase(a);
    --agents;
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

bool StoreServer::Impl::address_admitted(const std::string& ip) {
  if (local_ips.count(ip) != 0 || (options.admit_local && is_loopback(ip))) return true;
  if (agent_ips.count(ip) == 0) return false;
  std::lock_guard<std::mutex> lock(members_mu);
  return !members || members->count(ip) != 0;
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
    c.admitted = options.join_token.empty() || address_admitted(c.peer_ip);
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
  if (!options.join_token.empty() && options.admit_local) s.local_ips = local_addresses();
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
          impl_->open.load(), impl_->agents.load()};
}

void StoreServer::admit_members(const std::vector<std::string>& addresses) {
  std::lock_guard<std::mutex> lock(impl_->members_mu);
  impl_->members.emplace(addresses.begin(), addresses.end());
}

}  // namespace ddp
