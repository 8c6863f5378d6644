#pragma once
// ddprun doctor's measure of one link between two pods, over plain TCP (the path gloo and
// fabric's tcp provider take): a listener on every agent, and a client that measures, towards
// it, the round-trip latency of small messages and the bandwidth in both directions. The
// receiving side times a transfer (first byte to end of stream), so a sender's socket buffer
// cannot flatter a slow link. Every socket call is bounded: a peer that stops answering fails
// the measure with a LinkError naming it, never hangs it.
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

namespace ddprun {

struct LinkFigures {
  double latency_us = 0;  // median round trip of an 8-byte ping-pong, halved
  double out_gbps = 0;    // client -> server, timed by the server
  double in_gbps = 0;     // server -> client, timed by the client
};

class LinkError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Serves measures, one connection at a time, until destroyed.
class LinkProbeServer {
 public:
  // Listens on `address` (numeric; "" or "0.0.0.0" for every interface), port 0 picks one.
  // `io_timeout` bounds every blocking call on an accepted connection. Throws LinkError.
  LinkProbeServer(const std::string& address, std::chrono::milliseconds io_timeout);
  ~LinkProbeServer();
  LinkProbeServer(const LinkProbeServer&) = delete;
  LinkProbeServer& operator=(const LinkProbeServer&) = delete;

  int port() const { return port_; }

 private:
  void serve();

  int listen_fd_ = -1;
  int port_ = 0;
  std::chrono::milliseconds io_timeout_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

struct LinkProbeOptions {
  std::chrono::milliseconds transfer{1000};  // each direction streams this long
  int pings = 200;
  std::chrono::milliseconds io_timeout{15000};
};

// Measures the link to the server at host:port. Throws LinkError naming the step that failed.
LinkFigures measure_link(const std::string& host, int port, const LinkProbeOptions& options);

}  // namespace ddprun
