// Deadlines and peer liveness: an op fails at its deadline, or as soon as a peer on this host
// that it still waits on has exited (after reading what that peer sent before it went).
#include <string>
#include <vector>

#include "comm/fabric/fabric_transport.h"
#include "comm/fabric/fabric_transport_internal.h"

namespace ddp::detail::fabric {
namespace {

// How long messages from a peer that has exited may still trickle in before its absence fails
// the op: this much wall time and this many polls in a row that found nothing, so that a rank
// descheduled through the window (ranks outnumbering cores) still reads what is already in its
// sockets.
constexpr auto kExitedPeerDrain = std::chrono::milliseconds(50);
constexpr int kExitedPeerDrainIdlePolls = 200;

}  // namespace

void FabricTransport::fail_deadline(int peer, const char* waiting_for) {
  if (const auto& pending = teardown_->pending()) fail(pending->source, pending->cause);
  fail(peer,
       std::string("no progress within the ") + std::to_string(deadline_.timeout().count()) +
           " ms timeout while waiting for " + waiting_for + " rank " + std::to_string(peer) +
           "; that rank is dead, stuck, or issued a different collective",
       /*timed_out=*/true);
}

std::vector<bool> FabricTransport::awaited_peers() const {
  std::vector<bool> awaited(peers_.size(), false);
  for (const Slot& s : slots_) {
    const bool in_flight = s.kind == SlotKind::kSend || s.kind == SlotKind::kRecv;
    if (in_flight && !s.done && s.peer >= 0) awaited[s.peer] = true;
  }
  return awaited;
}

void FabricTransport::check_awaited_peers_alive() {
  // Only peers this op still waits on: a peer that finished its part may exit (the end of a
  // job), and one that is not involved is no reason to fail.
  const auto dead = liveness_.first_exited(awaited_peers());
  if (!dead) return;
  // What it sent before it went may still be on its way: take that first.
  const auto until = Clock::now() + kExitedPeerDrain;
  int idle_polls = 0;
  while (awaited_peers()[*dead] &&
         (idle_polls < kExitedPeerDrainIdlePolls || Clock::now() < until)) {
    idle_polls = progress() ? 0 : idle_polls + 1;
  }
  if (!awaited_peers()[*dead]) return;
  fail(*dead, exited_during_op(*dead));
}

std::string FabricTransport::exited_during_op(int peer) const {
  return "rank " + std::to_string(peer) + " (pid " + std::to_string(*liveness_.pid_of(peer)) +
         " on this host) exited during the collective";
}

}  // namespace ddp::detail::fabric
