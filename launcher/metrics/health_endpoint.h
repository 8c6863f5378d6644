#pragma once
// The agent's health endpoint (TORCHELASTIC_HEALTH_CHECK_PORT=N): GET /health (also / and
// /healthz) on every address, from before the rendezvous until ddprun exits, the exit barrier
// included. torchelastic reads the variable, but its open-source server starts nothing
// (health_check_server.py is a stub that Meta replaces internally), so the answer is ddprun's:
//   200 {"status":"healthy","phase":"rendezvous","seconds_since_progress":0.1}
//   503 {"status":"unhealthy",...} once the agent's own loop has not moved for the limit
//       (torchelastic's 60 s, or the store's read timeout plus 10 s when that is longer).
// Only the agent's own progress counts. A lost node, a failed worker or a diagnosed hang are the
// agent's to handle (a restart, a shrink, an exit naming the root cause): a liveness probe that
// restarted the pod for them would race that handling. What a probe can fix is an agent that
// stopped moving (a deadlock, a call that never returns).
#include <atomic>
#include <chrono>
#include <cstdint>

#include "metrics/http_endpoint.h"

namespace ddprun {

enum class AgentPhase { kStarting, kRendezvous, kRunning, kExitBarrier };
const char* to_string(AgentPhase phase);

class AgentHealth {
 public:
  using Clock = std::chrono::steady_clock;
  explicit AgentHealth(std::chrono::milliseconds limit, Clock::time_point now = Clock::now());

  // The agent's loop moved on (in `phase`). Any thread; lock-free.
  void progress(AgentPhase phase, Clock::time_point now = Clock::now());
  void progress(Clock::time_point now = Clock::now());
  // The endpoint's answer at `now`.
  HttpResponse answer(Clock::time_point now = Clock::now()) const;

 private:
  std::chrono::milliseconds limit_;
  std::atomic<std::int64_t> last_progress_ns_;
  std::atomic<AgentPhase> phase_{AgentPhase::kStarting};
};

// Serves `health` on `port` until destroyed; throws ddp::ConfigError naming the variable when it
// cannot listen there.
class HealthServer {
 public:
  HealthServer(int port, const AgentHealth& health);
  int port() const { return server_.port(); }

 private:
  HttpServer server_;
};

}  // namespace ddprun
