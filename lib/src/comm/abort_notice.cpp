#include "comm/abort_notice.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>

#include "ddp/error.h"
#include "ddp/error_file.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "ddp/settings.h"

namespace ddp::detail {
namespace {

constexpr auto kFilePollInterval = std::chrono::milliseconds(100);
constexpr auto kRegroupPollInterval = std::chrono::milliseconds(20);
using Regroup = AbortNotice::Regroup;

struct State {
  std::atomic<bool> raised{false};
  std::mutex mu;  // guards reason
  std::string reason;
  std::once_flag watcher_started;
  std::mutex saying;  // held while the last words are said, and while they are replaced
  std::function<void()> last_words;
  std::atomic<bool> regroup_armed{false};
  std::atomic<Regroup> regroup{Regroup::kNone};
  // Counts clear(): a notice read before the process regrouped is not raised after it.
  std::atomic<unsigned> cleared{0};
  std::mutex wakers_mu;  // guards wakers, and is held while they run
  std::map<const void*, std::function<void()>> wakers;
};

State& state() {
  static State* s = new State();  // never destroyed: the watcher thread may outlive statics
  return *s;
}

// The file's text less trailing whitespace; "" while it is missing or empty.
std::string read_reason(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || st.st_size == 0) return "";
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// The kind of regroup notice `text` is, and its reason in `reason`; kNone for a plain reason.
Regroup regroup_kind(const std::string& text, std::string& reason) {
  static const std::pair<const char*, Regroup> kPrefixes[] = {
      {"regroup after step:", Regroup::kAfterStep},
      {"regroup when stopped:", Regroup::kWhenStopped},
      {"regroup:", Regroup::kNow}};
  for (const auto& [prefix, kind] : kPrefixes) {
    const std::string p = prefix;
    if (text.compare(0, p.size(), p) != 0) continue;
    reason = text.substr(p.size());
    while (!reason.empty() && reason.front() == ' ') reason.erase(0, 1);
    return kind;
  }
  return Regroup::kNone;
}

void run_wakers() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.wakers_mu);
  for (auto& [key, wake] : s.wakers) wake();
}

// Raises a regroup notice and holds it while it lasts: until the process has regrouped (clear();
// returns ""), or until ddprun writes a plain reason over it (returned: an abort after all).
std::string hold_regroup(const std::string& file, Regroup kind, const std::string& reason,
                         unsigned read_at) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.cleared.load() != read_at) return "";  // the process regrouped since: a stale read
    s.reason = reason;
    s.regroup.store(kind, std::memory_order_release);
    s.raised.store(true, std::memory_order_release);
  }
  if (kind == Regroup::kNow) run_wakers();
  for (;;) {
    if (!s.raised.load(std::memory_order_acquire)) return "";
    const std::string text = read_reason(file);
    std::string ignored;
    if (!text.empty() && regroup_kind(text, ignored) == Regroup::kNone) return text;
    std::this_thread::sleep_for(kRegroupPollInterval);
  }
}

// The abort: the notice raised with `reason` (replacing a regroup's), and, after the grace, the
// end of a process still blocked inside gloo.
[[noreturn]] void abort_process(const std::string& reason, int rank) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.reason = reason;
    s.regroup.store(Regroup::kNone, std::memory_order_release);
    s.raised.store(true, std::memory_order_release);
  }
  // A wait that polls has given up by now and the worker is on its way out; one blocked inside
  // gloo has not: end the process with the error it would have raised.
  std::this_thread::sleep_for(AbortNotice::kGrace);
  AbortNotice::say_last_words();
  const CommError error("collective", rank, -1, AbortNotice::message());
  log::error("{}", error.what());
  record_error(error);
  log::logger().flush();
  _exit(exit_code::kComm);
}

void watch_file(const std::string& file, int rank) {
  for (;;) {
    std::string text;
    unsigned read_at = 0;
    for (;;) {
      read_at = state().cleared.load();
      if (!(text = read_reason(file)).empty()) break;
      std::this_thread::sleep_for(kFilePollInterval);
    }
    std::string reason;
    const Regroup kind = regroup_kind(text, reason);
    if (kind != Regroup::kNone && state().regroup_armed.load()) {
      text = hold_regroup(file, kind, reason, read_at);
      if (text.empty()) continue;  // regrouped: the next notice is another one
    } else if (kind != Regroup::kNone) {
      text = reason;
    }
    abort_process(text, rank);
  }
}

}  // namespace

bool AbortNotice::raised() noexcept { return state().raised.load(std::memory_order_acquire); }

std::string AbortNotice::reason() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.reason;
}

std::string AbortNotice::message() { return "aborted by ddprun: " + reason(); }

void AbortNotice::raise(const std::string& reason) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.raised.load(std::memory_order_relaxed)) return;
  s.reason = reason;
  s.raised.store(true, std::memory_order_release);
}

void AbortNotice::set_last_words(std::function<void()> words) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.saying);
  s.last_words = std::move(words);
}

void AbortNotice::say_last_words() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.saying);
  std::function<void()> words = std::move(s.last_words);
  s.last_words = nullptr;
  if (!words) return;
  try {
    words();
  } catch (const std::exception& e) {
    log::error("could not save the state before ending: {}", e.what());
  }
}

void AbortNotice::watch_file_from_environment(int rank) {
  const auto path = settings::text(settings::kAbortFile);
  if (!path || path->empty()) return;
  std::call_once(state().watcher_started,
                 [file = *path, rank] { std::thread(watch_file, file, rank).detach(); });
}

void AbortNotice::arm_regroup(bool armed) { state().regroup_armed.store(armed); }

bool AbortNotice::regroup_armed() noexcept { return state().regroup_armed.load(); }

AbortNotice::Regroup AbortNotice::regroup() noexcept {
  return state().regroup.load(std::memory_order_acquire);
}

bool AbortNotice::wait_for_regroup(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (regroup() != Regroup::kNone) return true;
    if (raised()) return regroup() != Regroup::kNone;  // (raised just after the first look)
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kRegroupPollInterval);
  }
}

void AbortNotice::clear() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.cleared.fetch_add(1);
  s.reason.clear();
  s.regroup.store(Regroup::kNone, std::memory_order_release);
  s.raised.store(false, std::memory_order_release);
}

void AbortNotice::add_waker(const void* key, std::function<void()> wake) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.wakers_mu);
  s.wakers[key] = std::move(wake);
}

void AbortNotice::remove_waker(const void* key) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.wakers_mu);
  s.wakers.erase(key);
}

}  // namespace ddp::detail
