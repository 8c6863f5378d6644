#include "supervision/worker_output.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <map>

#include "ddp/error.h"

namespace ddprun {
namespace {

// Long lines without a newline (progress bars) are cut so memory stays bounded.
constexpr std::size_t kMaxLine = 64 * 1024;

bool identifier_start(char c) { return c == '_' || std::isalpha(static_cast<unsigned char>(c)); }
bool identifier_char(char c) {
  return identifier_start(c) || std::isdigit(static_cast<unsigned char>(c));
}

}  // namespace

std::string worker_line_prefix(const std::optional<std::string>& line_template,
                               const std::string& role, int rank, int local_rank) {
  if (!line_template) return "[rank" + std::to_string(rank) + "]:";
  const std::map<std::string, std::string> values = {{"role_name", role},
                                                     {"rank", std::to_string(rank)},
                                                     {"local_rank", std::to_string(local_rank)}};
  const std::string& t = *line_template;
  std::string out;
  std::size_t i = 0;
  while (i < t.size()) {
    if (t[i] != '$' || i + 1 == t.size()) {
      out += t[i++];
      continue;
    }
    if (t[i + 1] == '$') {  // "$$"
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = t[i + 1] == '{';
    const std::size_t start = i + (braced ? 2 : 1);
    std::size_t end = start;
    if (end < t.size() && identifier_start(t[end])) {
      while (end < t.size() && identifier_char(t[end])) ++end;
    }
    const bool closed = !braced || (end < t.size() && t[end] == '}');
    const auto value =
        end > start && closed ? values.find(t.substr(start, end - start)) : values.end();
    if (value == values.end()) {  // safe_substitute: an unknown or malformed one stays as written
      out += '$';
      ++i;
      continue;
    }
    out += value->second;
    i = end + (braced ? 1 : 0);
  }
  return out;
}

void write_fully(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

FilteredCopy::FilteredCopy(const std::string& path, std::vector<std::string> filters)
    : file_(path, std::ios::binary | std::ios::trunc), filters_(std::move(filters)) {
  if (!file_) {
    throw ddp::ConfigError("cannot write '" + path +
                           "' for --duplicate-*-filters; check --log-dir is writable");
  }
}

void FilteredCopy::offer(const std::string& prefix, const std::string& line) {
  for (const auto& filter : filters_) {
    if (line.find(filter) == std::string::npos) continue;
    file_ << prefix << line << '\n';
    file_.flush();
    return;
  }
}

WorkerOutput::WorkerOutput(std::string prefix, int console_fd, const std::string& log_path,
                           std::size_t tail_lines)
    : prefix_(std::move(prefix)), console_fd_(console_fd), tail_lines_(tail_lines) {
  if (!log_path.empty()) {
    file_ = std::make_unique<std::ofstream>(log_path, std::ios::binary | std::ios::trunc);
    if (!*file_) {
      throw ddp::ConfigError("cannot write the worker log '" + log_path +
                             "'; check --log-dir exists and is writable");
    }
  }
}

void WorkerOutput::write(const char* data, std::size_t size) {
  if (file_) {
    file_->write(data, static_cast<std::streamsize>(size));
    file_->flush();
  }
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') {
      emit_line(partial_);
      partial_.clear();
    } else {
      partial_ += data[i];
      if (partial_.size() >= kMaxLine) {
        emit_line(partial_);
        partial_.clear();
      }
    }
  }
}

void WorkerOutput::finish() {
  if (!partial_.empty()) emit_line(partial_);
  partial_.clear();
}

void WorkerOutput::emit_line(const std::string& line) {
  if (console_fd_ >= 0) write_fully(console_fd_, prefix_ + line + "\n");
  if (copy_) copy_->offer(prefix_, line);
  if (tail_lines_ == 0) return;
  tail_.push_back(line);
  if (tail_.size() > tail_lines_) tail_.pop_front();
}

}  // namespace ddprun
