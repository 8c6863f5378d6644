// Failure and teardown: an op's error is built once, every peer is told (best effort, bounded in
// time), and the endpoint is closed, or left open or leaked where closing is unsafe. No libfabric
// call is made on the endpoint afterwards, so nothing touches caller memory.
#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "comm/fabric/fabric_transport.h"
#include "comm/fabric/fabric_transport_internal.h"
#include "comm/fabric/message_tag.h"
#include "comm/fabric/stuck_call_guard.h"
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::detail::fabric {

// What to add to a failed post's error when the provider's queue was full (ENOMEM, or EAGAIN
// that nothing cleared): its size and the variable that sets it. Ops keep a standing receive per
// peer plus a few dozen messages in flight (up to 32 eager pieces; the ring's receives posted
// ahead and sends 8 segments ahead), which the defaults (1024 and more) hold with room to spare.
std::string queue_full_hint(const fi_info& info, ssize_t rc, bool receive) {
  if (rc != -FI_ENOMEM && rc != -FI_EAGAIN) return "";
  // In "tcp;ofi_rxm" the queue that refused is the top layer's.
  std::string layer = info.fabric_attr->prov_name;
  layer = layer.substr(layer.find(';') == std::string::npos ? 0 : layer.find(';') + 1);
  for (char& c : layer) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::size_t entries = receive ? info.rx_attr->size : info.tx_attr->size;
  return std::string("; the endpoint's ") + (receive ? "receive" : "send") + " queue is only " +
         std::to_string(entries) + " deep: unset or raise FI_" + layer +
         (receive ? "_RX_SIZE" : "_TX_SIZE");
}

FabricTransport::~FabricTransport() {
  // In a forked child (a data loader worker, say) the endpoint's shared-memory region and
  // sockets still belong to the parent: closing them here could unlink the region or shut the
  // sockets down under the parent's communicator.
  if (::getpid() != owner_) {
    wedged_ = true;
    abandon_silently();
    // Its condition variable had a waiter in the parent: destroying it here would wait forever.
    (void)guard_.release();
    return;
  }
  release_fabric();
}

void FabricTransport::abandon_silently() {
  failure_ = "the communicator belongs to another process";
  release_fabric();
}

void FabricTransport::release_fabric() {
  if (!endpoint_) return;
  if (!wedged_) {
    // The endpoint goes first, so nothing still posted can touch memory released below.
    FabricEndpoint* endpoint = endpoint_.get();
    if (guard_->run(
            "fi_close", [endpoint] { endpoint->close_endpoint(); }, kBestEffortCallLimit)) {
      op_registrations_.clear();
      scratch_registration_.reset();
      control_registration_.reset();
      endpoint_.reset();
      return;
    }
    log::debug("fabric: closing the endpoint: {} without returning; leaking it",
               guard_->last_abandoned_reason());
    wedged_ = true;
  }
  // A provider call never returned (or the objects belong to the parent of this forked
  // process): closing could hang or break the owner.
  leak_fabric();
}

void FabricTransport::leak_fabric() {
  for (auto& registration : op_registrations_) (void)registration.release();
  (void)scratch_registration_.release();
  (void)control_registration_.release();
  (void)scratch_.release();
  (void)control_area_.release();
  (void)endpoint_.release();
  for (auto& slot : control_slots_) (void)slot.release();
  for (auto& slot : header_slots_) (void)slot.release();
  leaked_slots_ = std::make_unique<std::deque<Slot>>(std::move(slots_));
  (void)leaked_slots_.release();
}

void FabricTransport::fail_stuck_call() {
  // Blame a peer this op waits on first: others may have exited normally by now.
  auto dead = liveness_.first_exited(awaited_peers());
  if (!dead) dead = liveness_.first_exited();
  fail(dead.value_or(-1),
       "libfabric's " + guard_->last_abandoned_reason() + " without returning" +
           (dead ? "; rank " + std::to_string(*dead) +
                       " exited on this host, apparently inside the provider's shared-memory "
                       "critical section"
                 : std::string("; the provider is stuck")));
}

void FabricTransport::require_usable() const {
  if (!failure_.empty()) {
    throw CommError(op_name(), rank_, -1,
                    "the fabric communicator is unusable after an earlier failure (" + failure_ +
                        "); recreate the communicator or restart the job");
  }
}

void FabricTransport::raise_completion_error() {
  fi_cq_err_entry error{};  // zeroed: err_data_size 0 asks the provider for its own buffer
  fid_cq* cq = endpoint_->completion_queue();
  const ssize_t read = guarded("fi_cq_readerr", [&] { return fi_cq_readerr(cq, &error, 0); });
  if (read != 1) fail(-1, "fi_cq_readerr failed: " + fabric_error_text(read));
  char provider_text[256] = {0};
  const char* detail = fi_cq_strerror(endpoint_->completion_queue(), error.prov_errno,
                                      error.err_data, provider_text, sizeof(provider_text));
  const int code = std::abs(error.err);  // some providers report it negated
  const std::string message =
      fabric_error_text(code) +
      (detail && *detail ? std::string(", provider says: ") + detail : std::string());
  completion_failed_ = true;
  Slot* s = static_cast<Slot*>(error.op_context);
  if (!s) fail(-1, "libfabric reported " + message);
  if (s->kind == SlotKind::kControl) {
    const MessageTag tag = decode_tag(error.tag);
    fail(static_cast<int>(tag.source),
         "rank " + std::to_string(tag.source) + " aborted the job's collectives");
  }
  if (code == FI_ETRUNC) {
    if (s->kind == SlotKind::kHeader) {
      fail(s->peer, "rank " + std::to_string(s->peer) +
                        " sent an op header of another size; is it running another version of "
                        "this library?");
    }
    fail(s->peer, "rank " + std::to_string(s->peer) + " sent more than the " +
                      std::to_string(s->bytes) +
                      " bytes this rank expected; the ranks passed buffers of different sizes");
  }
  const char* direction = s->kind == SlotKind::kSend ? "a send to" : "a receive from";
  fail(s->peer, std::string("libfabric failed ") + direction + " rank " + std::to_string(s->peer) +
                    ": " + message);
}

void FabricTransport::fail(int peer, const std::string& cause, bool timed_out) {
  const std::string op = op_name();
  if (failure_.empty()) failed_peer_ = peer;
  if (timed_out) {
    TimeoutError error(op, rank_, peer, cause);
    abandon(error.what());
    throw error;
  }
  CommError error(op, rank_, peer, cause);
  abandon(error.what());
  throw error;
}

void FabricTransport::abandon(const std::string& reason) {
  if (!failure_.empty() || !endpoint_) return;
  failure_ = reason;
  log::debug("fabric: abandoning the endpoint: {}", reason);
  if (!wedged_) notify_peers(reason);
  if (leaves_failed_endpoint_open_ && !wedged_) {
    log::debug("fabric: leaving the failed {} endpoint open until the process exits",
               endpoint_->info().fabric_attr->prov_name);
    return leak_fabric();
  }
  release_fabric();
}

void FabricTransport::notify_peers(const std::string& reason) {
  // Tell every peer, so that ranks waiting on this one (or on others) stop now rather than at
  // their timeout. Best effort: a peer that is gone simply never reads it.
  MessageTag tag;
  tag.control = true;
  tag.source = static_cast<std::uint32_t>(rank_);
  const std::uint64_t bits = encode_tag(tag);
  std::string notice(kNoticeSequenceBytes, '\0');
  std::memcpy(notice.data(), &sequence_, kNoticeSequenceBytes);
  notice += reason;
  notice.resize(std::min(notice.size(), kNoticeBytes));
  // Where the provider injects less (64 bytes over tcp;ofi_rxm) the notice is sent from the
  // registered control area instead, so that the peers read the whole reason.
  const bool injected = notice.size() <= inject_bytes_;
  char* staged = notice_buffer(notice_receives_);
  std::memcpy(staged, notice.data(), notice.size());
  void* desc = control_registration_->descriptor();
  fid_ep* ep = endpoint_->endpoint();
  const std::size_t length = notice.size();
  const auto give_up = Clock::now() + std::chrono::milliseconds(100);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_ || !may_notify(peer)) continue;
    const fi_addr_t destination = peers_[peer];
    void* context = injected ? nullptr : &slots_[acquire(SlotKind::kSend, peer, 0, length)].context;
    for (;;) {
      ssize_t rc = 0;
      if (!guard_->run(
              injected ? "fi_tinject" : "fi_tsend",
              [&] {
                rc = injected ? fi_tinject(ep, staged, length, destination, bits)
                              : fi_tsend(ep, staged, length, desc, destination, bits, context);
              },
              kBestEffortCallLimit)) {
        log::debug("fabric: the abort notice to rank {}: {} without returning", peer,
                   guard_->last_abandoned_reason());
        wedged_ = true;
        return;
      }
      if (rc != -FI_EAGAIN || Clock::now() >= give_up) break;
      if (!drain_quietly(std::chrono::milliseconds(0))) return;
    }
  }
  // shm delivers an inject before returning; socket providers need progress to send. Not
  // ofi_rxm after an error completion: its progress runs the connection progress that
  // may_notify() keeps away from, and its tcp sends a small message on an established
  // connection at once.
  if (!is_shm_ && !(rxm_ && completion_failed_)) drain_quietly(std::chrono::milliseconds(20));
}

