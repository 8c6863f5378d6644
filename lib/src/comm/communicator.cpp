#include "ddp/comm/communicator.h"

#include <array>
#include <atomic>
#include <string>

#include "comm/abort_notice.h"
#include "comm/op_queue.h"
#include "comm/reduce_kernels.h"
#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/settings.h"

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

// Whether a communicator of this process keeps its recorder in DDP_FLIGHT_RECORDER_FILE: the
// first one does (the process group's, which ddprun's agent reads); later ones keep theirs in
// private memory rather than replace the file under it.
std::atomic<bool> g_recorder_file_taken{false};

std::uint64_t dtype_code(DataType t) {
  static_assert(static_cast<int>(DataType::kInt64) == 5, "a new DataType needs its code here");
  static const std::array<std::uint64_t, 6> codes = [] {
    std::array<std::uint64_t, 6> c{};
    for (std::size_t i = 0; i < c.size(); ++i) {
      c[i] = flight::name_code(to_string(static_cast<DataType>(i)));
    }
    return c;
  }();
  return codes[static_cast<std::size_t>(t)];
}

flight::Recorder::Op op_info(flight::OpKind kind, const Buffer& b) {
  return {kind, dtype_code(b.dtype), b.count, b.bytes(), flight::OpLabel::current()};
}

flight::Recorder::Op barrier_info() {
  return {flight::OpKind::kBarrier, 0, 0, 0, flight::OpLabel::current()};
}

// One op's record on the thread that runs it: failed unless the op returns.
class RecordedSpan {
 public:
  RecordedSpan(flight::Recorder& recorder, const flight::Recorder::Op& op)
      : recorder_(recorder), seq_(recorder.begin(op)) {}
  ~RecordedSpan() { recorder_.end(seq_, ok_); }
  RecordedSpan(const RecordedSpan&) = delete;
  RecordedSpan& operator=(const RecordedSpan&) = delete;
  void succeeded() { ok_ = true; }

 private:
  flight::Recorder& recorder_;
  std::uint64_t seq_;
  bool ok_ = false;
};

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
  const auto entries = settings::integer_or_default(settings::kFlightRecorderEntries);
  std::string file;
  if (auto path = settings::text(settings::kFlightRecorderFile)) {
    bool taken = false;
    if (g_recorder_file_taken.compare_exchange_strong(taken, true)) {
      file = *path;
      owns_recorder_file_ = true;
    }
  }
  try {
    recorder_ =
        std::make_unique<flight::Recorder>(static_cast<std::size_t>(entries), file, rank, size);
  } catch (...) {
    if (owns_recorder_file_) g_recorder_file_taken = false;
    throw;
  }
  recorder_->set_thresholds(
      std::chrono::seconds(settings::integer_or_default(settings::kHangWarnSec)), options_.timeout);
  detail::AbortNotice::watch_file_from_environment(rank);
  // Chooses the reduction kernels now (DDP_ISA), so that a bad setting fails here, before
  // any peer waits on this rank, rather than inside the first collective.
  detail::reduce_kernels();
}

Communicator::~Communicator() {
  queue_.reset();  // no op runs against the recorder once it is gone
  if (owns_recorder_file_) g_recorder_file_taken = false;
}

void Communicator::set_hang_warning(std::chrono::seconds after) {
  recorder_->set_thresholds(after, options_.timeout);
}

template <typename Op>
void Communicator::run_recorded(flight::OpKind kind, const Buffer& buffer, Op&& op) {
  const auto info = kind == flight::OpKind::kBarrier ? barrier_info() : op_info(kind, buffer);
  queue_->run([&, info] {
    RecordedSpan span(*recorder_, info);
    op();
    span.succeeded();
  });
}

template <typename Op>
Work Communicator::submit_recorded(flight::OpKind kind, const Buffer& buffer, Op&& op) {
  const auto info = kind == flight::OpKind::kBarrier ? barrier_info() : op_info(kind, buffer);
  return queue_->submit([this, info, op = std::forward<Op>(op)] {
    RecordedSpan span(*recorder_, info);
    op();
    span.succeeded();
  });
}

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
  run_recorded(flight::OpKind::kAllreduce, buffer, [=] { do_allreduce(buffer, op); });
}

void Communicator::broadcast(Buffer buffer, int root) {
  validate_broadcast(buffer, root);
  run_recorded(flight::OpKind::kBroadcast, buffer, [=] { do_broadcast(buffer, root); });
}

void Communicator::allgather(Buffer input, Buffer output) {
  validate_allgather(input, output);
  run_recorded(flight::OpKind::kAllgather, output, [=] { do_allgather(input, output); });
}

void Communicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  validate_reduce_scatter(input, output);
  run_recorded(flight::OpKind::kReduceScatter, input,
               [=] { do_reduce_scatter(input, output, op); });
}

void Communicator::barrier() {
  run_recorded(flight::OpKind::kBarrier, Buffer{}, [=] { do_barrier(); });
}

Work Communicator::allreduce_async(Buffer buffer, ReduceOp op) {
  check_buffer("allreduce", rank_, buffer, "buffer");
  return submit_recorded(flight::OpKind::kAllreduce, buffer, [=] { do_allreduce(buffer, op); });
}

Work Communicator::broadcast_async(Buffer buffer, int root) {
  validate_broadcast(buffer, root);
  return submit_recorded(flight::OpKind::kBroadcast, buffer, [=] { do_broadcast(buffer, root); });
}

Work Communicator::allgather_async(Buffer input, Buffer output) {
  validate_allgather(input, output);
  return submit_recorded(flight::OpKind::kAllgather, output, [=] { do_allgather(input, output); });
}

Work Communicator::reduce_scatter_async(Buffer input, Buffer output, ReduceOp op) {
  validate_reduce_scatter(input, output);
  return submit_recorded(flight::OpKind::kReduceScatter, input,
                         [=] { do_reduce_scatter(input, output, op); });
}

Work Communicator::barrier_async() {
  return submit_recorded(flight::OpKind::kBarrier, Buffer{}, [=] { do_barrier(); });
}

}  // namespace ddp
