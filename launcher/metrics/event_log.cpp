#include "metrics/event_log.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ddp/error.h"
#include "ddp/log.h"

namespace ddprun {
namespace {

// A JSON string as Python's json.dumps writes it (ASCII, escaped).
std::string quoted(const std::string& text) { return nlohmann::json(text).dump(-1, ' ', true); }

template <typename T>
std::string or_null(const std::optional<T>& value) {
  if (!value) return "null";
  if constexpr (std::is_same_v<T, std::string>) {
    return quoted(*value);
  } else {
    return std::to_string(*value);
  }
}

// The nested metadata: a JSON object, itself serialized into a string.
std::string nested_metadata(const EventContext& context, const EventFields& f) {
  std::string md = "{\"group_world_size\": " + std::to_string(f.group_world_size) +
                   ", \"entry_point\": " + quoted(context.entry_point);
  if (f.worker) {
    const auto tuple = [](const std::optional<int>& v) { return "[" + or_null(v) + "]"; };
    md += ", \"local_rank\": " + tuple(f.local_rank) + ", \"role_rank\": " + tuple(f.role_rank) +
          ", \"role_world_size\": " + tuple(f.role_world_size) +
          ", \"exit_code\": " + tuple(f.exit_code) + ", \"worker_pid\": " + tuple(f.worker_pid);
  }
  return md + "}";
}

}  // namespace

std::string serialize_event(const EventContext& c, const EventFields& f) {
  return "{\"name\": " + quoted("torchelastic.worker.status." + f.state) +
         ", \"source\": " + quoted(f.worker ? "WORKER" : "AGENT") +
         ", \"timestamp\": 0, \"metadata\": {\"run_id\": " + quoted(c.run_id) +
         ", \"global_rank\": " + or_null(f.global_rank) +
         ", \"group_rank\": " + or_null(f.group_rank) + ", \"worker_id\": " + or_null(f.worker_id) +
         ", \"role\": " + quoted(c.role) + ", \"hostname\": " + quoted(c.hostname) +
         ", \"state\": " + quoted(f.state) +
         ", \"total_run_time\": " + std::to_string(f.total_run_time) +
         ", \"rdzv_backend\": " + quoted(c.rdzv_backend) +
         ", \"raw_error\": " + or_null(f.raw_error) +
         ", \"metadata\": " + quoted(nested_metadata(c, f)) +
         ", \"agent_restarts\": " + std::to_string(f.agent_restarts) +
         ", \"duration_ms\": " + or_null(f.duration_ms) + "}}";
}

EventLog::EventLog(const EventLogHandler& handler, EventContext context)
    : kind_(handler.kind), context_(std::move(context)) {
  if (kind_ != EventLogHandler::Kind::kFile) return;
  file_ = std::fopen(handler.path.c_str(), "ae");
  if (file_ == nullptr) {
    throw ddp::ConfigError("--event-log-handler file:" + handler.path + ": cannot append to it (" +
                           std::strerror(errno) + "); name a writable file");
  }
}

EventLog::~EventLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventLog::record(const EventFields& fields) {
  if (kind_ == EventLogHandler::Kind::kNull) return;
  const std::string line = serialize_event(context_, fields) + "\n";
  std::FILE* out = kind_ == EventLogHandler::Kind::kConsole ? stderr : file_;
  std::fwrite(line.data(), 1, line.size(), out);
  std::fflush(out);
}

}  // namespace ddprun
