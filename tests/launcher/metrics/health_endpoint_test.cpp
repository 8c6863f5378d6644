// The agent's health answer (TORCHELASTIC_HEALTH_CHECK_PORT): healthy while its loop moves,
// unhealthy once it has stalled for the limit, served from the first moment.
#include "metrics/health_endpoint.h"

#include <gtest/gtest.h>

#include <string>

#include "http_get.h"

namespace ddprun {
namespace {

using namespace std::chrono_literals;

TEST(AgentHealth, HealthyWhileTheLoopMovesAndUnhealthyOnceItStalls) {
  const auto t0 = AgentHealth::Clock::now();
  AgentHealth health(60s, t0);
  HttpResponse r = health.answer(t0 + 1s);
  EXPECT_EQ(r.status, "200 OK");
  EXPECT_EQ(r.type, "application/json");
  EXPECT_EQ(r.body,
            "{\"status\":\"healthy\",\"phase\":\"starting\",\"seconds_since_progress\":1.0}\n");
  health.progress(AgentPhase::kRendezvous, t0 + 50s);
  EXPECT_EQ(health.answer(t0 + 110s).status, "200 OK");
  r = health.answer(t0 + 111s);
  EXPECT_EQ(r.status, "503 Service Unavailable");
  EXPECT_NE(r.body.find("\"status\":\"unhealthy\",\"phase\":\"rendezvous\""), std::string::npos)
      << r.body;
  // Progress in the same phase keeps the phase.
  health.progress(t0 + 112s);
  r = health.answer(t0 + 112s);
  EXPECT_EQ(r.status, "200 OK");
  EXPECT_NE(r.body.find("\"phase\":\"rendezvous\""), std::string::npos) << r.body;
  health.progress(AgentPhase::kExitBarrier, t0 + 113s);
  EXPECT_NE(health.answer(t0 + 113s).body.find("\"phase\":\"exit_barrier\""), std::string::npos);
}

TEST(HealthServer, AnswersOnEveryHealthPath) {
  AgentHealth health(60s);
  health.progress(AgentPhase::kRunning);
  HealthServer server(0, health);
  for (const char* path : {"/", "/health", "/healthz"}) {
    const std::string reply =
        http_get(server.port(), std::string("GET ") + path + " HTTP/1.1\r\n\r\n");
    EXPECT_EQ(reply.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << path << ": " << reply;
    EXPECT_NE(reply.find("\"phase\":\"running\""), std::string::npos) << reply;
  }
  EXPECT_EQ(http_get(server.port(), "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);
}

}  // namespace
}  // namespace ddprun
