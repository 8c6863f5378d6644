#include "ddp/comm/communicator.h"

#include <string>

#include "comm/op_queue.h"
#include "comm/reduce_kernels.h"
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp {
namespace {

void check_buffer(const char* op, int rank, const Buffer& b, const char* name) {
  if (b.count > 0 && b.data == nullptr) {
    throw CommError(op, rank, -1,
                    std::string(name) + " has " + std::to_string(b.count) +
                        " elements but a null data pointer");
  }
}

void check_same_dtype(const char* op, int rank, const Buffer& in, const Buffer& out) {
  if (in.dtype != out.dtype) {
    throw CommError(op, rank, -1,
                    std::string("input is ") + to_string(in.dtype) + " but output is " +
                        to_string(out.dtype) + "; both buffers must have the same element type");
  }
}

}  // namespace

Communicator::Communicator(int rank, int size, CommOptions options)
    : rank_(rank), size_(size), options_(options), queue_(std::make_unique<detail::OpQueue>()) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw ConfigError("invalid communicator rank " + std::to_string(rank) + " of size " +
                      std::to_string(size) + "; rank must be in [0, size)");
  }
  // Until the backend says otherwise: one node holding every rank.
  topology_ = Topology(std::vector<std::string>(static_cast<std::size_t>(size)), rank);
  if (options_.timeout.count() <= 0) {
    throw ConfigError("communicator timeout must be positive");
  }
  // Chooses the reduction kernels now (DDP_ISA), so that a bad setting fails here, before
  // any peer waits on this rank, rather than inside the first collective.
  detail::reduce_kernels();
}

Communicator::~Communicator() = default;

void Communicator::shutdown() { queue_->stop(); }

void Communicator::announce_topology(Topology topology, bool hierarchical,
                                     const std::string& collectives, bool warn) {
  topology_ = std::move(topology);
  hierarchical_ = hierarchical;
  if (rank_ != 0) return;
  log::logger().log(warn ? spdlog::level::warn : spdlog::level::info,
                    "{}: topology {}; collectives {}", backend_name(), topology_.describe(),
                    collectives);
}

void Communicator::validate_broadcast(const Buffer& buffer, int root) const {
  check_buffer("broadcast", rank_, buffer, "buffer");
  if (root < 0 || root >= size_) {
    throw CommError(
        "broadcast", rank_, -1,
        "root " + std::to_string(root) + " is outside [0, " + std::to_string(size_) + ")");
  }
}

void Communicator::validate_allgather(const Buffer& input, const Buffer& output) const {
  check_buffer("allgather", rank_, input, "input");
  check_buffer("allgather", rank_, output, "output");
  check_same_dtype("allgather", rank_, input, output);
  if (output.count != input.count * size_) {
    throw CommError("allgather", rank_, -1,
                    "output has " + std::to_string(output.count) + " elements, expected size " +
                        std::to_string(size_) + " x input " + std::to_string(input.count));
  }
}

void Communicator::validate_reduce_scatter(const Buffer& input, const Buffer& output) const {
  check_buffer("reduce_scatter", rank_, input, "input");
  check_buffer("reduce_scatter", rank_, output, "output");
  check_same_dtype("reduce_scatter", rank_, input, output);
  if (input.count != output.count * size_) {
    throw CommError("reduce_scatter", rank_, -1,
                    "input has " + std::to_string(input.count) + " elements, expected size " +
                        std::to_string(size_) + " x output " + std::to_string(output.count));
  }
}

void Communicator::allreduce(Buffer buffer, ReduceOp op) {
  check_buffer("allreduce", rank_, buffer, "buffer");
  queue_->run([=] { do_allreduce(buffer, op); });
}

void Communicator::broadcast(Buffer buffer, int root) {
  validate_broadcast(buffer, root);
  queue_->run([=] { do_broadcast(buffer, root); });
}

void Communicator::allgather(Buffer input, Buffer output) {
  validate_allgather(input, output);
  queue_->run([=] { do_allgather(input, output); });
}

void Communicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  validate_reduce_scatter(input, output);
  queue_->run([=] { do_reduce_scatter(input, output, op); });
}

void Communicator::barrier() {
  queue_->run([=] { do_barrier(); });
}

Work Communicator::allreduce_async(Buffer buffer, ReduceOp op) {
  check_buffer("allreduce", rank_, buffer, "buffer");
  return queue_->submit([=] { do_allreduce(buffer, op); });
}

Work Communicator::broadcast_async(Buffer buffer, int root) {
  validate_broadcast(buffer, root);
  return queue_->submit([=] { do_broadcast(buffer, root); });
}

Work Communicator::allgather_async(Buffer input, Buffer output) {
  validate_allgather(input, output);
  return queue_->submit([=] { do_allgather(input, output); });
}

Work Communicator::reduce_scatter_async(Buffer input, Buffer output, ReduceOp op) {
  validate_reduce_scatter(input, output);
  return queue_->submit([=] { do_reduce_scatter(input, output, op); });
}

Work Communicator::barrier_async() {
  return queue_->submit([=] { do_barrier(); });
}

}  // namespace ddp
