#pragma once
// The agent's Prometheus endpoint (ddprun --metrics-port N): GET /metrics answers the text
// exposition format (version 0.0.4) with this node's figures.
//  - From the agent: restarts, the round, each worker's state.
//  - From each worker built on the trainer: its live figures (ddp/live_metrics.h), read from the
//    file it maps shared, at scrape time; the training thread is never asked for anything.
// The server is http_endpoint.h's.
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/live_metrics.h"
#include "metrics/http_endpoint.h"

namespace ddprun {

enum class WorkerRunState { kRunning, kSucceeded, kFailed, kStopped };
const char* to_string(WorkerRunState state);

struct WorkerView {
  int rank = 0;
  int local_rank = 0;
  WorkerRunState state = WorkerRunState::kRunning;
  std::string live_file;  // DDP_LIVE_METRICS_FILE; "" for none
};

struct NodeView {
  int node_rank = 0;
  int round = 0;         // restarts so far
  bool started = false;  // false before the first workers start
  std::vector<WorkerView> workers;
};

// The exposition of one node: `live[i]` is workers[i]'s figures, when it has any. Pure.
std::string render_exposition(const NodeView& node,
                              const std::vector<std::optional<ddp::live::Snapshot>>& live);

// What the agent's thread tells the endpoint's; every method may be called from either.
class MetricsBoard {
 public:
  void workers_started(int node_rank, int round, std::vector<WorkerView> workers);
  void worker_exited(int local_rank, WorkerRunState state);
  // Reads the workers' live files and renders.
  std::string render() const;

 private:
  mutable std::mutex mutex_;
  NodeView node_;
};

// GET /metrics answers `render()`, on the server's thread, until destroyed.
class MetricsServer {
 public:
  // Throws ddp::ConfigError naming --metrics-port when it cannot listen on `port`.
  MetricsServer(int port, std::function<std::string()> render);
  int port() const { return server_.port(); }

 private:
  HttpServer server_;
};

}  // namespace ddprun
