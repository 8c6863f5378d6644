#include "ddp/net/tcp_probe.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "ddp/error.h"

namespace ddp::net {

std::string numeric_address(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = nullptr;
  if (addr->sa_family == AF_INET) {
    raw = &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr;
  } else if (addr->sa_family == AF_INET6) {
    raw = &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr;
  } else {
    return "";
  }
  return inet_ntop(addr->sa_family, raw, text, sizeof(text)) != nullptr ? text : "";
}

int connect_tcp(const std::string& host, int port, std::chrono::milliseconds limit,
                std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    why = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return -1;
  }
  why = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, static_cast<int>(std::max<long long>(1, limit.count()))) == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      freeaddrinfo(found);
      why.clear();
      return fd;
    }
    why = numeric_address(ai->ai_addr) + ":" + service + ": " + std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return -1;
}

std::string probe_tcp(const std::string& host, int port, std::chrono::milliseconds limit) {
  std::string why;
  const int fd = connect_tcp(host, port, limit, why);
  if (fd >= 0) close(fd);
  return why;
}

bool wait_for_listener(const std::string& host, int port,
                       std::chrono::steady_clock::time_point deadline) {
  using std::chrono::milliseconds;
  auto pause = milliseconds(5);
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    if (probe_tcp(host, port, std::min(left, milliseconds(1000))).empty()) return true;
    std::this_thread::sleep_for(std::min(pause, left));
    pause = std::min(pause * 2, milliseconds(100));
  }
}

int free_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    throw StoreError(std::string("cannot find a free TCP port: ") + std::strerror(error));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace ddp::net
