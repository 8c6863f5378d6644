#pragma once
// An abort from outside the collectives. When ddprun stops a round for a reason the ranks
// cannot see themselves — a node declared lost by its heartbeat, which vanished without closing
// its connections, or the rendezvous store's host gone the same way — it writes the reason into
// each worker's DDP_ABORT_FILE. A thread of the worker (started with its first communicator)
// reads the file every 100 ms and raises the notice:
// - libfabric's waits poll, and give up on their next idle poll with a CommError carrying the
//   reason, which unwinds the collective in the calling thread like any other failure;
// - gloo's waits block inside gloo (its synchronous pairs in read()), where nothing can wake
//   them. So, as PyTorch's NCCL watchdog does, the thread ends the process after a grace of
//   1 s if it still runs: it writes the CommError to the torchelastic error file, logs it, and
//   exits with 70 (the collective's exit code), instead of the worker waiting for a peer that
//   will never answer until the collective timeout.
//
// Process-wide, as the condition is: one notice ends every communicator of the process.
//
// Last words: a function the process runs once on the notice, before it ends: the trainer's
// checkpoint of its last completed step, so that the new world redoes at most the step in
// flight. The thread that catches the notice's CommError runs it (libfabric), else the watcher
// does after the grace, while the training thread is blocked in gloo (its state is then still
// that of its last step, which the function's own lock guarantees).
//
// Regrouping in-process (ddp/distributed.h, ProcessGroup::regroup). A process that can regroup
// arms it (arm_regroup). ddprun then words a membership change as a regroup notice, a text that
// begins with "regroup:" (a node was lost: give up the step now), "regroup after step:" (a
// node joins: every rank stops after the same step, through the trainer's stop vote) or
// "regroup when stopped:" (a node leaves: its ranks' stop vote stops every rank, and the others
// then regroup; nothing changes for the step). The watcher raises it as a regroup rather than
// an abort and does not end the process:
// - "regroup:" wakes the waits at once: libfabric's poll as above, and gloo's blocked reads are
//   woken by the wakers their transports registered (add_waker), which shut their sockets down;
// - the process regroups and calls clear(); the watcher then reads the file again, which ddprun
//   removed before it gave the new world's place;
// - should ddprun write a plain reason over the notice instead (it falls back to a restart), the
//   watcher takes it as the abort above. An unarmed process takes a regroup notice as an abort.
#include <chrono>
#include <functional>
#include <string>

namespace ddp::detail {

class AbortNotice {
 public:
  static constexpr auto kGrace = std::chrono::milliseconds(1000);

  static bool raised() noexcept;
  // "" until raised.
  static std::string reason();
  // Sets the reason; the first one stays.
  static void raise(const std::string& reason);
  // Starts (once per process) the thread that reads DDP_ABORT_FILE, when it is set; `rank`
  // names this process in the error.
  static void watch_file_from_environment(int rank);
  // What a wait that gave up says: "aborted by ddprun: <reason>".
  static std::string message();
  // Sets the last words (nullptr clears them); waits for ones that are being said, so that
  // their owner may go once this returns.
  static void set_last_words(std::function<void()> words);
  // Says them, once: the first caller runs them, later ones (the watcher after the training
  // thread) wait until they are said and return. Errors are logged, not thrown.
  static void say_last_words();

  // --- Regrouping in-process (see the file comment) ---------------------------------------------
  enum class Regroup {
    kNone,
    kNow,          // a node was lost: the step in flight is given up
    kAfterStep,    // a node joins: the ranks stop after the same step
    kWhenStopped,  // a node leaves: its stop signal stops every rank; then regroup
  };
  // Whether this process takes regroup notices as such (off: as aborts).
  static void arm_regroup(bool armed);
  static bool regroup_armed() noexcept;
  // The regroup raised, kNone for none (or for an abort).
  static Regroup regroup() noexcept;
  // Waits up to `timeout` for a regroup notice: after a collective failed on its own (a peer
  // killed, its connections closed), ddprun's notice of the lost node is still to come. false
  // on an abort or none.
  static bool wait_for_regroup(std::chrono::milliseconds timeout);
  // The process has regrouped: the notice is over, and the watcher reads the file again.
  static void clear();
  // Functions that wake waits blocked where no poll sees the notice (gloo's reads), called once
  // per "regroup:" notice from the watcher; `key` removes them (before their owner goes).
  static void add_waker(const void* key, std::function<void()> wake);
  static void remove_waker(const void* key);
};

}  // namespace ddp::detail
