// The Prometheus endpoint: the exposition's text, and the server over a real socket.
#include "metrics/metrics_endpoint.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "ddp/error.h"
#include "http_get.h"

namespace ddprun {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(MetricsExposition, NamesEachWorkerAndItsFigures) {
  NodeView node;
  node.node_rank = 1;
  node.round = 2;
  node.started = true;
  node.workers = {{4, 0, WorkerRunState::kRunning, "a"}, {5, 1, WorkerRunState::kFailed, "b"}};
  ddp::live::Snapshot s;
  s.steps = 10;
  s.images = 640;
  s.step_seconds_total = 1.5;
  s.allreduce_wait_seconds_total = 0.25;
  s.allreduce_bytes_total = 4.8e7;
  s.step = 10;
  s.epoch = 0;
  s.loss = 0.6931471805599453;
  s.learning_rate = 0.05;
  s.images_per_second = 426.5;
  s.step_seconds = 0.15;
  const std::string text = render_exposition(node, {s, std::nullopt});

  EXPECT_TRUE(has_line(text, "ddprun_restarts_total{node=\"1\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "# TYPE ddprun_restarts_total counter")) << text;
  EXPECT_TRUE(has_line(
      text, "ddprun_worker_state{node=\"1\",rank=\"4\",local_rank=\"0\",state=\"running\"} 1"));
  EXPECT_TRUE(has_line(
      text, "ddprun_worker_state{node=\"1\",rank=\"5\",local_rank=\"1\",state=\"failed\"} 1"));
  EXPECT_TRUE(has_line(
      text, "ddprun_worker_state{node=\"1\",rank=\"5\",local_rank=\"1\",state=\"running\"} 0"));
  const std::string w4 = "{node=\"1\",rank=\"4\",local_rank=\"0\"} ";
  EXPECT_TRUE(has_line(text, "ddp_steps_total" + w4 + "10")) << text;
  EXPECT_TRUE(has_line(text, "ddp_images_total" + w4 + "640"));
  EXPECT_TRUE(has_line(text, "ddp_allreduce_bytes_total" + w4 + "48000000"));
  EXPECT_TRUE(has_line(text, "ddp_allreduce_wait_seconds_total" + w4 + "0.25"));
  // Numbers round-trip: what Prometheus stores equals what the trainer wrote.
  EXPECT_TRUE(has_line(text, "ddp_loss" + w4 + "0.69314718055994529")) << text;
  EXPECT_TRUE(has_line(text, "ddp_images_per_second" + w4 + "426.5"));
  EXPECT_TRUE(has_line(text, "# TYPE ddp_loss gauge"));
  // No straggler window yet, and the worker without figures has no series.
  EXPECT_EQ(text.find("ddp_straggler_ratio"), std::string::npos);
  EXPECT_EQ(text.find("rank=\"5\",local_rank=\"1\"} "), std::string::npos) << text;
}

TEST(MetricsExposition, GaugesWaitForTheFirstProgressRecord) {
  NodeView node;
  node.workers = {{0, 0, WorkerRunState::kRunning, "a"}};
  ddp::live::Snapshot s;
  s.steps = 3;  // steps ran, no progress record yet (step == -1)
  const std::string text = render_exposition(node, {s});
  EXPECT_NE(text.find("ddp_steps_total{"), std::string::npos);
  EXPECT_EQ(text.find("ddp_loss"), std::string::npos) << text;
  EXPECT_EQ(text.find("ddp_step{"), std::string::npos) << text;
}

TEST(MetricsServer, AnswersMetricsAndRefusesTheRest) {
  int renders = 0;
  MetricsServer server(0, [&renders] {
    ++renders;
    return std::string("ddprun_restarts_total{node=\"0\"} 0\n");
  });
  ASSERT_GT(server.port(), 0);
  const std::string ok = http_get(server.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << ok;
  EXPECT_NE(ok.find("\r\n\r\nddprun_restarts_total{node=\"0\"} 0\n"), std::string::npos) << ok;
  EXPECT_EQ(http_get(server.port(), "GET /other HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);
  EXPECT_EQ(http_get(server.port(), "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 405", 0), 0u);
  // A client that connects and says nothing holds the server for its timeout, not forever.
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(silent, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(http_get(server.port(), "GET /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 200", 0), 0u);
  ::close(silent);
  EXPECT_EQ(renders, 2);
}

TEST(MetricsServer, ATakenPortIsAConfigErrorNamingIt) {
  MetricsServer first(0, [] { return std::string(); });
  try {
    MetricsServer second(first.port(), [] { return std::string(); });
    FAIL() << "expected a ConfigError";
  } catch (const ddp::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--metrics-port " + std::to_string(first.port())), std::string::npos)
        << what;
    EXPECT_NE(what.find("in use"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ddprun
