#pragma once
// A real etcd (Debian's etcd-server) for tests: on free loopback ports with a data directory of
// its own, killed (by PID) and removed at the end; it dies with the test process however that
// ends (PR_SET_PDEATHSIG).
#include <gtest/gtest.h>
#include <sys/types.h>

#include <string>

namespace ddp::testing {

inline constexpr const char* kEtcd = "/usr/bin/etcd";

class EtcdServer {
 public:
  // Starts etcd and waits (at most 20 s) until it answers; on failure, error() says why.
  EtcdServer();
  ~EtcdServer();

  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  bool ready() const { return ready_; }
  const std::string& error() const { return error_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }

 private:
  void start();
  void stop();

  std::string dir_;
  pid_t pid_ = -1;
  int client_port_ = 0;
  bool ready_ = false;
  std::string error_;
};

// A test suite sharing one etcd among its cases (each uses keys of its own); a case skips, saying
// why, where etcd-server is not installed, and fails with etcd's own error if it did not start.
class EtcdSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;

  static EtcdServer* server_;
};

}  // namespace ddp::testing
