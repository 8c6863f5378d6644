// The agents' HTTP responder: routing by path, and what it answers outside its routes.
#include "metrics/http_endpoint.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "ddp/error.h"
#include "http_get.h"

namespace ddprun {
namespace {

HttpRoutes test_routes() {
  return {{"/a",
           [] {
             return HttpResponse{"200 OK", "text/plain", "a\n"};
           }},
          {"/broken", []() -> HttpResponse { throw std::runtime_error("renderer failed"); }}};
}

TEST(HttpServer, RoutesByPathIgnoringTheQuery) {
  HttpServer server(0, "--test-port", test_routes());
  EXPECT_EQ(server.route("GET /a HTTP/1.1").body, "a\n");
  EXPECT_EQ(server.route("GET /a?x=1 HTTP/1.1").body, "a\n");
  const HttpResponse missing = server.route("GET /b HTTP/1.1");
  EXPECT_EQ(missing.status, "404 Not Found");
  EXPECT_EQ(missing.body, "ddprun serves /a, /broken\n");
  EXPECT_EQ(server.route("PUT /a HTTP/1.1").status, "405 Method Not Allowed");
  const HttpResponse broken = server.route("GET /broken HTTP/1.0");
  EXPECT_EQ(broken.status, "500 Internal Server Error");
  EXPECT_EQ(broken.body, "renderer failed\n");
}

TEST(HttpServer, AnswersOverASocketWithTheRoutesStatusAndType) {
  HttpServer server(0, "--test-port", test_routes());
  const std::string ok = http_get(server.port(), "GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok,
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n"
            "Connection: close\r\n\r\na\n");
  EXPECT_EQ(http_get(server.port(), "GET /b HTTP/1.1\r\n\r\n").rfind("HTTP/1.0 404", 0), 0u);
}

TEST(HttpServer, ATakenPortIsAConfigErrorNamingWhatSetIt) {
  HttpServer first(0, "--test-port", test_routes());
  try {
    HttpServer second(first.port(), "SOME_PORT_VARIABLE", test_routes());
    FAIL() << "expected a ConfigError";
  } catch (const ddp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("SOME_PORT_VARIABLE " + std::to_string(first.port())),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddprun
