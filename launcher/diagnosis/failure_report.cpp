#include "diagnosis/failure_report.h"

#include <ctime>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "config/launch_config.h"
#include "ddp/exit_codes.h"

namespace ddprun {

using nlohmann::json;

namespace {

std::string utc_time(long long seconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32] = {};
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace

bool FailureReport::is_consequence() const {
  return kind == "worker" && signal == 0 && exit_code == ddp::exit_code::kComm;
}

bool FailureReport::is_membership_change() const { return kind == "membership" || is_loss(); }

bool FailureReport::is_loss() const { return kind == "lost" || (kind == "agent" && signal != 0); }

std::string FailureReport::to_json() const {
  json j = {{"kind", kind},
            {"node_rank", node_rank},
            {"hostname", hostname},
            {"rank", rank},
            {"local_rank", local_rank},
            {"pid", pid},
            {"exit_code", exit_code},
            {"signal", signal},
            {"message", message},
            {"stderr_tail", stderr_tail},
            {"worker_error_json", worker_error_json},
            {"hang_diagnosis", hang_diagnosis},
            {"timestamp", timestamp}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

FailureReport FailureReport::from_json(const std::string& text) {
  FailureReport r;
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    r.kind = "agent";
    r.message = "unreadable failure record: " + text.substr(0, 200);
    return r;
  }
  r.kind = j.value("kind", "worker");
  r.node_rank = j.value("node_rank", -1);
  r.hostname = j.value("hostname", "");
  r.rank = j.value("rank", -1);
  r.local_rank = j.value("local_rank", -1);
  r.pid = j.value("pid", 0);
  r.exit_code = j.value("exit_code", 1);
  r.signal = j.value("signal", 0);
  r.message = j.value("message", "");
  r.stderr_tail = j.value("stderr_tail", std::vector<std::string>{});
  r.worker_error_json = j.value("worker_error_json", "");
  r.hang_diagnosis = j.value("hang_diagnosis", "");
  r.timestamp = j.value("timestamp", 0LL);
  return r;
}

std::string FailureReport::headline() const {
  std::ostringstream out;
  if (kind == "lost") {
    out << "node " << node_rank << " (" << hostname << ") was lost: " << message;
    return out.str();
  }
  if (kind == "membership") {
    out << "node " << node_rank << " (" << hostname << ") saw " << message;
    return out.str();
  }
  if (kind == "agent") {
    out << "ddprun on node " << node_rank << " (" << hostname << ")";
    if (signal != 0) out << " received " << signal_name(signal);
    if (!message.empty()) out << ": " << message;
    return out.str();
  }
  out << "rank " << rank << " (local rank " << local_rank << ") on node " << node_rank << " ("
      << hostname << ")";
  if (signal != 0) {
    out << " was killed by " << signal_name(signal) << " (exit code " << exit_code << ")";
  } else {
    out << " exited with code " << exit_code;
  }
  return out.str();
}

std::string FailureReport::summary() const {
  std::ostringstream out;
  out << "root cause (first failure): " << headline() << "\n";
  if (pid != 0) out << "  pid " << pid << ", at " << utc_time(timestamp) << "\n";
  if (kind == "worker" && !message.empty()) out << "  error: " << message << "\n";
  if (!stderr_tail.empty()) {
    out << "  last " << stderr_tail.size() << " line" << (stderr_tail.size() == 1 ? "" : "s")
        << " of its stderr:\n";
    for (const auto& line : stderr_tail) out << "    " << line << "\n";
  }
  if (!hang_diagnosis.empty()) {
    out << "  a hang preceded it:\n";
    std::istringstream lines(hang_diagnosis);
    for (std::string line; std::getline(lines, line);) out << "    " << line << "\n";
  }
  return out.str();
}

std::optional<std::pair<std::string, std::string>> read_worker_error_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) return std::nullopt;
  const json& m = j["message"];
  std::string message;
  if (m.is_string()) {
    message = m.get<std::string>();
  } else if (m.is_object() && m.contains("message") && m["message"].is_string()) {
    message = m["message"].get<std::string>();
  }
  return std::make_pair(message, text);
}

void write_error_file(const std::string& path, const FailureReport& report) {
  json out;
  const json worker = report.worker_error_json.empty()
                          ? json(nullptr)
                          : json::parse(report.worker_error_json, nullptr, false);
  if (worker.is_object() && worker.contains("message") && worker["message"].is_object()) {
    out = worker;
    // The worker cannot know its own code when a signal killed it; torchrun overrides it too.
    out["message"]["errorCode"] = report.exit_code;
  } else {
    std::string tail;
    for (const auto& line : report.stderr_tail) tail += line + "\n";
    out["message"] = {{"message", report.headline()},
                      {"errorCode", report.exit_code},
                      {"extraInfo",
                       {{"timestamp", std::to_string(report.timestamp)},
                        {"rank", report.rank},
                        {"local_rank", report.local_rank},
                        {"node_rank", report.node_rank},
                        {"hostname", report.hostname},
                        {"pid", report.pid},
                        {"exitcode", report.exit_code},
                        {"signal", report.signal == 0 ? "" : signal_name(report.signal)},
                        {"stderr_tail", tail}}}};
  }
  if (!report.hang_diagnosis.empty()) out["hang_diagnosis"] = report.hang_diagnosis;
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << out.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
}

}  // namespace ddprun
