#include "forked_ranks.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <thread>

#include "ddp/store.h"

namespace ddp::detail::fabric::testing {
namespace {

constexpr auto kStoreTimeout = std::chrono::seconds(30);

bool read_port(int fd, int* port, std::chrono::milliseconds limit) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(limit.count())) != 1) return false;
  return ::read(fd, port, sizeof(*port)) == sizeof(*port);
}

[[noreturn]] void run_child(int rank, int port_in, int port_out,
                            const std::function<int(int, std::shared_ptr<Store>)>& body) {
  int code = 99;
  try {
    std::shared_ptr<Store> store;
    if (rank == 0) {
      store = Store::host(0, kStoreTimeout);
      const int port = store->port();
      if (::write(port_out, &port, sizeof(port)) != sizeof(port)) _exit(98);
    } else {
      int port = 0;
      if (!read_port(port_in, &port, std::chrono::milliseconds(30000))) _exit(97);
      store = Store::connect("127.0.0.1", port, kStoreTimeout);
    }
    code = body(rank, store);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: uncaught: %s\n", rank, e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

}  // namespace

std::vector<RankExit> run_forked_ranks(
    int ranks, std::chrono::milliseconds deadline,
    const std::function<int(int, std::shared_ptr<Store>)>& body) {
  int to_parent[2];
  if (::pipe(to_parent) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::array<int, 2>> to_child(ranks);
  for (auto& p : to_child) {
    if (::pipe(p.data()) != 0) throw std::runtime_error("pipe failed");
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) run_child(r, to_child[r][0], to_parent[1], body);
    pids.push_back(pid);
  }
  const auto start = std::chrono::steady_clock::now();
  int port = 0;
  if (read_port(to_parent[0], &port, deadline)) {
    for (int r = 1; r < ranks; ++r) {
      if (::write(to_child[r][1], &port, sizeof(port)) != sizeof(port)) break;
    }
  }
  std::vector<RankExit> exits(ranks);
  std::vector<bool> reaped(ranks, false);
  int remaining = ranks;
  while (remaining > 0) {
    for (int r = 0; r < ranks; ++r) {
      if (reaped[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        reaped[r] = true;
        --remaining;
        exits[r].exited = WIFEXITED(status);
        exits[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        exits[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() - start > deadline) {
      for (int r = 0; r < ranks; ++r) {
        if (reaped[r]) continue;
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
        exits[r].timed_out = true;
        reaped[r] = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::close(to_parent[0]);
  ::close(to_parent[1]);
  for (auto& p : to_child) {
    ::close(p[0]);
    ::close(p[1]);
  }
  return exits;
}

}  // namespace ddp::detail::fabric::testing
