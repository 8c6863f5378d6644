#include "supervision/file_timer.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "config/launch_config.h"
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddprun {
namespace {

// torchelastic's server reads for this long between checks (the agent's max_interval).
constexpr int kCheckEveryMs = 100;

double epoch_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::optional<TimerRequest> parse_timer_request(const std::string& line) {
  const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) return std::nullopt;
  // Every field checked for its type: a line from any process must not throw here.
  const auto field = [&json](const char* name) {
    const auto it = json.find(name);
    return it == json.end() ? nullptr : &*it;
  };
  const auto* version = field("version");
  const auto* pid = field("pid");
  const auto* expiration = field("expiration_time");
  const auto* scope = field("scope_id");
  const auto* signal = field("signal");
  if (!version || !version->is_number_integer() || version->get<long long>() != 1) {
    return std::nullopt;
  }
  if (!pid || !pid->is_number_integer() || !expiration || !expiration->is_number()) {
    return std::nullopt;
  }
  const long long pid_value = pid->get<long long>();
  if (pid_value <= 0 || pid_value > std::numeric_limits<pid_t>::max()) return std::nullopt;
  if ((scope && !scope->is_string()) || (signal && !signal->is_number_integer())) {
    return std::nullopt;
  }
  TimerRequest request;
  request.pid = static_cast<pid_t>(pid_value);
  request.scope_id = scope ? scope->get<std::string>() : std::string();
  request.expiration_time = expiration->get<double>();
  const long long signal_value = signal ? signal->get<long long>() : 0;
  request.signal = signal_value > 0 && signal_value < 65 ? static_cast<int>(signal_value) : 0;
  return request;
}

void TimerBook::apply(const TimerRequest& request) {
  const auto key = std::make_pair(request.pid, request.scope_id);
  if (request.expiration_time < 0) {
    timers_.erase(key);
  } else {
    timers_[key] = {request.expiration_time, request.signal};
  }
}

std::vector<TimerBook::Expiry> TimerBook::take_expired(double now) {
  std::map<pid_t, std::vector<std::pair<double, Expiry>>> expired;
  for (const auto& [key, timer] : timers_) {
    if (timer.first <= now)
      expired[key.first].push_back({timer.first, {key.first, key.second, timer.second}});
  }
  std::vector<Expiry> result;
  for (auto& [pid, timers] : expired) {
    std::sort(timers.begin(), timers.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [at, expiry] : timers) {
      if (expiry.signal <= 0) continue;
      result.push_back(expiry);
      break;
    }
    for (auto it = timers_.begin(); it != timers_.end();) {
      it = it->first.first == pid ? timers_.erase(it) : std::next(it);
    }
  }
  return result;
}

FileTimerServer::FileTimerServer(std::string path, std::function<bool(pid_t)> ours)
    : path_(std::move(path)), ours_(std::move(ours)) {
  bool made = false;
  const auto fail = [&](const std::string& what) {
    const std::string reason = errno != 0 ? std::string(" (") + std::strerror(errno) + ")" : "";
    for (int fd : {read_fd_, keep_open_fd_, stop_fds_[0], stop_fds_[1]}) {
      if (fd >= 0) ::close(fd);
    }
    if (made) ::unlink(path_.c_str());
    throw ddp::ConfigError("TORCHELASTIC_TIMER_FILE " + path_ + ": " + what + reason +
                           "; point it at a new path in a writable directory");
  };
  struct stat existing {};
  if (::lstat(path_.c_str(), &existing) == 0) {
    // Only an old pipe is replaced: a mistyped path must not cost a file.
    if (!S_ISFIFO(existing.st_mode)) {
      errno = 0;
      fail("exists and is not a named pipe");
    }
    ::unlink(path_.c_str());
  }
  if (::mkfifo(path_.c_str(), 0600) != 0) fail("cannot make the named pipe");
  made = true;
  read_fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (read_fd_ < 0) fail("cannot open the named pipe");
  keep_open_fd_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (keep_open_fd_ < 0) fail("cannot open the named pipe");
  if (::pipe2(stop_fds_, O_CLOEXEC) != 0) fail("cannot make the watchdog's stop pipe");
  thread_ = std::thread([this] { serve(); });
}

FileTimerServer::~FileTimerServer() {
  if (stop_fds_[1] >= 0) {
    const char byte = 0;
    [[maybe_unused]] const ssize_t n = ::write(stop_fds_[1], &byte, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {read_fd_, keep_open_fd_, stop_fds_[0], stop_fds_[1]}) {
    if (fd >= 0) ::close(fd);
  }
  ::unlink(path_.c_str());
}

std::optional<std::string> FileTimerServer::reason_for(pid_t pid) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = reasons_.find(pid);
  if (it == reasons_.end()) return std::nullopt;
  return it->second;
}

void FileTimerServer::serve() {
  std::string pending;
  for (;;) {
    pollfd fds[2] = {{read_fd_, POLLIN, 0}, {stop_fds_[0], POLLIN, 0}};
    const int ready = ::poll(fds, 2, kCheckEveryMs);
    if (ready < 0 && errno != EINTR) {
      ddp::log::warn("file timer: poll failed ({}); the watchdog stops", std::strerror(errno));
      return;
    }
    if (ready > 0 && fds[1].revents != 0) return;
    char buffer[4096];
    for (ssize_t n; (n = ::read(read_fd_, buffer, sizeof buffer)) > 0;) {
      pending.append(buffer, static_cast<std::size_t>(n));
    }
    for (std::size_t end; (end = pending.find('\n')) != std::string::npos;) {
      const std::string line = pending.substr(0, end);
      pending.erase(0, end + 1);
      if (auto request = parse_timer_request(line)) {
        book_.apply(*request);
      } else {
        ddp::log::warn("file timer: ignoring a line that is not a timer request: {}", line);
      }
    }
    reap(epoch_seconds());
  }
}

void FileTimerServer::reap(double now) {
  for (const auto& expiry : book_.take_expired(now)) {
    if (!ours_(expiry.pid)) {
      ddp::log::warn(
          "file timer: the timer '{}' of pid {} expired, but that process is no worker "
          "of this round; not signalling it",
          expiry.scope_id, expiry.pid);
      continue;
    }
    const std::string reason = "its timer '" + expiry.scope_id +
                               "' expired: the file-timer watchdog sent " +
                               signal_name(expiry.signal);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reasons_[expiry.pid] = reason;
    }
    ddp::log::error("file timer: worker pid {}: {}", expiry.pid, reason);
    if (::kill(expiry.pid, expiry.signal) != 0 && errno != ESRCH) {
      ddp::log::warn("file timer: signalling pid {} failed: {}", expiry.pid, std::strerror(errno));
    }
  }
}

}  // namespace ddprun
