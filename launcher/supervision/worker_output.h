#pragma once
// One stream (stdout or stderr) of one worker, routed as torchrun 2.6 routes it: to the console
// as the worker wrote it (a stream neither tee'd nor redirected: torchrun's workers inherit its
// console), to the console line by line after a prefix ("[default0]:", a tee'd stream: torchrun
// tails its log file), or not at all; the raw bytes to a log file when --tee/--redirects ask for
// it. The last lines are kept for the root-cause summary whatever the console gets.
#include <cstddef>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddprun {

// A tee'd line's prefix: torchrun's "[<role><local rank>]:" ("[default0]:", no space after the
// colon), or TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE filled in as torchrun fills it (Python's
// string.Template.safe_substitute with role_name, rank (global), local_rank: "$name" or
// "${name}", "$$" for "$", anything else left as written). An empty template counts as unset,
// as in torchrun (`if self._log_line_prefix_template:`).
std::string worker_line_prefix(const std::optional<std::string>& line_template,
                               const std::string& role, int rank, int local_rank);

// Where one stream of one worker goes, as torchrun 2.6's DefaultLogsSpecs.reify decides.
struct StreamRoute {
  enum class Console {
    kNone,       // --redirects without --tee, or a local rank --local-ranks-filter hides
    kAsWritten,  // the worker's bytes unchanged
    kPrefixed,   // each line after worker_line_prefix() (--tee)
  };
  Console console = Console::kAsWritten;
  bool to_file = false;   // <local rank>/std{out,err}.log: redirected or tee'd
  bool filtered = false;  // offered to --duplicate-std{out,err}-filters' copy: tee'd and shown
};
StreamRoute route_stream(bool redirected, bool teed, bool shown);

// --duplicate-std{out,err}-filters: the node's one file per stream and round that collects the
// lines holding any of the filters (plain substrings, as torchrun), prefixed as on the console.
class FilteredCopy {
 public:
  FilteredCopy(const std::string& path, std::vector<std::string> filters);
  // `ending`: "\n", or "" for a stream's last line that had none.
  void offer(const std::string& prefix, const std::string& line, const char* ending);

 private:
  std::ofstream file_;
  std::vector<std::string> filters_;
};

// A stream's console copy: the fd (1 or 2; -1 for none) and how each line looks there.
struct ConsoleCopy {
  int fd = -1;
  // Each line's prefix (StreamRoute::Console::kPrefixed); nullopt: the bytes as written.
  std::optional<std::string> prefix;
};

class WorkerOutput {
 public:
  // log_path: "" for no file. tail_lines: how many last lines tail() keeps.
  WorkerOutput(ConsoleCopy console, const std::string& log_path, std::size_t tail_lines);

  // Also offers every prefixed line to `copy` (shared by the node's workers).
  void duplicate_to(std::shared_ptr<FilteredCopy> copy) { copy_ = std::move(copy); }

  void write(const char* data, std::size_t size);
  // End of stream: the last line without newline goes out without one, as torchrun prints it.
  void finish();

  const std::deque<std::string>& tail() const { return tail_; }

 private:
  void split_lines(const char* data, std::size_t size);
  void emit_line(const std::string& line, const char* ending);
  void write_as_written(bool end_of_stream);

  ConsoleCopy console_;
  std::unique_ptr<std::ofstream> file_;
  std::shared_ptr<FilteredCopy> copy_;
  std::size_t tail_lines_;
  std::string partial_;    // the current line, not yet ended
  bool skip_lf_ = false;   // the last line ended with '\r': a '\n' right after belongs to it
  std::string unwritten_;  // kAsWritten: bytes held until a line ends
  std::deque<std::string> tail_;
};

// Writes all of `text` to `fd`, retrying short writes; errors (a closed console) are ignored.
void write_fully(int fd, const std::string& text);

}  // namespace ddprun
