#include "metrics/health_endpoint.h"

#include <cstdio>

#include "ddp/log.h"

namespace ddprun {
namespace {

std::int64_t ns_of(AgentHealth::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

const char* to_string(AgentPhase phase) {
  switch (phase) {
    case AgentPhase::kStarting:
      return "starting";
    case AgentPhase::kRendezvous:
      return "rendezvous";
    case AgentPhase::kRunning:
      return "running";
    case AgentPhase::kExitBarrier:
      return "exit_barrier";
  }
  return "unknown";
}

AgentHealth::AgentHealth(std::chrono::milliseconds limit, Clock::time_point now)
    : limit_(limit), last_progress_ns_(ns_of(now)) {}

void AgentHealth::progress(AgentPhase phase, Clock::time_point now) {
  phase_.store(phase, std::memory_order_relaxed);
  progress(now);
}

void AgentHealth::progress(Clock::time_point now) {
  last_progress_ns_.store(ns_of(now), std::memory_order_relaxed);
}

HttpResponse AgentHealth::answer(Clock::time_point now) const {
  const double since =
      static_cast<double>(ns_of(now) - last_progress_ns_.load(std::memory_order_relaxed)) / 1e9;
  const bool healthy = since * 1000.0 <= static_cast<double>(limit_.count());
  char body[160];
  std::snprintf(body, sizeof body,
                "{\"status\":\"%s\",\"phase\":\"%s\",\"seconds_since_progress\":%.1f}\n",
                healthy ? "healthy" : "unhealthy",
                to_string(phase_.load(std::memory_order_relaxed)), since < 0 ? 0.0 : since);
  return {healthy ? "200 OK" : "503 Service Unavailable", "application/json", body};
}

HealthServer::HealthServer(int port, const AgentHealth& health)
    : server_(port, "TORCHELASTIC_HEALTH_CHECK_PORT",
              {{"/", [&health] { return health.answer(); }},
               {"/health", [&health] { return health.answer(); }},
               {"/healthz", [&health] { return health.answer(); }}}) {
  ddp::log::info("health: endpoint on port {} (GET /health)", server_.port());
}

}  // namespace ddprun
