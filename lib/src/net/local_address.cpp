#include "ddp/net/local_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "ddp/error.h"

namespace ddp::net {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0) {
    throw ConfigError("cannot resolve '" + host + "' (" + gai_strerror(rc) +
                      "); check MASTER_ADDR or set DDP_SOCKET_IFNAME to the interface to use");
  }
  std::string result;
  for (addrinfo* ai = found; ai != nullptr && result.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) result = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (result.empty()) {
    throw ConfigError("no route from this host to '" + host +
                      "'; check the network or set DDP_SOCKET_IFNAME to the interface to use");
  }
  return result;
}

}  // namespace ddp::net