bool FabricTransport::may_notify(int peer) const {
  // A peer killed inside shm's critical section leaves its region locked: skip known-dead
  // peers rather than wait for the stuck-call guard; and peers on their way out, whose
  // connections ofi_rxm may be tearing down (sending on one crashed it).
  if (auto pid = liveness_.pid_of(peer); pid && process_exiting(*pid)) return false;
  if (!rxm_ || !completion_failed_) return true;
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

bool FabricTransport::drain_quietly(std::chrono::milliseconds period) {
  fid_cq* cq = endpoint_->completion_queue();
  const auto until = Clock::now() + period;
  do {
    fi_cq_tagged_entry entries[kCompletionBatch];
    ssize_t rc = 0;
    if (!guard_->run(
            "fi_cq_read", [&] { rc = fi_cq_read(cq, entries, kCompletionBatch); },
            kBestEffortCallLimit)) {
      log::debug("fabric: draining after a failure: {} without returning",
                 guard_->last_abandoned_reason());
      wedged_ = true;
      return false;
    }
    if (rc == -FI_EAVAIL) {
      fi_cq_err_entry error{};
      if (!guard_->run(
              "fi_cq_readerr", [&] { rc = fi_cq_readerr(cq, &error, 0); }, kBestEffortCallLimit)) {
        wedged_ = true;
        return false;
      }
    }
  } while (Clock::now() < until);
  return true;
}

}  // namespace ddp::detail::fabric
