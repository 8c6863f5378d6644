#include "comm/fabric/teardown.h"

#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <cstring>

#include "comm/fabric/fabric_endpoint.h"
#include "comm/fabric/fabric_transport_internal.h"
#include "comm/fabric/message_tag.h"
#include "comm/fabric/stuck_call_guard.h"
#include "ddp/log.h"

namespace ddp::detail::fabric {

Teardown::Teardown(int rank, int size, Provider provider, StuckCallGuard& guard,
                   const PeerLiveness& liveness)
    : rank_(rank),
      provider_(provider),
      guard_(guard),
      liveness_(liveness),
      reached_(static_cast<std::size_t>(size), false) {}

bool Teardown::record_failure(const std::string& reason) {
  if (failed()) return false;
  failure_ = reason.empty() ? "unknown failure" : reason;
  return true;
}

void Teardown::blame(int peer) {
  if (!failed()) failed_peer_ = peer;
}

bool Teardown::may_notify(int peer) const {
  // A peer killed inside shm's critical section leaves its region locked: skip known-dead
  // peers rather than wait for the stuck-call guard; and peers on their way out, whose
  // connections ofi_rxm may be tearing down (sending on one crashed it).
  if (liveness_.exiting(peer)) return false;
  if (!provider_.rxm || !completion_failed_) return true;
  // Over ofi_rxm, a send to a peer without an established connection makes rxm connect and run
  // its connection progress, which also handles the shutdowns of peers that have exited. After
  // an error completion (a truncated large message, say) libfabric 1.17 crashes there: the
  // flush of the closed connection reaches the failed receive's state again (rxm_conn_progress,
  // rxm_process_shutdown, rxm_handle_rx_buf, rxm_cq_write_error; a segfault once in 100
  // mismatched 8-rank allreduces under load). So then notices go only to peers whose connection
  // is established, as a message completed with them, and not to the peer the failure came
  // from: no rxm call can run that progress. The others learn it from the ranks this one told,
  // or at their op timeout. (Without an error completion every peer is told: the notice carries
  // the root cause's text, though reaching a peer that is not progressing its endpoint can keep
  // a rank here for over a second.)
  return reached_[static_cast<std::size_t>(peer)] && peer != failed_peer_;
}

Teardown::StagedNotice Teardown::stage_notice(std::uint32_t sequence, const std::string& reason,
                                              NoticeStaging staging) const {
  MessageTag tag;
  tag.control = true;
  tag.source = static_cast<std::uint32_t>(rank_);
  std::string notice(kNoticeSequenceBytes, '\0');
  std::memcpy(notice.data(), &sequence, kNoticeSequenceBytes);
  notice += reason;
  notice.resize(std::min(notice.size(), kNoticeBytes));
  std::memcpy(staging.buffer, notice.data(), notice.size());
  StagedNotice staged;
  staged.data = staging.buffer;
  staged.length = notice.size();
  staged.desc = staging.desc;
  // Where the provider injects less (64 bytes over tcp;ofi_rxm) the notice is sent from the
  // registered staging buffer instead, so that the peers read the whole reason.
  staged.injected = staged.length <= provider_.inject_bytes;
  staged.tag = encode_tag(tag);
  return staged;
}

bool Teardown::notify_peers(FabricEndpoint& endpoint, const std::vector<fi_addr_t>& peers,
                            std::uint32_t sequence, const std::string& reason,
                            NoticeStaging staging,
                            const std::function<void*(int, std::size_t)>& context_for) {
  // Tell every peer, so that ranks waiting on this one (or on others) stop now rather than at
  // their timeout. Best effort: a peer that is gone simply never reads it.
  const StagedNotice notice = stage_notice(sequence, reason, staging);
  const auto give_up = Clock::now() + std::chrono::milliseconds(100);
  for (int peer = 0; peer < static_cast<int>(reached_.size()); ++peer) {
    if (peer == rank_ || !may_notify(peer)) continue;
    void* context = notice.injected ? nullptr : context_for(peer, notice.length);
    if (!send_notice(endpoint, peer, peers[static_cast<std::size_t>(peer)], notice, context,
                     give_up)) {
      return false;
    }
  }
  // shm delivers an inject before returning; socket providers need progress to send. Not
  // ofi_rxm after an error completion: its progress runs the connection progress that
  // may_notify() keeps away from, and its tcp sends a small message on an established
  // connection at once.
  if (provider_.is_shm || (provider_.rxm && completion_failed_)) return true;
  return drain_quietly(endpoint, std::chrono::milliseconds(20));
}

bool Teardown::send_notice(FabricEndpoint& endpoint, int peer, fi_addr_t destination,
                           const StagedNotice& notice, void* context, Clock::time_point give_up) {
  fid_ep* ep = endpoint.endpoint();
  for (;;) {
    ssize_t rc = 0;
    const bool returned = guard_.run(
        notice.injected ? "fi_tinject" : "fi_tsend",
        [&] {
          rc = notice.injected ? fi_tinject(ep, notice.data, notice.length, destination, notice.tag)
                               : fi_tsend(ep, notice.data, notice.length, notice.desc, destination,
                                          notice.tag, context);
        },
        kBestEffortCallLimit);
    if (!returned) {
      log::debug("fabric: the abort notice to rank {}: {} without returning", peer,
                 guard_.last_abandoned_reason());
      return false;
    }
    if (rc != -FI_EAGAIN || Clock::now() >= give_up) return true;
    if (!drain_quietly(endpoint, std::chrono::milliseconds(0))) return false;
  }
}

bool Teardown::drain_quietly(FabricEndpoint& endpoint, std::chrono::milliseconds period) {
  fid_cq* cq = endpoint.completion_queue();
  const auto until = Clock::now() + period;
  do {
    fi_cq_tagged_entry entries[kCompletionBatch];
    ssize_t rc = 0;
    if (!guard_.run(
            "fi_cq_read", [&] { rc = fi_cq_read(cq, entries, kCompletionBatch); },
            kBestEffortCallLimit)) {
      log::debug("fabric: draining after a failure: {} without returning",
                 guard_.last_abandoned_reason());
      return false;
    }
    if (rc == -FI_EAVAIL) {
      fi_cq_err_entry error{};
      if (!guard_.run(
              "fi_cq_readerr", [&] { rc = fi_cq_readerr(cq, &error, 0); }, kBestEffortCallLimit)) {
        return false;
      }
    }
  } while (Clock::now() < until);
  return true;
}

bool Teardown::close(FabricEndpoint& endpoint) {
  FabricEndpoint* closing = &endpoint;
  if (guard_.run(
          "fi_close", [closing] { closing->close_endpoint(); }, kBestEffortCallLimit)) {
    return true;
  }
  log::debug("fabric: closing the endpoint: {} without returning; leaking it",
             guard_.last_abandoned_reason());
  return false;
}

Teardown::Notice Teardown::read_notice(int source, const void* buffer, std::size_t length,
                                       std::uint32_t sequence) {
  Notice notice;
  notice.source = source;
  notice.sequence = sequence;
  length = std::min(length, kNoticeBytes);
  std::string text;
  if (length >= kNoticeSequenceBytes) {
    std::memcpy(&notice.sequence, buffer, kNoticeSequenceBytes);
    text.assign(static_cast<const char*>(buffer) + kNoticeSequenceBytes,
                length - kNoticeSequenceBytes);
  }
  notice.cause = "rank " + std::to_string(source) + " aborted the job's collectives" +
                 (text.empty() ? std::string() : ": " + text);
  return notice;
}

bool Teardown::defer(const Notice& notice, std::uint32_t sequence, bool in_op) {
  // A rank that failed in a later op has finished this one: what it owed this rank is on its
  // way, so let this op complete (briefly) and fail the next one instead.
  const std::uint32_t ahead = notice.sequence - sequence;
  if (!in_op || ahead == 0 || ahead >= (1u << 31)) return false;
  pending_ = notice;
  return true;
}

}  // namespace ddp::detail::fabric
