#include "comm/abort_notice.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iterator>
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

struct State {
  std::atomic<bool> raised{false};
  std::mutex mu;  // guards reason
  std::string reason;
  std::once_flag watcher_started;
  std::mutex saying;  // held while the last words are said, and while they are replaced
  std::function<void()> last_words;
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
  std::call_once(state().watcher_started, [file = *path, rank] {
    std::thread([file, rank] {
      std::string reason;
      while ((reason = read_reason(file)).empty()) std::this_thread::sleep_for(kFilePollInterval);
      raise(reason);
      // A wait that polls has given up by now and the worker is on its way out; one blocked
      // inside gloo has not: end the process with the error it would have raised.
      std::this_thread::sleep_for(kGrace);
      say_last_words();
      const CommError error("collective", rank, -1, message());
      log::error("{}", error.what());
      record_error(error);
      log::logger().flush();
      _exit(exit_code::kComm);
    }).detach();
  });
}

}  // namespace ddp::detail
