#pragma once
// The root cause of a failed group: which worker (or agent) failed first, how, and the last
// lines of its stderr. It travels between nodes through the store as JSON, is printed as one
// summary by every agent, and is written as a torchelastic-style error file.
#include <optional>
#include <string>
#include <vector>

namespace ddprun {

struct FailureReport {
  // "worker": a worker failed; "agent": an agent was stopped; "membership": nodes are waiting
  // to join an elastic job below its maximum size; "lost": a node stopped sending heartbeats
  // (heartbeat.h), named by node_rank and hostname.
  std::string kind = "worker";
  int node_rank = -1;
  std::string hostname;
  int rank = -1;  // global rank of the failed worker (-1 for an agent)
  int local_rank = -1;
  int pid = 0;
  int exit_code = 1;  // shell convention: 128 + signal when killed
  int signal = 0;
  std::string message;  // the worker's own error message when it wrote an error file
  std::vector<std::string> stderr_tail;
  std::string worker_error_json;  // the worker's error file, verbatim, when it wrote one
  std::string hang_diagnosis;     // the round's hang diagnosis, when one preceded the failure
  long long timestamp = 0;        // seconds since the epoch

  // A worker that exited with ddp::exit_code::kComm: a collective failed, usually because a
  // peer died first. Such a report yields the root cause to another failure of its round.
  bool is_consequence() const;
  // A node joining (kind "membership"), leaving because it was asked to stop (an agent that got
  // a signal: the pod is being deleted or preempted), or lost (kind "lost": its heartbeat
  // stopped). In an elastic job (--nnodes MIN:MAX) such a round ends without a failure: the group
  // moves to the next round with the nodes it then has, and no restart is used.
  bool is_membership_change() const;
  // The shrinking kinds of those: a node that left because it was asked to, or was lost.
  bool is_loss() const;

  std::string to_json() const;
  static FailureReport from_json(const std::string& text);

  // "rank 3 (local rank 1) on node 1 (train-1) exited with code 1"
  std::string headline() const;
  // The multi-line root-cause summary printed when the group fails.
  std::string summary() const;
};

// The "message" a worker recorded in its torchelastic error file, and the file's text;
// nullopt when the file is missing or not torchelastic JSON.
std::optional<std::pair<std::string, std::string>> read_worker_error_file(const std::string& path);

// Writes the torchelastic error file for `report`: the worker's own file with errorCode set
// when it wrote one (what torchrun does), else one that ddprun composes.
void write_error_file(const std::string& path, const FailureReport& report);

}  // namespace ddprun
