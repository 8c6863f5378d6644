#include "comm/collectives/op_header.h"

namespace ddp::detail::collectives {

std::string op_header_mismatch(const OpHeader& mine, const OpHeader& theirs, int peer) {
  if (!mine.signature.agrees_with(theirs.signature)) {
    return mismatch_message(mine.signature, theirs.signature, peer);
  }
  if (mine.plan != theirs.plan) {
    return "rank " + std::to_string(peer) + " runs " + describe(mine.signature) +
           " with different DDP_FABRIC_* settings (algorithm, ring threshold or chunk size); set "
           "them alike on every rank";
  }
  return "";
}

}  // namespace ddp::detail::collectives
