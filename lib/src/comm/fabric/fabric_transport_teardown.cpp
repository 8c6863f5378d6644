// Failing an op and tearing the transport down: an op's error is built once, Teardown
// (teardown.h) tells every peer and closes the endpoint, and this file keeps the order in which
// the transport's objects are released, or left open or leaked where closing is unsafe. No
// libfabric call is made on the endpoint afterwards, so nothing touches caller memory.
#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
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
  teardown_->record_failure("the communicator belongs to another process");
  release_fabric();
}

void FabricTransport::release_fabric() {
  if (!endpoint_) return;
  if (!wedged_) {
    // The endpoint goes first, so nothing still posted can touch memory released below.
    if (teardown_->close(*endpoint_)) {
      op_registrations_.clear();
      scratch_registration_.reset();
      control_registration_.reset();
      endpoint_.reset();
      return;
    }
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
  if (teardown_->failed()) {
    throw CommError(op_name(), rank_, -1,
                    "the fabric communicator is unusable after an earlier failure (" +
                        teardown_->failure() + "); recreate the communicator or restart the job");
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
  teardown_->completion_failed();
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
  const std::string failed = std::string("libfabric failed ") + direction + " rank " +
                             std::to_string(s->peer) + ": " + message;
  fail(s->peer, connection_lost(code) ? peer_gone(s->peer) + " (" + failed + ")" : failed);
}

bool FabricTransport::connection_lost(int code) {
  return code == FI_ENOTCONN || code == FI_ECONNRESET || code == FI_ECONNABORTED ||
         code == FI_ECONNREFUSED || code == EPIPE;
}

std::string FabricTransport::peer_gone(int peer) const {
  // A peer that failed first (a mismatch it saw, say) sends its abort notice and exits; a
  // message to it can then fail before the notice is read. Reading on to find the notice would
  // run ofi_rxm's progress after an error completion, which may_notify() explains is unsafe.
  if (liveness_.exiting(peer)) return exited_during_op(peer);
  return "rank " + std::to_string(peer) +
         " closed its connection during the collective: it exited or gave up on the op, "
         "and its own error names the cause";
}

void FabricTransport::fail(int peer, const std::string& cause, bool timed_out) {
  const std::string op = op_name();
  teardown_->blame(peer);
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
  if (!endpoint_ || !teardown_->record_failure(reason)) return;
  log::debug("fabric: abandoning the endpoint: {}", reason);
  if (!wedged_) {
    const NoticeStaging staging{notice_buffer(notice_receives_),
                                control_registration_->descriptor()};
    wedged_ =
        !teardown_->notify_peers(*endpoint_, peers_, agreement_.sequence(), reason, staging,
                                 [this](int peer, std::size_t bytes) -> void* {
                                   return &slots_[acquire(SlotKind::kSend, peer, 0, bytes)].context;
                                 });
  }
  if (leaves_failed_endpoint_open_ && !wedged_) {
    log::debug("fabric: leaving the failed {} endpoint open until the process exits",
               endpoint_->info().fabric_attr->prov_name);
    return leak_fabric();
  }
  release_fabric();
}

}  // namespace ddp::detail::fabric
