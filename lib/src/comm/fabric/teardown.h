#pragma once
// Failure and teardown for FabricTransport: what failed and where from, which peers an abort
// notice may go to, sending the notices (best effort, bounded in time), reading what a peer's
// notice means for this op, and closing the endpoint under the stuck-call guard. The transport
// owns one Teardown and lends it the endpoint for each call; it keeps the order in which its own
// objects are closed or leaked (fabric_transport_teardown.cpp).
//
// On any failure (error completion, mismatch, timeout, peer exit, or an abort notice from a
// peer) the transport tells every peer with a control message, so their waits end too, closes
// its endpoint (over ofi_rxm leaves it open until the process exits) and refuses later ops. No
// libfabric call is made on it again, so nothing touches caller memory. Over ofi_rxm after an
// error completion, only peers its connection is established with are told: see may_notify().
#include <rdma/fabric.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/fabric/op_deadline.h"
#include "comm/fabric/peer_liveness.h"

namespace ddp::detail::fabric {

class FabricEndpoint;
class StuckCallGuard;

// Where a notice too long to inject is staged: a registered buffer of kNoticeBytes.
struct NoticeStaging {
  char* buffer = nullptr;
  void* desc = nullptr;
};

class Teardown {
 public:
  struct Provider {
    bool is_shm = false;
    bool rxm = false;  // ofi_rxm over a message provider (tcp;ofi_rxm)
    std::size_t inject_bytes = 0;
  };
  // A peer's abort notice, as read from its control message.
  struct Notice {
    int source = -1;
    std::uint32_t sequence = 0;  // the op it failed in
    std::string cause;           // "rank N aborted the job's collectives[: why]"
  };

  // `guard` and `liveness` must outlive the Teardown.
  Teardown(int rank, int size, Provider provider, StuckCallGuard& guard,
           const PeerLiveness& liveness);

  // The failure. fail() records the first one; later ones keep its reason and peer.
  bool failed() const { return !failure_.empty(); }
  const std::string& failure() const { return failure_; }
  // Records `reason` as the failure; false if one was already recorded.
  bool record_failure(const std::string& reason);
  // The peer the op's failure came from (-1: none), set only before the failure is recorded.
  void blame(int peer);
  void completion_failed() { completion_failed_ = true; }
  bool has_completion_failed() const { return completion_failed_; }

  // A message of this communicator completed with `peer` (over ofi_rxm: its connection is
  // established).
  void reached(int peer) { reached_[static_cast<std::size_t>(peer)] = true; }
  // Whether a best-effort notice may go to `peer` now.
  bool may_notify(int peer) const;

  // Tells every peer may_notify() allows (`peers[r]` is rank r's address) that this rank gave up
  // in op `sequence`, then lets the provider send. `context_for(peer, bytes)` gives a tracked
  // send's context where the notice is too long to inject. False if a libfabric call never
  // returned: the endpoint must not be touched again.
  bool notify_peers(FabricEndpoint& endpoint, const std::vector<fi_addr_t>& peers,
                    std::uint32_t sequence, const std::string& reason, NoticeStaging staging,
                    const std::function<void*(int peer, std::size_t bytes)>& context_for);
  // Reads and discards completions for `period`; false if the provider wedged.
  bool drain_quietly(FabricEndpoint& endpoint, std::chrono::milliseconds period);
  // Closes the endpoint under the guard; false if fi_close never returned.
  bool close(FabricEndpoint& endpoint);

  // Notices received. read_notice decodes one from `source` (`length` bytes at `buffer`), taking
  // the op `sequence` this rank is in where the notice has none.
  static Notice read_notice(int source, const void* buffer, std::size_t length,
                            std::uint32_t sequence);
  // Whether a notice lets this rank finish the op it is in first: its sender failed in a later
  // op, so what it owed this one is already on its way. The op then fails only at its grace
  // period's end (or completes and the next op fails), through pending().
  bool defer(const Notice& notice, std::uint32_t sequence, bool in_op);
  const std::optional<Notice>& pending() const { return pending_; }

 private:
  // A notice written into the staging buffer, as every peer gets it.
  struct StagedNotice {
    const char* data = nullptr;
    std::size_t length = 0;
    void* desc = nullptr;
    bool injected = false;  // short enough to inject
    std::uint64_t tag = 0;
  };
  StagedNotice stage_notice(std::uint32_t sequence, const std::string& reason,
                            NoticeStaging staging) const;
  // Sends `notice` to `peer`, retrying while the provider's queue is full until `give_up`;
  // false if a call never returned.
  bool send_notice(FabricEndpoint& endpoint, int peer, fi_addr_t destination,
                   const StagedNotice& notice, void* context, Clock::time_point give_up);

  int rank_;
  Provider provider_;
  StuckCallGuard& guard_;
  const PeerLiveness& liveness_;
  std::string failure_;
  int failed_peer_ = -1;
  bool completion_failed_ = false;  // the provider reported an error completion
  std::vector<bool> reached_;       // by rank
  std::optional<Notice> pending_;
};

}  // namespace ddp::detail::fabric
