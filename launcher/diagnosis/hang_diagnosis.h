#pragma once
// What the agents know of a hang, and the diagnosis composed from it. Each agent reads its
// workers' flight recorders (ddp/flight_recorder.h) and /proc into a NodeHangReport, which
// travels through the store as JSON; node 0's agent turns every node's report into one
// diagnosis naming the rank that holds the others up. Pure data and text, unit-tested
// (tests/launcher/diagnosis/hang_diagnosis_test.cpp); hang_watch.h does the reading and the store.
#include <optional>
#include <string>
#include <vector>

namespace ddprun {

// One op as the diagnosis needs it.
struct HangOp {
  unsigned long long seq = 0;
  std::string kind;         // "allreduce"
  std::string description;  // "allreduce #12 (bucket 0, 4.0 KiB float32, ring)"
  double seconds = 0;       // running: how long it has waited; finished: how long ago it ended
  int waiting_on = -1;      // running: the peer it waits on now (-1: unknown)
};

struct WorkerHangState {
  int rank = -1;
  int local_rank = -1;
  int pid = 0;
  // From /proc/PID/stat: "running", "sleeping", "stopped (SIGSTOP)", "exited", ...
  std::string process_state;
  bool has_recorder = false;  // false: not built on ddp (a Python worker), or recording is off
  std::string recorder_note;  // why there is no recorder, when there is none
  std::optional<HangOp> running;
  std::optional<HangOp> last_finished;
  std::string stack;  // the threads' stacks, when this agent took them
  // A worker without a recorder (a Python worker on c10d): where its main thread's native stack
  // says it is ("collective", "store", "none"; "" when no stack was taken; c10d_wait_of), and
  // how long that thread has neither run nor woken up.
  std::string c10d_wait;
  double idle_seconds = 0;
};

struct NodeHangReport {
  int node = -1;  // group rank
  std::string host;
  std::vector<WorkerHangState> workers;

  std::string to_json() const;
  // Throws ddp::Error on malformed text.
  static NodeHangReport from_json(const std::string& text);
};

// Whether this worker, seen from its own node, may be what the others wait for: it is in no
// collective, in one it entered less than `threshold_seconds` ago, or stopped. Its agent takes
// its stack.
bool locally_suspect(const WorkerHangState& worker, double threshold_seconds);

// Where the main thread (TID `pid`) of a c10d worker is, from its native stack (eu-stack's or
// gdb's text): "store" in a c10d Store call (init_process_group, a store-based barrier),
// "collective" in another c10d wait or barrier (a collective's Work::wait), "none" in neither,
// "" when the stack does not show that thread.
std::string c10d_wait_of(const std::string& stack, int pid);

struct HangDiagnosis {
  std::vector<int> culprits;  // ranks that have not entered the op the others wait in
  std::string headline;       // one line
  std::string text;           // the headline, then a paragraph per culprit with its stack
};

// Composes the diagnosis from the reports that arrived (`nodes` were expected). nullopt when no
// rank waits in a collective any more. Ranks with a recorder are placed by it; those without
// (c10d workers) by c10d_wait: a job of Python workers is diagnosed from their stacks alone.
// `python_stack_signal`: the signal (DDP_PY_STACK_SIGNAL, "" when off) whose faulthandler
// traceback the culprits' agents ask for, named in the text.
std::optional<HangDiagnosis> diagnose_hang(const std::vector<NodeHangReport>& reports, int nodes,
                                           const std::string& python_stack_signal = "");

// "0, 2-4, 7"
std::string rank_ranges(std::vector<int> ranks);

}  // namespace ddprun
