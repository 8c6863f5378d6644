#include "metrics_endpoint.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "ddp/error.h"
#include "ddp/log.h"

namespace ddprun {

const char* to_string(WorkerRunState state) {
  switch (state) {
    case WorkerRunState::kRunning:
      return "running";
    case WorkerRunState::kSucceeded:
      return "succeeded";
    case WorkerRunState::kFailed:
      return "failed";
    case WorkerRunState::kStopped:
      return "stopped";
  }
  return "unknown";
}

namespace {

// A number as Prometheus reads it: shortest round trip, so a value equals what was written.
std::string number(double v) {
  std::ostringstream out;
  out.precision(17);
  out << v;
  return out.str();
}

class Family {
 public:
  Family(std::ostringstream& out, const char* name, const char* type, const char* help)
      : out_(out), name_(name) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  void sample(const std::string& labels, double value) {
    out_ << name_ << '{' << labels << "} " << number(value) << '\n';
  }

 private:
  std::ostringstream& out_;
  const char* name_;
};

std::string worker_labels(int node, const WorkerView& w) {
  return "node=\"" + std::to_string(node) + "\",rank=\"" + std::to_string(w.rank) +
         "\",local_rank=\"" + std::to_string(w.local_rank) + "\"";
}

}  // namespace

std::string render_exposition(const NodeView& node,
                              const std::vector<std::optional<ddp::live::Snapshot>>& live) {
  std::ostringstream out;
  const std::string node_label = "node=\"" + std::to_string(node.node_rank) + "\"";
  Family(out, "ddprun_restarts_total", "counter",
         "Restarts of the worker group since ddprun started")
      .sample(node_label, node.round);
  Family(out, "ddprun_workers_started", "gauge", "1 once this node's workers have started")
      .sample(node_label, node.started ? 1 : 0);
  {
    Family f(out, "ddprun_worker_state", "gauge",
             "1 for the state each worker is in: running, succeeded, failed or stopped");
    for (const WorkerView& w : node.workers) {
      for (WorkerRunState s : {WorkerRunState::kRunning, WorkerRunState::kSucceeded,
                               WorkerRunState::kFailed, WorkerRunState::kStopped}) {
        f.sample(worker_labels(node.node_rank, w) + ",state=\"" + to_string(s) + "\"",
                 w.state == s ? 1 : 0);
      }
    }
  }
  struct Metric {
    const char* name;
    const char* type;
    const char* help;
    // The value, or nullopt for none (a gauge before its first record).
    std::optional<double> (*value)(const ddp::live::Snapshot&);
  };
  using S = ddp::live::Snapshot;
  using V = std::optional<double>;
  static const Metric metrics[] = {
      {"ddp_steps_total", "counter", "Training steps this rank ran",
       [](const S& s) -> V { return static_cast<double>(s.steps); }},
      {"ddp_images_total", "counter", "Images this rank trained on",
       [](const S& s) -> V { return static_cast<double>(s.images); }},
      {"ddp_step_seconds_total", "counter", "Wall time of this rank's training steps",
       [](const S& s) -> V { return s.step_seconds_total; }},
      {"ddp_allreduce_wait_seconds_total", "counter",
       "Time this rank's steps waited for gradient allreduces (what overlap did not hide)",
       [](const S& s) -> V { return s.allreduce_wait_seconds_total; }},
      {"ddp_allreduce_bytes_total", "counter", "Gradient bytes this rank allreduced",
       [](const S& s) -> V { return s.allreduce_bytes_total; }},
      {"ddp_step", "gauge", "Global step of the last progress record",
       [](const S& s) -> V { return s.step >= 0 ? V(static_cast<double>(s.step)) : V(); }},
      {"ddp_epoch", "gauge", "Epoch (from 0) of the last progress record",
       [](const S& s) -> V { return s.step >= 0 ? V(static_cast<double>(s.epoch)) : V(); }},
      {"ddp_loss", "gauge", "This rank's training loss at the last progress record",
       [](const S& s) -> V { return s.step >= 0 ? V(s.loss) : V(); }},
      {"ddp_learning_rate", "gauge", "Learning rate at the last progress record",
       [](const S& s) -> V { return s.step >= 0 ? V(s.learning_rate) : V(); }},
      {"ddp_images_per_second", "gauge", "This rank's images per second over the last log window",
       [](const S& s) -> V { return s.step >= 0 ? V(s.images_per_second) : V(); }},
      {"ddp_step_time_seconds", "gauge", "Mean step time over the last log window",
       [](const S& s) -> V { return s.step >= 0 ? V(s.step_seconds) : V(); }},
      {"ddp_straggler_ratio", "gauge",
       "This rank's compute time over the median rank's in the last straggler window",
       [](const S& s) -> V { return s.straggler_ratio > 0 ? V(s.straggler_ratio) : V(); }},
  };
  for (const Metric& m : metrics) {
    bool any = false;
    for (std::size_t i = 0; i < node.workers.size() && i < live.size(); ++i) {
      any = any || (live[i] && m.value(*live[i]));
    }
    if (!any) continue;
    Family f(out, m.name, m.type, m.help);
    for (std::size_t i = 0; i < node.workers.size() && i < live.size(); ++i) {
      if (!live[i]) continue;
      if (const V v = m.value(*live[i]))
        f.sample(worker_labels(node.node_rank, node.workers[i]), *v);
    }
  }
  return out.str();
}

void MetricsBoard::workers_started(int node_rank, int round, std::vector<WorkerView> workers) {
  std::lock_guard<std::mutex> lock(mutex_);
  node_.node_rank = node_rank;
  node_.round = round;
  node_.started = true;
  node_.workers = std::move(workers);
}

void MetricsBoard::worker_exited(int local_rank, WorkerRunState state) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (WorkerView& w : node_.workers) {
    if (w.local_rank == local_rank) w.state = state;
  }
}

