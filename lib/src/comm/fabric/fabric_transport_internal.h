#pragma once
// What the files of FabricTransport share (fabric_transport.cpp: requests and progress;
// fabric_transport_agreement.cpp: carrying out the agreement's decisions;
// fabric_transport_liveness.cpp: deadlines and peer liveness; fabric_transport_teardown.cpp:
// failing an op and releasing its objects): the request slot, the limits (Teardown's too), and
// the two call wrappers every libfabric call goes through.
#include <rdma/fi_errno.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "comm/abort_notice.h"
#include "comm/fabric/fabric_transport.h"
#include "comm/fabric/op_deadline.h"

namespace ddp::detail::fabric {

inline constexpr std::size_t kNoticeBytes = 1024;
inline constexpr int kCompletionBatch = 16;
// How often a waiting op checks that the peers it waits on still run.
inline constexpr auto kLivenessInterval = std::chrono::milliseconds(100);
// How long an op may still run after a peer that was already past it aborted.
inline constexpr auto kAbortGrace = std::chrono::milliseconds(2000);
// A libfabric call that burns this much CPU while a peer on this host has exited is spinning on a
// lock the dead peer held (see StuckCallGuard); with every peer alive it may merely be charged for
// a loaded host's work, and is judged at the op's timeout. Under ThreadSanitizer every copy the
// provider makes is checked against shadow memory, which multiplies the CPU a copy costs.
#if defined(__SANITIZE_THREAD__)
inline constexpr auto kStuckCallCpuLimit = std::chrono::milliseconds(10000);
#else
inline constexpr auto kStuckCallCpuLimit = std::chrono::milliseconds(1000);
#endif
// Best-effort calls once the endpoint is done with (abort notices, draining, closing) give up
// after this much wall time, blocked or not: the rank's own error waits on them.
inline constexpr auto kBestEffortCallLimit = kStuckCallCpuLimit;
// After waiting this long for a peer it has sent no header in this op, a rank injects it one:
// ranks that disagree about an all-small op may wait on tags the other never sends (a rank with
// an empty buffer runs a barrier, its peer a recursive doubling), and the header shows them the
// mismatch long before their timeout. Ranks that agree pay one small message per slow wait.
inline constexpr auto kHeaderAfterIdle = std::chrono::milliseconds(1);
// An abort notice: the sender's op sequence number, then why it gave up (text).
inline constexpr std::size_t kNoticeSequenceBytes = sizeof(std::uint32_t);

struct FabricTransport::Slot {
  fi_context2 context;  // first: libfabric returns its address as the completion's op_context
  SlotKind kind;
  bool done;
  int peer;
  std::uint32_t index;
  std::size_t bytes;
  // What a deferred receive posts once its header has arrived.
  void* buffer;
  void* desc;
  std::uint64_t tag;
};

// What to add to a failed post's error when the provider's queue was full (ENOMEM, or EAGAIN
// that nothing cleared): its size and the variable that sets it.
std::string queue_full_hint(const fi_info& info, ssize_t rc, bool receive);

// Inline: a wait calls it on every empty poll.
inline void FabricTransport::check_deadline(Clock::time_point now, int peer,
                                            const char* waiting_for) {
  if (deadline_.liveness_check_due(now)) check_awaited_peers_alive();
  if (deadline_.expired(now)) fail_deadline(peer, waiting_for);
  if (AbortNotice::raised()) fail(peer, AbortNotice::message());
}

template <typename Call>
ssize_t FabricTransport::guarded(const char* name, Call&& call) {
  ssize_t rc = 0;
  if (!guard_->run(name, [&] { rc = call(); })) {
    wedged_ = true;
    fail_stuck_call();
  }
  return rc;
}

template <typename Post>
void FabricTransport::post_with_retry(const char* call, Post&& post, int peer, const char* what,
                                      bool receive) {
  PollBackoff backoff(spin_before_yield_);
  for (;;) {
    const ssize_t rc = guarded(call, post);
    if (rc == 0) return;
    if (rc != -FI_EAGAIN) {
      fail(peer, std::string(what) + " rank " + std::to_string(peer) + " could not be posted: " +
                     fabric_error_text(rc) + queue_full_hint(endpoint_->info(), rc, receive));
    }
    // The queues are full: completions free them.
    if (progress()) {
      backoff.reset();
      continue;
    }
    const auto now = Clock::now();
    check_deadline(now, peer, what);
    backoff.pause(now);
  }
}

}  // namespace ddp::detail::fabric
