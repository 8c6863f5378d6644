#pragma once
// A raw TCP client for the store server's tests: it sends whatever bytes it is given and reads
// what comes back, so that a test can speak the wire protocol (store/wire.h) byte by byte; and
// the process's resident memory, which those tests bound.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "store/wire.h"

namespace ddp {

// A raw TCP client that speaks whatever bytes it is given.
class Raw {
 public:
  // `source`: the loopback address to connect from (127.0.0.0/8 plays other hosts).
  explicit Raw(int port, const char* source = nullptr) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (source != nullptr) {
      sockaddr_in b{};
      b.sin_family = AF_INET;
      inet_pton(AF_INET, source, &b.sin_addr);
      EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&b), sizeof(b)), 0) << source;
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  }
  ~Raw() { close(fd_); }
  // False when the server has closed the connection.
  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // n bytes, or "" when the connection closed or nothing came within `limit`.
  std::string read(std::size_t n, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    std::string out(n, '\0');
    std::size_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (got < n) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return "";
      const ssize_t r = recv(fd_, out.data() + got, n - got, 0);
      if (r <= 0) return "";
      got += static_cast<std::size_t>(r);
    }
    return out;
  }
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }
  int fd() const { return fd_; }
  // Reads (and drops) everything until the server closes the connection; false at `limit`.
  bool drained_to_eof(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    char buf[4096];
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      const ssize_t r = recv(fd_, buf, sizeof(buf), 0);
      if (r <= 0) return true;
    }
  }
  // Whether the server closed the connection within `limit`.
  bool closed(std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(limit.count())) <= 0) return false;
    char c;
    return recv(fd_, &c, 1, MSG_PEEK) <= 0;
  }

 private:
  int fd_ = -1;
};

inline uint8_t code(store::Dialect d, store::Op op) { return *store::encode_op(d, op); }

inline std::string validate() {
  store::Writer w;
  w.u8(0).value(store::kValidationMagic);
  return w.data();
}

// This process's resident memory, KiB (/proc/self/status): what a test lets the server grow by.
inline long rss_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

}  // namespace ddp
