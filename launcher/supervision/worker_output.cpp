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

// The placeholder "$name" or "${name}" at t[at] (a '$' with a character after it): its name, and
// where the text after it starts; nullopt where none is (a lone '$', an unclosed brace).
struct Placeholder {
  std::string name;
  std::size_t next;
};
std::optional<Placeholder> placeholder_at(const std::string& t, std::size_t at) {
  const bool braced = t[at + 1] == '{';
  const std::size_t start = at + (braced ? 2 : 1);
  std::size_t end = start;
  if (end < t.size() && identifier_start(t[end])) {
    while (end < t.size() && identifier_char(t[end])) ++end;
  }
  if (end == start || (braced && (end == t.size() || t[end] != '}'))) return std::nullopt;
  return Placeholder{t.substr(start, end - start), end + (braced ? 1 : 0)};
}

// Python's string.Template(t).safe_substitute(values): "$$" is a "$", and a placeholder that is
// unknown or malformed stays as written.
std::string safe_substitute(const std::string& t,
                            const std::map<std::string, std::string>& values) {
  std::string out;
  std::size_t i = 0;
  while (i < t.size()) {
    if (t[i] != '$' || i + 1 == t.size()) {
      out += t[i++];
      continue;
    }
    if (t[i + 1] == '$') {
      out += '$';
      i += 2;
      continue;
    }
    const auto placeholder = placeholder_at(t, i);
    const auto value = placeholder ? values.find(placeholder->name) : values.end();
    if (value == values.end()) {
      out += t[i++];
      continue;
    }
    out += value->second;
    i = placeholder->next;
  }
  return out;
}

}  // namespace

std::string worker_line_prefix(const std::optional<std::string>& line_template,
                               const std::string& role, int rank, int local_rank) {
  // torchrun's TailLog header, f"[{name}{local_rank}]:" with the role as the name.
  if (!line_template || line_template->empty()) {
    return "[" + role + std::to_string(local_rank) + "]:";
  }
  return safe_substitute(*line_template, {{"role_name", role},
                                          {"rank", std::to_string(rank)},
                                          {"local_rank", std::to_string(local_rank)}});
}

StreamRoute route_stream(bool redirected, bool teed, bool shown) {
  StreamRoute route;
  route.to_file = redirected || teed;
  route.filtered = shown && teed;
  if (!shown || (redirected && !teed)) {
    route.console = StreamRoute::Console::kNone;
  } else if (teed) {
    route.console = StreamRoute::Console::kPrefixed;
  }
  return route;
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

void FilteredCopy::offer(const std::string& prefix, const std::string& line, const char* ending) {
  for (const auto& filter : filters_) {
    if (line.find(filter) == std::string::npos) continue;
    file_ << prefix << line << ending;
    file_.flush();
    return;
  }
}

WorkerOutput::WorkerOutput(ConsoleCopy console, const std::string& log_path, std::size_t tail_lines)
    : console_(std::move(console)), tail_lines_(tail_lines) {
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
  if (console_.fd >= 0 && !console_.prefix) {
    unwritten_.append(data, size);
    write_as_written(false);
  }
  split_lines(data, size);
}

void WorkerOutput::finish() {
  if (console_.fd >= 0 && !console_.prefix) write_as_written(true);
  if (!partial_.empty()) emit_line(partial_, "");
  partial_.clear();
  skip_lf_ = false;
}

// Lines as torchrun's tail reads them (Python's text-mode readline, universal newlines): each
// ends at "\n", "\r" or "\r\n", and is printed with "\n".
void WorkerOutput::split_lines(const char* data, std::size_t size) {
  for (std::size_t i = 0; i < size; ++i) {
    const char c = data[i];
    const bool lf_of_crlf = skip_lf_ && c == '\n';
    skip_lf_ = c == '\r';
    if (lf_of_crlf) continue;
    if (c == '\n' || c == '\r') {
      emit_line(partial_, "\n");
      partial_.clear();
      continue;
    }
    partial_ += c;
    if (partial_.size() >= kMaxLine) {
      emit_line(partial_, "\n");
      partial_.clear();
    }
  }
}

// The bytes as the worker wrote them, a whole number of lines per write (so that two workers'
// lines, or ddprun's own, do not cut into each other); a line longer than kMaxLine goes out cut.
void WorkerOutput::write_as_written(bool end_of_stream) {
  std::size_t end = unwritten_.find_last_of("\r\n");
  end = end == std::string::npos ? 0 : end + 1;
  if (end_of_stream || unwritten_.size() - end >= kMaxLine) end = unwritten_.size();
  if (end == 0) return;
  write_fully(console_.fd, unwritten_.substr(0, end));
  unwritten_.erase(0, end);
}

void WorkerOutput::emit_line(const std::string& line, const char* ending) {
  if (console_.fd >= 0 && console_.prefix)
    write_fully(console_.fd, *console_.prefix + line + ending);
  if (copy_) copy_->offer(console_.prefix.value_or(""), line, ending);
  if (tail_lines_ == 0) return;
  tail_.push_back(line);
  if (tail_.size() > tail_lines_) tail_.pop_front();
}

}  // namespace ddprun
