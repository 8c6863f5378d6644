#include "multiprocess.h"

#include <arpa/inet.h>
#include <execinfo.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "ddp/comm/factory.h"
#include "ddp/log.h"

namespace ddp::testing {
namespace {

// A rank that crashes prints where, before dying of the same signal: the test's failure message
// then says more than "died from signal 11".
void print_backtrace_and_die(int signal) {
  void* frames[64];
  const int count = backtrace(frames, 64);
  char header[] = "rank crashed with signal 00; backtrace:\n";
  header[25] = static_cast<char>('0' + signal / 10 % 10);  // no snprintf in a signal handler
  header[26] = static_cast<char>('0' + signal % 10);
  (void)!write(STDERR_FILENO, header, sizeof(header) - 1);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  std::signal(signal, SIG_DFL);
  raise(signal);
}

void report_crashes() {
  void* warm_up[1];
  backtrace(warm_up, 1);  // loads libgcc now, not inside the handler
  // On a stack of its own, so that a stack overflow is reported too.
  static std::vector<char> alternate(1 << 16);
  stack_t stack{};
  stack.ss_sp = alternate.data();
  stack.ss_size = alternate.size();
  sigaltstack(&stack, nullptr);
  for (int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) {
    struct sigaction action {};
    action.sa_handler = print_backtrace_and_die;
    action.sa_flags = SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(signal, &action, nullptr);
  }
}

}  // namespace

using Clock = std::chrono::steady_clock;

// What taking the stacks of hung ranks may add to a test, all ranks together: gdb reads the
// symbols of every library a rank maps (libtorch among them) before it prints.
constexpr auto kStacksBudget = std::chrono::seconds(40);

std::string stacks_of(pid_t pid, std::chrono::milliseconds limit) {
  int out[2];
  if (pipe(out) != 0) return "no stacks: pipe failed";
  const std::string target = std::to_string(pid);
  const pid_t gdb = fork();
  if (gdb < 0) {
    close(out[0]);
    close(out[1]);
    return "no stacks: fork failed";
  }
  if (gdb == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    close(out[0]);
    close(out[1]);
    // Ascending: the main thread first, so that a log cut short still shows where it waits.
    execlp("gdb", "gdb", "-batch", "-nx", "-q", "-p", target.c_str(), "-ex",
           "thread apply all -ascending bt", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string text;
  const auto give_up = Clock::now() + limit;
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd readable{out[0], POLLIN, 0};
    if (poll(&readable, 1, static_cast<int>(left)) <= 0) continue;
    char chunk[4096];
    const ssize_t got = read(out[0], chunk, sizeof(chunk));
    if (got <= 0) break;
    text.append(chunk, static_cast<std::size_t>(got));
  }
  close(out[0]);
  if (timed_out) kill(gdb, SIGKILL);
  int status = 0;
  waitpid(gdb, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return "no stacks: gdb is not installed (scripts/install-deps installs it)";
  }
  // Keep the stacks; drop gdb's chatter about libraries and symbols.
  std::istringstream lines(text);
  std::string line;
  std::string stacks;
  while (std::getline(lines, line)) {
    if (line.rfind("Thread ", 0) == 0 || line.rfind("#", 0) == 0) stacks += line + "\n";
  }
  if (stacks.empty()) {
    return timed_out ? "no stacks: gdb took longer than " + std::to_string(limit.count()) + " ms"
                     : "no stacks: gdb could not attach: " + text.substr(0, text.find('\n'));
  }
  return stacks;
}

std::vector<RankOutcome> run_ranks(int world_size, std::chrono::milliseconds deadline,
                                   const std::function<void(int rank)>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  const auto start = Clock::now();
  std::vector<RankOutcome> outcomes(world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      // Lets the parent's gdb (not an ancestor) attach under Yama's ptrace_scope 1.
      prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
      if (getppid() != parent) _exit(98);  // the parent is already gone
      report_crashes();
      int code = 0;
      try {
        body(rank);
      } catch (const std::exception& e) {
        std::cerr << "[rank " << rank << "] FAILED: " << e.what() << std::endl;
        code = 1;
      } catch (...) {
        std::cerr << "[rank " << rank << "] FAILED: unknown exception" << std::endl;
        code = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      // _exit: the child must not run the parent's atexit handlers or static destructors.
      _exit(code);
    }
    outcomes[rank].rank = rank;
    outcomes[rank].pid = pid;
  }
  int running = world_size;
  while (running > 0) {
    for (auto& o : outcomes) {
      if (o.pid == 0) continue;
      int status = 0;
      const pid_t done = waitpid(o.pid, &status, WNOHANG);
      if (done != o.pid) continue;
      o.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
      o.pid = -o.pid;  // reaped; keep the value for messages
      --running;
    }
    if (running == 0) break;
    if (Clock::now() - start > deadline) {
      const auto stacks_until = Clock::now() + kStacksBudget;
      for (auto& o : outcomes) {
        if (o.pid <= 0) continue;
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(stacks_until - Clock::now());
        o.stacks_at_deadline = left.count() > 0
                                   ? stacks_of(o.pid, left)
                                   : "no stacks: the time for them went to the ranks above";
        kill(o.pid, SIGKILL);
        waitpid(o.pid, nullptr, 0);
        o.killed_at_deadline = true;
        o.signal = SIGKILL;
        o.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
        o.pid = -o.pid;
        --running;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (auto& o : outcomes) o.pid = -o.pid;
  return outcomes;
}

std::string describe(const RankOutcome& o) {
  std::string text = "rank " + std::to_string(o.rank) + " (pid " + std::to_string(o.pid) + ")";
  if (o.killed_at_deadline) {
    return text + " still running at the deadline and was killed; its stacks then:\n" +
           o.stacks_at_deadline;
  }
  if (o.signal != 0) return text + " died from signal " + std::to_string(o.signal);
  return text + " exited with " + std::to_string(o.exit_code) + " after " +
         std::to_string(o.elapsed.count()) + " ms";
}

::testing::AssertionResult all_ranks_succeeded(const std::vector<RankOutcome>& outcomes) {
  std::string failures;
  for (const auto& o : outcomes) {
    if (o.exit_code != 0 || o.signal != 0 || o.killed_at_deadline) {
      failures += "\n  " + describe(o);
    }
  }
  if (failures.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "ranks failed (their stderr is above):" << failures;
}

::testing::AssertionResult only_victim_was_killed(const std::vector<RankOutcome>& outcomes,
                                                  int victim) {
  std::string failures;
  for (const auto& o : outcomes) {
    const bool as_expected =
        o.rank == victim ? o.signal == SIGKILL : o.exit_code == 0 && !o.killed_at_deadline;
    if (!as_expected) failures += "\n  " + describe(o);
  }
  if (failures.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "expected only rank " << victim << " to die of SIGKILL (stderr is above):" << failures;
}

TestStoreServer::TestStoreServer() {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  server_pid_ = fork();
  if (server_pid_ < 0) throw std::runtime_error("fork failed");
  if (server_pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(fds[0]);
    auto server = Store::host(0, std::chrono::seconds(30));
    const int port = server->port();
    if (write(fds[1], &port, sizeof(port)) != sizeof(port)) _exit(1);
    close(fds[1]);
    while (true) pause();  // serve until killed
  }
  close(fds[1]);
  const ssize_t got = read(fds[0], &port_, sizeof(port_));
  close(fds[0]);
  if (got != sizeof(port_)) {
    kill(server_pid_, SIGKILL);
    waitpid(server_pid_, nullptr, 0);
    throw std::runtime_error("the test store server did not start");
  }
}

TestStoreServer::~TestStoreServer() {
  kill(server_pid_, SIGKILL);
  waitpid(server_pid_, nullptr, 0);
}

std::string TestStoreServer::next_group_prefix() { return "group" + std::to_string(groups_++); }

std::shared_ptr<Store> TestStoreServer::connect_client(const std::string& prefix) const {
  return Store::connect("127.0.0.1", port_, std::chrono::seconds(30))->with_prefix(prefix);
}

std::vector<RankOutcome> run_with_communicators(
    TestStoreServer& server, const std::string& backend, int world_size, const CommOptions& options,
    std::chrono::milliseconds deadline, const std::function<void(Communicator& comm)>& body,
    const std::function<void(int rank)>& before_connect) {
  const std::string prefix = server.next_group_prefix();
  return run_ranks(world_size, deadline, [&](int rank) {
    if (before_connect) before_connect(rank);
    log::set_rank(rank);
    auto store = server.connect_client(prefix);
    auto comm = create_communicator(backend, store, rank, world_size, options);
    body(*comm);
  });
}

namespace {

// Whether a loopback TCP socket can be bound to `port` now (0: any); returns the port bound.
int bind_loopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (fd >= 0) close(fd);
  return ok ? ntohs(addr.sin_port) : -1;
}

}  // namespace

int free_tcp_port() {
  // Below the kernel's ephemeral range, which bind(0) and every outgoing connection draw from
  // (Open MPI's own listeners too): a port from there could be taken again between this choice
  // and the test's bind. Above 15000, and clear of torchrun's defaults (29400, 29500).
  int ephemeral_low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &ephemeral_low) != 1) ephemeral_low = 32768;
    std::fclose(f);
  }
  const int high = std::min(ephemeral_low, 29000);
  if (high - 15000 >= 1000) {
    std::mt19937 pick(std::random_device{}());
    std::uniform_int_distribution<int> port(15000, high - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      const int p = port(pick);
      if (bind_loopback(p) == p) return p;
    }
  }
  const int any = bind_loopback(0);
  if (any < 0) throw std::runtime_error("could not find a free loopback port");
  return any;
}

void require(bool condition, const std::string& message) {
  if (!condition) throw std::runtime_error(message);
}

SharedMemory::SharedMemory(std::size_t bytes) : bytes_(bytes) {
  data_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (data_ == MAP_FAILED) throw std::runtime_error("mmap of shared test memory failed");
}

SharedMemory::~SharedMemory() { munmap(data_, bytes_); }

}  // namespace ddp::testing
