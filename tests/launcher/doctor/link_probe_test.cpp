#include "doctor/link_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace ddprun {
namespace {

using std::chrono::milliseconds;

TEST(LinkProbe, MeasuresLatencyAndBothDirectionsOnLoopback) {
  LinkProbeServer server("127.0.0.1", milliseconds(5000));
  LinkProbeOptions options;
  options.transfer = milliseconds(100);
  options.pings = 50;
  const LinkFigures f = measure_link("127.0.0.1", server.port(), options);
  EXPECT_GT(f.latency_us, 0);
  EXPECT_LT(f.latency_us, 100000);
  EXPECT_GT(f.out_gbps, 0.01);  // loopback streams gigabits; a broken timer would give 0 or inf
  EXPECT_GT(f.in_gbps, 0.01);
  EXPECT_LT(f.out_gbps, 10000);
  // The server serves one measure after the other.
  EXPECT_GT(measure_link("127.0.0.1", server.port(), options).in_gbps, 0.01);
}

// A port nothing listens on.
int closed_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(LinkProbe, NoListenerFailsNamingTheAddress) {
  try {
    measure_link("127.0.0.1", closed_port(), {});
    FAIL() << "no error";
  } catch (const LinkError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot connect to 127.0.0.1:"), std::string::npos)
        << e.what();
  }
}

// A peer that accepts connections (the kernel's backlog does) but never answers: the measure
// fails within its I/O timeout instead of hanging.
TEST(LinkProbe, ASilentPeerFailsWithinTheTimeout) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  LinkProbeOptions options;
  options.io_timeout = milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  try {
    measure_link("127.0.0.1", ntohs(addr.sin_port), options);
    FAIL() << "no error";
  } catch (const LinkError& e) {
    EXPECT_EQ(std::string(e.what()), "latency: receive failed (timed out)");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  close(fd);
}

}  // namespace
}  // namespace ddprun
