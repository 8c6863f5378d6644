#pragma once
// One stream (stdout or stderr) of one worker: each complete line goes to the console prefixed
// with the worker's rank ("[rank3]:"), the raw bytes to a log file when --tee/--redirects ask
// for it, and the last lines are kept for the root-cause summary.
#include <cstddef>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddprun {

// A worker's console prefix: "[rank3]:", or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE filled in as
// torchrun fills it (Python's string.Template.safe_substitute with role_name, rank, local_rank:
// "$name" or "${name}", "$$" for "$", anything else left as written).
std::string worker_line_prefix(const std::optional<std::string>& line_template,
                               const std::string& role, int rank, int local_rank);

// --duplicate-std{out,err}-filters: the node's one file per stream and round that collects the
// lines holding any of the filters (plain substrings, as torchrun), prefixed as on the console.
class FilteredCopy {
 public:
  FilteredCopy(const std::string& path, std::vector<std::string> filters);
  void offer(const std::string& prefix, const std::string& line);

 private:
  std::ofstream file_;
  std::vector<std::string> filters_;
};

class WorkerOutput {
 public:
  // prefix: each console line's (worker_line_prefix()). console_fd: 1 or 2, or -1 for no
  // console copy. log_path: "" for no file.
  WorkerOutput(std::string prefix, int console_fd, const std::string& log_path,
               std::size_t tail_lines);

  // Also offers every line to `copy` (shared by the node's workers).
  void duplicate_to(std::shared_ptr<FilteredCopy> copy) { copy_ = std::move(copy); }

  void write(const char* data, std::size_t size);
  // End of stream: flushes a last line without newline.
  void finish();

  const std::deque<std::string>& tail() const { return tail_; }

 private:
  void emit_line(const std::string& line);

  std::string prefix_;
  int console_fd_;
  std::unique_ptr<std::ofstream> file_;
  std::shared_ptr<FilteredCopy> copy_;
  std::size_t tail_lines_;
  std::string partial_;
  std::deque<std::string> tail_;
};

// Writes all of `text` to `fd`, retrying short writes; errors (a closed console) are ignored.
void write_fully(int fd, const std::string& text);

}  // namespace ddprun
