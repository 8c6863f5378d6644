#pragma once
// torchelastic's events (torch/distributed/elastic/events), for --event-log-handler: one JSON
// object per line, as Event.serialize() writes it (json.dumps of the dataclass: name, source,
// timestamp 0, metadata), with the states and metadata keys of the agent's _construct_event:
//   torchelastic.worker.status.RENDEZVOUS   AGENT   after each rendezvous, with duration_ms
//   torchelastic.worker.status.{SUCCEEDED,FAILED,TERMINATED}   WORKER   one per worker of this
//       node at the end (TERMINATED: stopped by the agent after another failure)
//   torchelastic.worker.status.{SUCCEEDED,FAILED}   AGENT   the agent's result, last
// Handlers: "null" (and torchelastic's "dynamic_rendezvous") discard, "console" writes to
// stderr, and "file:PATH" (ddprun's) appends to PATH.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "config/launch_config.h"

namespace ddprun {

// One event's fields; unset ones serialize as null, as torchelastic's None.
struct EventFields {
  std::string state;    // SUCCEEDED, FAILED, TERMINATED, RENDEZVOUS
  bool worker = false;  // source WORKER, else AGENT
  std::optional<int> global_rank;
  std::optional<int> group_rank;
  std::optional<std::string> worker_id;
  long total_run_time = 0;  // whole seconds since the agent started
  std::optional<std::string> raw_error;
  int agent_restarts = 0;
  std::optional<long> duration_ms;
  // The nested "metadata" string: group_world_size and entry_point, and for a worker its
  // local_rank, role_rank, role_world_size, exit_code and worker_pid (each a 1-tuple).
  int group_world_size = 0;
  std::optional<int> local_rank, role_rank, role_world_size, exit_code, worker_pid;
};

// What an event is about, the same for all of one agent's events.
struct EventContext {
  std::string run_id;
  std::string role;
  std::string hostname;  // the FQDN, as _get_fq_hostname
  std::string rdzv_backend;
  std::string entry_point;
};

// The line torchelastic's Event.serialize() writes for these fields (Python's json.dumps
// spacing). Pure.
std::string serialize_event(const EventContext& context, const EventFields& fields);

class EventLog {
 public:
  EventLog(const EventLogHandler& handler, EventContext context);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  bool enabled() const { return kind_ != EventLogHandler::Kind::kNull; }
  void record(const EventFields& fields);

 private:
  EventLogHandler::Kind kind_;
  EventContext context_;
  std::FILE* file_ = nullptr;
};

}  // namespace ddprun
