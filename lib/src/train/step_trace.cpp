#include "train/step_trace.h"

#include <time.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "ddp/comm/communicator.h"
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::train::detail {
namespace {

std::int64_t clock_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::int64_t to_ns(StepTrace::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

StepRange parse_step_range(const std::string& text) {
  const auto bad = [&] {
    return ConfigError("--trace-steps '" + text +
                       "' is not a step range; give A:B with 1 <= A <= B, or one step A");
  };
  StepRange r;
  try {
    std::size_t used = 0;
    const auto colon = text.find(':');
    r.first = std::stoll(text.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? text.size() : colon)) throw bad();
    r.last = r.first;
    if (colon != std::string::npos) {
      const std::string second = text.substr(colon + 1);
      r.last = std::stoll(second, &used);
      if (used != second.size()) throw bad();
    }
  } catch (const std::logic_error&) {
    throw bad();
  }
  if (r.first < 1 || r.last < r.first) throw bad();
  return r;
}

StepTrace::StepTrace(std::optional<StepRange> range, std::string path, int rank, int node)
    : range_(range),
      path_(std::move(path)),
      rank_(rank),
      node_(node),
      // steady_clock is CLOCK_MONOTONIC, like the flight recorder's precise stamps.
      wall_minus_monotonic_ns_(clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC)) {}

double StepTrace::wall_us(std::int64_t monotonic_ns) const {
  return static_cast<double>(monotonic_ns + wall_minus_monotonic_ns_) / 1000.0;
}

void StepTrace::begin_step(Communicator& comm, int64_t step) {
  if (!traces(step)) return;
  comm.set_precise_op_times(true);
  ops_before_step_ = comm.flight_recorder().snapshot().begun;
}

void StepTrace::end_step(Communicator& comm, int64_t step) {
  if (!traces(step)) return;
  add_collectives(comm.flight_recorder().snapshot(), ops_before_step_, step);
  if (step == range_->last) comm.set_precise_op_times(false);
}

void StepTrace::write_after(int64_t step) {
  if (!range_ || written_ || step < range_->last) return;
  written_ = true;
  if (events_.empty()) {
    log::warn("no step of --trace-steps {}:{} ran; no trace written", range_->first, range_->last);
    return;
  }
  write();
}

void StepTrace::span(const char* name, Clock::time_point start, Clock::time_point end,
                     int64_t step) {
  if (!traces(step)) return;
  events_.push_back({name, 0, wall_us(to_ns(start)),
                     static_cast<double>(to_ns(end) - to_ns(start)) / 1000.0, step, ""});
}

void StepTrace::add_collectives(const flight::Snapshot& snapshot, std::uint64_t after,
                                int64_t step) {
  for (const auto& op : snapshot.ops) {
    if (op.seq <= after || op.end_ns == 0) continue;
    std::string name = flight::to_string(op.kind);
    if (!op.label.empty()) {
      name += " " + op.label + (op.label_index >= 0 ? " " + std::to_string(op.label_index) : "");
    }
    events_.push_back({name, 1, wall_us(op.start_ns),
                       static_cast<double>(op.end_ns - op.start_ns) / 1000.0, step, op.describe()});
  }
}

std::string StepTrace::json() const {
  using json = nlohmann::json;
  json events = json::array();
  const std::string process =
      "rank " + std::to_string(rank_) + (node_ >= 0 ? " (node " + std::to_string(node_) + ")" : "");
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", process}}}});
  events.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"args", {{"sort_index", rank_}}}});
  for (const auto& [tid, name] : {std::pair{0, "training"}, std::pair{1, "collectives"}}) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank_},
                      {"tid", tid},
                      {"args", {{"name", name}}}});
  }
  for (const auto& e : events_) {
    json args = {{"step", e.step}};
    if (!e.detail.empty()) args["op"] = e.detail;
    events.push_back({{"name", e.name},
                      {"ph", "X"},
                      {"pid", rank_},
                      {"tid", e.tid},
                      {"ts", e.ts_us},
                      {"dur", e.dur_us},
                      {"args", args}});
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

void StepTrace::write() const {
  std::ofstream out(path_, std::ios::trunc);
  out << json() << "\n";
  out.close();
  if (!out) {
    throw DataError(path_,
                    "cannot write the step trace; check that its folder (--trace-dir, "
                    "DDP_TRACE_DIR) exists and is writable");
  }
  log::info("trace of steps {}-{}: {}", range_->first, range_->last, path_);
}

}  // namespace ddp::train::detail