std::string MetricsBoard::render() const {
  NodeView node;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    node = node_;
  }
  std::vector<std::optional<ddp::live::Snapshot>> live;
  for (const WorkerView& w : node.workers) {
    live.push_back(w.live_file.empty() ? std::nullopt : ddp::live::read(w.live_file));
  }
  return render_exposition(node, live);
}

MetricsServer::MetricsServer(int port, std::function<std::string()> render)
    : render_(std::move(render)) {
  const auto fail = [&](const char* what) {
    const std::string reason = std::strerror(errno);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw ddp::ConfigError("--metrics-port " + std::to_string(port) + ": cannot " + what + " (" +
                           reason + "); choose a free port, or leave the flag out");
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
  ddp::log::info("metrics: Prometheus endpoint on port {} (GET /metrics)", port_);
}

MetricsServer::~MetricsServer() {
  if (stop_fds_[1] >= 0) {
    const char byte = 0;
    [[maybe_unused]] const ssize_t n = ::write(stop_fds_[1], &byte, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, stop_fds_[0], stop_fds_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void MetricsServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fds_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      ddp::log::warn("metrics: poll failed ({}); the endpoint stops", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int connection = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (connection < 0) continue;
    answer(connection);
    ::close(connection);
  }
}

void MetricsServer::answer(int connection) {
  // A scraper that stalls costs at most these two seconds each way.
  const timeval limit{2, 0};
  ::setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  ::setsockopt(connection, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  std::string request;
  char buffer[2048];
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos && request.size() < 16384) {
    const ssize_t n = ::recv(connection, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    request.append(buffer, static_cast<std::size_t>(n));
  }
  const std::string line = request.substr(0, request.find_first_of("\r\n"));
  std::string status = "200 OK";
  std::string type = "text/plain; version=0.0.4; charset=utf-8";
  std::string body;
  const bool get = line.rfind("GET ", 0) == 0;
  const std::string target = get ? line.substr(4, line.find(' ', 4) - 4) : "";
  if (!get) {
    status = "405 Method Not Allowed";
    type = "text/plain";
    body = "only GET /metrics\n";
  } else if (target == "/metrics" || target.rfind("/metrics?", 0) == 0) {
    try {
      body = render_();
    } catch (const std::exception& e) {
      status = "500 Internal Server Error";
      type = "text/plain";
      body = std::string(e.what()) + "\n";
    }
  } else {
    status = "404 Not Found";
    type = "text/plain";
    body = "ddprun serves its metrics at /metrics\n";
  }
  const std::string response = "HTTP/1.0 " + status + "\r\nContent-Type: " + type +
                               "\r\nContent-Length: " + std::to_string(body.size()) +
                               "\r\nConnection: close\r\n\r\n" + body;
  std::size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n =
        ::send(connection, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

}  // namespace ddprun
