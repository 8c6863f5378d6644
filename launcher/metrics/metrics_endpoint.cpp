#include "metrics/metrics_endpoint.h"

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
    : server_(
          port, "--metrics-port",
          {{"/metrics", [render = std::move(render)] {
              return HttpResponse{"200 OK", "text/plain; version=0.0.4; charset=utf-8", render()};
            }}}) {
  ddp::log::info("metrics: Prometheus endpoint on port {} (GET /metrics)", server_.port());
}

}  // namespace ddprun
