#include "diagnosis/hang_watch.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "ddp/error.h"
#include "ddp/flight_recorder.h"
#include "ddp/log.h"
#include "ddp/settings.h"
#include "ddp/store.h"

namespace ddprun {
namespace {

using std::chrono::milliseconds;

// Stacks taken per node and per hang: enough for the likely cause, bounded in time however many
// workers look idle.
constexpr int kStacksPerNode = 3;
constexpr std::size_t kStackLines = 60;
// Workers without a recorder are told apart by their stacks alone: up to this many per node,
// kParallelStacks at a time.
constexpr std::size_t kPythonStacksPerNode = 64;
constexpr std::size_t kParallelStacks = 8;

bool has_recorder_file(const WatchedWorker& w) {
  return !w.recorder_file.empty() && access(w.recorder_file.c_str(), F_OK) == 0;
}

// The main thread's CPU ticks plus its context switches: unchanged while it neither runs nor
// wakes up. -1 when the process is gone.
long long main_thread_activity(int pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid);
  std::ifstream stat(dir + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return -1;
  const auto paren = text.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(text.substr(paren + 2));
  std::string field;
  long long count = 0;
  for (int i = 3; fields >> field; ++i) {                        // field 3 is the state
    if (i == 14 || i == 15) count += std::atoll(field.c_str());  // utime, stime
    if (i == 15) break;
  }
  std::ifstream status(dir + "/status");
  while (std::getline(status, text)) {
    if (text.rfind("voluntary_ctxt_switches:", 0) == 0 ||
        text.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
      count += std::atoll(text.substr(text.find(':') + 1).c_str());
    }
  }
  return count;
}

// Whether `pid` has a handler for `signal` (SigCgt in /proc/PID/status).
bool catches(int pid, int signal) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
    return ((mask >> (signal - 1)) & 1ULL) != 0;
  }
  return false;
}

int signal_number(const std::string& name) {
  if (name == "SIGUSR1") return SIGUSR1;
  if (name == "SIGUSR2") return SIGUSR2;
  return 0;
}

double seconds_between(std::int64_t later_ns, std::int64_t earlier_ns) {
  return static_cast<double>(later_ns - earlier_ns) / 1e9;
}

std::string process_state(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return "exited";
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return "unknown";
  switch (stat[paren + 2]) {
    case 'R':
      return "running";
    case 'S':
      return "sleeping";
    case 'D':
      return "in uninterruptible sleep (I/O)";
    case 'T':
      return "stopped (SIGSTOP)";
    case 't':
      return "stopped by a tracer";
    case 'Z':
    case 'X':
      return "exited";
    default:
      return "unknown";
  }
}

HangOp op_of(const ddp::flight::OpRecord& r, double seconds) {
  HangOp op;
  op.seq = r.seq;
  op.kind = ddp::flight::to_string(r.kind);
  op.description = r.describe();
  op.seconds = seconds;
  op.waiting_on = r.waiting_on;
  return op;
}

