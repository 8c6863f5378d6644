#pragma once
// A small blocking HTTP/1.0 responder on its own thread, for the agent's endpoints (Prometheus
// metrics, health): ddprun links only glibc. One request per connection, every socket call
// bounded by a timeout, GET only, one handler per path (a query string is ignored).
#include <functional>
#include <map>
#include <string>
#include <thread>

namespace ddprun {

struct HttpResponse {
  std::string status = "200 OK";
  std::string type = "text/plain; charset=utf-8";
  std::string body;
};

using HttpRoutes = std::map<std::string, std::function<HttpResponse()>>;

class HttpServer {
 public:
  // Listens on every address at `port` (0: a free one, see port()); throws ddp::ConfigError
  // naming `name` (the flag or variable that set the port) when it cannot (the port taken, say).
  HttpServer(int port, std::string name, HttpRoutes routes);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  // The answer to one request line ("GET /metrics HTTP/1.1"): its route's, or 404/405/500.
  HttpResponse route(const std::string& request_line) const;

 private:
  void serve();
  void answer(int connection);

  std::string name_;
  HttpRoutes routes_;
  int listen_fd_ = -1;
  int stop_fds_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
};

}  // namespace ddprun
