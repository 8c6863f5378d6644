// Stands in for a libddp_fabric left from other sources: it exports the entry point under a
// name this build's libddp does not look for.
#include <memory>

namespace ddp {
class Communicator;
class Store;
struct CommOptions;
}  // namespace ddp

extern "C" ddp::Communicator* ddp_fabric_create_communicator(const std::shared_ptr<ddp::Store>&,
                                                             int, int, const ddp::CommOptions&) {
  return nullptr;
}