// Runs argv with its output captured, killed at `timeout`. Returns the exit code (127: not
// found, -1: timed out or could not start).
int run_bounded(const std::vector<std::string>& argv, milliseconds timeout, std::string& output) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t child = fork();
  if (child < 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  if (child == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    const int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, STDIN_FILENO);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  char buffer[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int rc = poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    const ssize_t n = read(fds[0], buffer, sizeof(buffer));
    if (n > 0) {
      if (output.size() < (1U << 20)) output.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // end of output
  }
  close(fds[0]);
  if (timed_out) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The frames and thread headers of a stack tool's output, at most kStackLines.
std::string stack_lines(const std::string& output, bool gdb) {
  std::istringstream in(output);
  std::string line;
  std::string kept;
  std::size_t lines = 0;
  std::size_t dropped = 0;
  while (std::getline(in, line)) {
    if (gdb && !(line.rfind("#", 0) == 0 || line.rfind("Thread ", 0) == 0)) continue;
    if (line.empty()) continue;
    if (lines == kStackLines) {
      ++dropped;
      continue;
    }
    kept += line + "\n";
    ++lines;
  }
  if (dropped > 0) kept += "(" + std::to_string(dropped) + " more lines)\n";
  return kept;
}

}  // namespace

std::string take_stacks(int pid, milliseconds timeout, std::string& note) {
  const std::string p = std::to_string(pid);
  std::string output;
  int rc = run_bounded({"eu-stack", "-p", p}, timeout, output);
  if (rc == 0 && !output.empty()) return stack_lines(output, false);
  const std::string eu_stack = rc == 127 ? "eu-stack is not installed"
                               : rc < 0  ? "eu-stack took too long"
                                         : "eu-stack failed: " + stack_lines(output, false);
  output.clear();
  rc = run_bounded({"gdb", "-batch", "-nx", "-q", "-p", p, "-ex", "thread apply all bt"}, timeout,
                   output);
  const std::string stacks = stack_lines(output, true);
  if (rc == 0 && !stacks.empty()) return stacks;
  note = "no stack: " + eu_stack + "; " +
         (rc == 127 ? "gdb is not installed (Debian: elfutils or gdb)"
          : rc < 0  ? "gdb took too long"
                    : "gdb could not attach (ptrace not permitted?)");
  while (!note.empty() && (note.back() == '\n' || note.back() == ' ')) note.pop_back();
  return "";
}

WorkerHangState read_worker_state(const WatchedWorker& worker, milliseconds stack_timeout) {
  WorkerHangState s;
  s.rank = worker.rank;
  s.local_rank = worker.local_rank;
  s.pid = worker.pid;
  std::string error;
  const auto snapshot = ddp::flight::read_file(worker.recorder_file, &error);
  const std::int64_t now = ddp::flight::monotonic_ns();
  double threshold = 0;
  if (snapshot) {
    s.has_recorder = true;
    if (snapshot->pid > 0) s.pid = snapshot->pid;
    threshold = static_cast<double>(snapshot->warn_threshold().count()) / 1000.0;
    if (const auto* r = snapshot->running())
      s.running = op_of(*r, seconds_between(now, r->start_ns));
    if (const auto* f = snapshot->last_finished()) {
      s.last_finished = op_of(*f, seconds_between(now, f->end_ns));
    }
  } else {
    s.recorder_note = "no flight recorder (" + error +
                      "): a worker not built on ddp, or one with DDP_FLIGHT_RECORDER_ENTRIES=0";
  }
  s.process_state = process_state(s.pid);
  if (stack_timeout.count() > 0 && s.process_state != "exited" && locally_suspect(s, threshold)) {
    std::string note;
    s.stack = take_stacks(s.pid, stack_timeout, note);
    if (s.stack.empty()) s.recorder_note = note;
  }
  return s;
}

HangWatch::HangWatch(std::shared_ptr<ddp::Store> store, int node, int nodes, std::string host,
                     std::vector<WatchedWorker> workers, Options options)
    : store_(std::move(store)),
      node_(node),
      nodes_(nodes),
      host_(std::move(host)),
      workers_(std::move(workers)),
      options_(options),
      python_threshold_(
          std::chrono::seconds(ddp::settings::integer_or_default(ddp::settings::kHangWarnSec))),
      activity_(workers_.size()) {
  const auto signal = ddp::settings::spelling_or_default(ddp::settings::kPyStackSignal);
  if (signal != "off") python_stack_signal_ = signal;
}

HangWatch::~HangWatch() {
  // Bounded: each stack tool is killed at stack_timeout.
  if (probe_.valid()) probe_.wait();
  if (report_.valid()) report_.wait();
}

bool HangWatch::c10d_wait_confirmed(Clock::time_point now) {
  if (python_threshold_.count() == 0) return false;
  if (probe_.valid()) {
    if (probe_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    const auto [index, stack] = probe_.get();
    const std::string where = c10d_wait_of(stack, workers_[index].pid);
    if (where == "collective" || where == "store") return true;
  }
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    const auto& w = workers_[i];
    if (has_recorder_file(w)) continue;
    Activity& a = activity_[i];
    const long long count = main_thread_activity(w.pid);
    if (count < 0) continue;
    if (count != a.count) {
      a.count = count;
      if (now >= a.frozen_until) a.since = now;
      continue;
    }
    if (now - a.since < python_threshold_ || now - a.probed < python_threshold_) continue;
    a.probed = now;
    a.frozen_until = now + options_.stack_timeout + std::chrono::seconds(2);
    probe_ = std::async(std::launch::async, [i, pid = w.pid, timeout = options_.stack_timeout] {
      std::string note;
      return std::make_pair(i, take_stacks(pid, timeout, note));
    });
    return false;  // one stack at a time
  }
  return false;
}

void HangWatch::ask_python_stacks(const std::string& culprits) const {
  const int signal = signal_number(python_stack_signal_);
  if (signal == 0) return;
  std::set<int> named;
  std::istringstream in(culprits);
  for (std::string rank; std::getline(in, rank, ',');) named.insert(std::atoi(rank.c_str()));
  for (const auto& w : workers_) {
    if (named.count(w.rank) == 0 || has_recorder_file(w)) continue;
    if (!catches(w.pid, signal)) {
      ddp::log::warn(
          "rank {} (pid {}) does not catch {}: no Python stack (register faulthandler "
          "on it, launcher/README.md)",
          w.rank, w.pid, python_stack_signal_);
      continue;
    }
    ddp::log::info("sent {} to rank {} (pid {}) for its Python stack", python_stack_signal_, w.rank,
                   w.pid);
    kill(w.pid, signal);
  }
}

bool HangWatch::local_wait_exceeded() const {
  const std::int64_t now = ddp::flight::monotonic_ns();
  for (const auto& w : workers_) {
    const auto s = ddp::flight::read_file(w.recorder_file);
    if (!s) continue;
    const auto threshold = s->warn_threshold();
    const auto* r = s->running();
    if (r != nullptr && threshold.count() > 0 &&
        now - r->start_ns >= std::chrono::nanoseconds(threshold).count()) {
      return true;
    }
  }
  return false;
}

namespace {

// Takes the stacks of the recorder-less workers `unread` (at most kPythonStacksPerNode of them),
// kParallelStacks at a time.
void take_python_stacks(NodeHangReport& r, std::vector<std::size_t> unread, milliseconds timeout) {
  if (unread.size() > kPythonStacksPerNode) unread.resize(kPythonStacksPerNode);
  for (std::size_t b = 0; b < unread.size(); b += kParallelStacks) {
    std::vector<std::pair<std::size_t, std::future<std::string>>> batch;
    for (std::size_t k = b; k < unread.size() && k < b + kParallelStacks; ++k) {
      batch.emplace_back(unread[k],
                         std::async(std::launch::async, [pid = r.workers[unread[k]].pid, timeout] {
                           std::string note;
                           return take_stacks(pid, timeout, note);
                         }));
    }
    for (auto& [i, stack] : batch) r.workers[i].stack = stack.get();
  }
}

// This node's report: each worker's state, the stacks of the first kStacksPerNode, and where the
// recorder-less ones wait. `idle`: how long each worker's main thread has been inactive.
NodeHangReport node_report(const std::vector<WatchedWorker>& workers, int node,
                           const std::string& host, const std::vector<double>& idle,
                           milliseconds timeout) {
  NodeHangReport r;
  r.node = node;
  r.host = host;
  int stacks = 0;
  std::vector<std::size_t> unread;  // recorder-less workers still without a stack
  for (std::size_t i = 0; i < workers.size(); ++i) {
    r.workers.push_back(
        read_worker_state(workers[i], stacks < kStacksPerNode ? timeout : milliseconds(0)));
    auto& s = r.workers.back();
    if (!s.stack.empty()) ++stacks;
    if (s.has_recorder) continue;
    s.idle_seconds = idle[i];
    if (s.stack.empty() && s.process_state != "exited") unread.push_back(i);
  }
  take_python_stacks(r, std::move(unread), timeout);
  for (auto& s : r.workers) {
    if (!s.has_recorder && !s.stack.empty()) s.c10d_wait = c10d_wait_of(s.stack, s.pid);
  }
  return r;
}

}  // namespace

void HangWatch::tick(Clock::time_point now) {
  if (done_ || now < next_check_) return;
  next_check_ = now + options_.period;
  try {
    if (!raised_) {
      if (!raise_if_due(now)) return;
      start_report(now);
    }
    if (!published_ && !publish_report()) return;
    if (node_ == 0) return gather(now);
    follow_node_zero(now);
  } catch (const ddp::StoreError&) {
    done_ = true;
    throw;  // the store is gone: the supervisor's concern, at once
  } catch (const std::exception& e) {
    ddp::log::warn("hang diagnosis abandoned: {}", e.what());
    done_ = true;
  }
}

bool HangWatch::raise_if_due(Clock::time_point now) {
  if (local_wait_exceeded() || c10d_wait_confirmed(now)) {
    store_->compare_set("raised", "", std::to_string(node_));
    raised_ = true;
  } else if (store_->check({"raised"})) {
    raised_ = true;
  }
  return raised_;
}

void HangWatch::start_report(Clock::time_point now) {
  raised_at_ = now;
  std::vector<double> idle;
  for (const auto& a : activity_) {
    idle.push_back(a.count < 0 ? 0.0 : std::chrono::duration<double>(now - a.since).count());
  }
  report_ =
      std::async(std::launch::async, [workers = workers_, node = node_, host = host_,
                                      idle = std::move(idle), timeout = options_.stack_timeout] {
        return node_report(workers, node, host, idle, timeout);
      });
}

bool HangWatch::publish_report() {
  if (report_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
  store_->set("node/" + std::to_string(node_), report_.get().to_json());
  published_ = true;
  return true;
}

void HangWatch::follow_node_zero(Clock::time_point now) {
  if (store_->check({"diagnosis"})) {
    diagnosis_ = store_->get("diagnosis");
    if (store_->check({"culprits"})) ask_python_stacks(store_->get("culprits"));
    std::string headline = diagnosis_.substr(0, diagnosis_.find('\n'));
    if (headline.rfind("hang: ", 0) == 0) headline.erase(0, 6);
    ddp::log::error("hang (node 0's agent has the stacks): {}", headline);
    done_ = true;
  } else if (now > raised_at_ + 2 * options_.gather_timeout) {
    done_ = true;  // node 0 is gone or silent; its own failure handling reports that
  }
}

void HangWatch::gather(Clock::time_point now) {
  std::vector<std::string> keys;
  for (int n = 0; n < nodes_; ++n) keys.push_back("node/" + std::to_string(n));
  const bool all = store_->check(keys);
  if (!all && now < raised_at_ + options_.gather_timeout) return;
  std::vector<NodeHangReport> reports;
  for (const auto& key : keys) {
    if (all || store_->check({key})) reports.push_back(NodeHangReport::from_json(store_->get(key)));
  }
  done_ = true;
  const auto d = diagnose_hang(reports, nodes_, python_stack_signal_);
  if (!d) {
    ddp::log::info("hang warning withdrawn: no rank waits in a collective any more");
    return;
  }
  diagnosis_ = d->text;
  while (!diagnosis_.empty() && diagnosis_.back() == '\n') diagnosis_.pop_back();
  ddp::log::error("{}", diagnosis_);
  std::string culprits;
  for (int rank : d->culprits) culprits += (culprits.empty() ? "" : ",") + std::to_string(rank);
  store_->set("culprits", culprits);
  store_->set("diagnosis", diagnosis_);
  ask_python_stacks(culprits);
}

}  // namespace ddprun
