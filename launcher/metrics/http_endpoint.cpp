#include "metrics/http_endpoint.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "ddp/error.h"
#include "ddp/log.h"

namespace ddprun {

HttpServer::HttpServer(int port, std::string name, HttpRoutes routes)
    : name_(std::move(name)), routes_(std::move(routes)) {
  const auto fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw ddp::ConfigError(name_ + " " + std::to_string(port) + ": cannot " + what + " (" + reason +
                           "); choose a free port, or leave it unset");
  };
  listen_fd_ = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool v6 = listen_fd_ >= 0;
  if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) fail("open a socket");
  const int on = 1;
  const int off = 0;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  int rc;
  if (v6) {
    ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);  // IPv4 too
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  }
  if (rc != 0) fail("listen on it");
  if (::listen(listen_fd_, 16) != 0) fail("listen on it");
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (::pipe2(stop_fds_, O_CLOEXEC) != 0) fail("make its stop pipe");
  thread_ = std::thread([this] { serve(); });
}

HttpServer::~HttpServer() {
  if (stop_fds_[1] >= 0) {
    const char byte = 0;
    [[maybe_unused]] const ssize_t n = ::write(stop_fds_[1], &byte, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, stop_fds_[0], stop_fds_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void HttpServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fds_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      ddp::log::warn("{}: poll failed ({}); the endpoint stops", name_, std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & (POLLERR | POLLNVAL)) != 0) {
      ddp::log::warn("{}: the listening socket failed; the endpoint stops", name_);
      return;
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    answer(connection);
    ::close(connection);
  }
}

void HttpServer::answer(int connection) {
  // One client costs at most two seconds in all, however it trickles its bytes: the endpoint has
  // one thread, and a liveness probe waits behind it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  const auto ready = [&](short events) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    pollfd fd{connection, events, 0};
    return left > 0 && ::poll(&fd, 1, static_cast<int>(left)) > 0;
  };
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos && request.size() < 16384 && ready(POLLIN)) {
    const ssize_t n = ::recv(connection, buffer, sizeof buffer, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    request.append(buffer, static_cast<std::size_t>(n));
  }
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  const HttpResponse reply = route(line);
  const std::string response = "HTTP/1.0 " + reply.status + "\r\nContent-Type: " + reply.type +
                               "\r\nContent-Length: " + std::to_string(reply.body.size()) +
                               "\r\nConnection: close\r\n\r\n" + reply.body;
  std::size_t sent = 0;
  while (sent < response.size() && ready(POLLOUT)) {
    const ssize_t n = ::send(connection, response.data() + sent, response.size() - sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

HttpResponse HttpServer::route(const std::string& request_line) const {
  const bool get = request_line.rfind("GET ", 0) == 0;
  std::string target = get ? request_line.substr(4, request_line.find(' ', 4) - 4) : "";
  target = target.substr(0, target.find('?'));
  std::string paths;
  for (const auto& [path, handler] : routes_) paths += (paths.empty() ? "" : ", ") + path;
  if (!get) return {"405 Method Not Allowed", "text/plain", "only GET " + paths + "\n"};
  auto it = routes_.find(target);
  if (it == routes_.end()) return {"404 Not Found", "text/plain", "ddprun serves " + paths + "\n"};
  try {
    return it->second();
  } catch (const std::exception& e) {
    return {"500 Internal Server Error", "text/plain", std::string(e.what()) + "\n"};
  }
}

}  // namespace ddprun
