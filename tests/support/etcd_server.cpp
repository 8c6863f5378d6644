#include "etcd_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "ddp/error.h"
#include "ddp/store.h"
#include "multiprocess.h"

namespace ddp::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

EtcdServer::EtcdServer() {
  char dir[] = "/tmp/ddp-etcd-test-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    error_ = "mkdtemp failed";
    return;
  }
  dir_ = dir;
  // A port taken between its choice and etcd's bind makes etcd exit: try again on others.
  for (int attempt = 0; attempt < 3 && !ready_; ++attempt) start();
}

EtcdServer::~EtcdServer() {
  stop();
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

void EtcdServer::start() {
  client_port_ = free_tcp_port();
  const int peer_port = free_tcp_port();
  const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
  const std::string data = dir_ + "/data";
  const std::string log = dir_ + "/etcd.log";
  std::error_code ignored;
  std::filesystem::remove_all(data, ignored);
  std::vector<std::string> args = {kEtcd,
                                   "--name=ddp-test",
                                   "--data-dir=" + data,
                                   "--listen-client-urls=" + client,
                                   "--advertise-client-urls=" + client,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=ddp-test=" + peer};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    // etcd dies with the test, however the test ends.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, STDIN_FILENO);
    dup2(out, STDOUT_FILENO);
    dup2(out, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (out >= 0) close(out);
  if (pid_ < 0) {
    error_ = "fork failed";
    return;
  }
  const auto deadline = Clock::now() + 20s;
  std::string last;
  while (Clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      error_ = "etcd exited at start: " + contents(log);
      return;
    }
    try {
      EtcdOptions options;
      options.endpoint = endpoint();
      Store::etcd(options, 500ms);
      ready_ = true;
      return;
    } catch (const StoreError& e) {
      last = e.what();
    }
    std::this_thread::sleep_for(50ms);
  }
  error_ = "etcd did not answer within 20 s (" + last + "); its log: " + contents(log);
  stop();
}

void EtcdServer::stop() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
}

EtcdServer* EtcdSuite::server_ = nullptr;

void EtcdSuite::SetUpTestSuite() {
  if (access(kEtcd, X_OK) == 0) server_ = new EtcdServer();
}

void EtcdSuite::TearDownTestSuite() {
  delete server_;
  server_ = nullptr;
}

void EtcdSuite::SetUp() {
  if (server_ == nullptr) {
    GTEST_SKIP() << "etcd-server is not installed (scripts/install-deps installs it)";
  }
  ASSERT_TRUE(server_->ready()) << server_->error();
}

}  // namespace ddp::testing
