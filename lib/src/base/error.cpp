#include "ddp/error.h"

#include <utility>

namespace ddp {
namespace {

std::string describe_comm_failure(const std::string& op, int rank, int peer,
                                  const std::string& cause) {
  std::string text = op + " failed on rank " + std::to_string(rank);
  if (peer >= 0) text += " (peer rank " + std::to_string(peer) + ")";
  return text + ": " + cause;
}

}  // namespace

CommError::CommError(std::string op, int rank, int peer, const std::string& cause)
    : Error(describe_comm_failure(op, rank, peer, cause)),
      op_(std::move(op)),
      rank_(rank),
      peer_(peer) {}

DataError::DataError(std::string file, const std::string& cause)
    : Error(file + ": " + cause), file_(std::move(file)) {}

}  // namespace ddp
