#include "doctor/link_probe.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kChunk = 1 << 20;
constexpr char kPing = 'P';
constexpr char kUpload = 'U';
constexpr char kDownload = 'D';

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  Socket& operator=(Socket&&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

std::string errno_text() { return std::strerror(errno); }

void set_timeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<long>(timeout.count() / 1000);
  tv.tv_usec = static_cast<long>(timeout.count() % 1000) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void send_all(int fd, const void* data, std::size_t size, const char* what) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw LinkError(
          std::string(what) + ": send failed (" +
          (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? "timed out" : errno_text()) + ")");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

void recv_all(int fd, void* data, std::size_t size, const char* what) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) throw LinkError(std::string(what) + ": the peer closed the connection");
    if (n < 0) {
      throw LinkError(std::string(what) + ": receive failed (" +
                      (errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : errno_text()) + ")");
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Streams for `duration`, then ends the stream.
void stream_for(int fd, std::chrono::milliseconds duration, const char* what) {
  std::vector<char> chunk(kChunk, 'x');
  const auto end = Clock::now() + duration;
  while (Clock::now() < end) send_all(fd, chunk.data(), chunk.size(), what);
  shutdown(fd, SHUT_WR);
}

struct Received {
  uint64_t bytes = 0;
  uint64_t nanoseconds = 0;  // first byte to end of stream
};

Received drain(int fd, const char* what) {
  std::vector<char> buffer(kChunk);
  Received r;
  Clock::time_point first{};
  for (;;) {
    const ssize_t n = recv(fd, buffer.data(), buffer.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw LinkError(std::string(what) + ": receive failed (" +
                      (errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : errno_text()) + ")");
    }
    if (n == 0) break;
    if (r.bytes == 0) first = Clock::now();
    r.bytes += static_cast<uint64_t>(n);
  }
  if (r.bytes > 0) {
    r.nanoseconds = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - first).count());
  }
  return r;
}

double gbps(const Received& r) {
  return r.nanoseconds == 0
             ? 0.0
             : static_cast<double>(r.bytes) * 8.0 / static_cast<double>(r.nanoseconds);
}

Socket connect_to(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    throw LinkError("cannot resolve '" + host + "' (" + gai_strerror(rc) + ")");
  }
  std::string error = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    Socket s(socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.fd() < 0) continue;
    set_timeouts(s.fd(), timeout);  // SO_SNDTIMEO bounds connect() too
    if (connect(s.fd(), ai->ai_addr, ai->ai_addrlen) == 0) {
      freeaddrinfo(found);
      return s;
    }
    error = errno == EINPROGRESS || errno == EAGAIN ? "timed out" : errno_text();
  }
  freeaddrinfo(found);
  throw LinkError("cannot connect to " + host + ":" + std::to_string(port) + " (" + error + ")");
}

void serve_connection(int fd) {
  char command = 0;
  recv_all(fd, &command, 1, "command");
  if (command == kPing) {
    uint32_t count = 0;
    recv_all(fd, &count, sizeof(count), "ping count");
    uint64_t payload = 0;
    for (uint32_t i = 0; i < count; ++i) {
      recv_all(fd, &payload, sizeof(payload), "ping");
      send_all(fd, &payload, sizeof(payload), "pong");
    }
  } else if (command == kUpload) {
    const Received r = drain(fd, "upload");
    const uint64_t reply[2] = {r.bytes, r.nanoseconds};
    send_all(fd, reply, sizeof(reply), "upload result");
  } else if (command == kDownload) {
    uint64_t ms = 0;
    recv_all(fd, &ms, sizeof(ms), "download length");
    stream_for(fd, std::chrono::milliseconds(std::min<uint64_t>(ms, 600000)), "download");
    char end = 0;
    (void)recv(fd, &end, 1, 0);  // the client closes once it has read everything
  }
}

}  // namespace

LinkProbeServer::LinkProbeServer(const std::string& address, std::chrono::milliseconds io_timeout)
    : io_timeout_(io_timeout) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (address.empty() || address == "0.0.0.0") {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    throw LinkError("the link probe needs a numeric IPv4 address, not '" + address + "'");
  }
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(addr);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 16) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = errno_text();
    if (listen_fd_ >= 0) close(listen_fd_);
    throw LinkError("cannot listen for link probes on " + address + " (" + why + ")");
  }
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

LinkProbeServer::~LinkProbeServer() {
  stopping_ = true;
  thread_.join();
  close(listen_fd_);
}

void LinkProbeServer::serve() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Socket connection(fd);
    set_timeouts(fd, io_timeout_);
    try {
      serve_connection(fd);
    } catch (const LinkError&) {
      // The client reports the failure: it is the side that measures.
    }
  }
}

LinkFigures measure_link(const std::string& host, int port, const LinkProbeOptions& options) {
  LinkFigures figures;
  {
    Socket s = connect_to(host, port, options.io_timeout);
    const uint32_t count = static_cast<uint32_t>(std::max(1, options.pings));
    send_all(s.fd(), &kPing, 1, "latency");
    send_all(s.fd(), &count, sizeof(count), "latency");
    std::vector<double> round_trips;
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t payload = i;
      uint64_t echoed = 0;
      const auto start = Clock::now();
      send_all(s.fd(), &payload, sizeof(payload), "latency");
      recv_all(s.fd(), &echoed, sizeof(echoed), "latency");
      round_trips.push_back(
          std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      if (echoed != payload) throw LinkError("latency: the peer echoed a wrong value");
    }
    std::nth_element(round_trips.begin(), round_trips.begin() + round_trips.size() / 2,
                     round_trips.end());
    figures.latency_us = round_trips[round_trips.size() / 2] / 2;
  }
  {
    Socket s = connect_to(host, port, options.io_timeout);
    send_all(s.fd(), &kUpload, 1, "bandwidth out");
    stream_for(s.fd(), options.transfer, "bandwidth out");
    uint64_t reply[2] = {};
    recv_all(s.fd(), reply, sizeof(reply), "bandwidth out");
    figures.out_gbps = gbps(Received{reply[0], reply[1]});
  }
  {
    Socket s = connect_to(host, port, options.io_timeout);
    const uint64_t ms = static_cast<uint64_t>(options.transfer.count());
    send_all(s.fd(), &kDownload, 1, "bandwidth in");
    send_all(s.fd(), &ms, sizeof(ms), "bandwidth in");
    figures.in_gbps = gbps(drain(s.fd(), "bandwidth in"));
  }
  return figures;
}

}  // namespace ddprun
