#include "comm/collectives/hierarchical.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/collectives/collectives.h"
#include "comm/collectives/op_scope.h"
#include "comm/collectives/partition.h"
#include "comm/collectives/ring.h"
#include "comm/reduce_kernels.h"
#include "ddp/settings.h"

namespace ddp::detail::collectives {
namespace {

// The steps of each composition, for OpScope: ranks that run different steps disagree.
enum Stage : std::uint64_t {
  kLocalReduceScatter = 1,
  kCrossSlice,
  kLocalAllgather,
  kLocalWhole,
  kCrossWhole,
  kCrossBroadcast,
  kLocalBroadcast,
  kLocalBarrier,
  kCrossBarrier,
  kCrossAllgather,
  kLocalAllgatherRows,
  kLocalReduceScatterRows,
  kCrossReduceScatter,
};

// Copies between the job's rank order and the two-level one, [local rank][node], in blocks of
// `block` bytes: to_rows moves job order into rows, otherwise rows into job order.
void permute(const Topology& topology, const char* from, char* to, std::size_t block,
             bool to_rows) {
  if (block == 0) return;
  const int nodes = topology.nodes();
  for (int n = 0; n < nodes; ++n) {
    const std::vector<int>& members = topology.members(n);
    for (std::size_t l = 0; l < members.size(); ++l) {
      const std::size_t row = (l * static_cast<std::size_t>(nodes) + n) * block;
      const std::size_t job = static_cast<std::size_t>(members[l]) * block;
      std::memcpy(to + (to_rows ? row : job), from + (to_rows ? job : row), block);
    }
  }
}

}  // namespace

CollectivesMode collectives_mode(const CommOptions& options) {
  if (options.collectives) return *options.collectives;
  return settings::choice<CollectivesMode>(settings::kCollectives,
                                           {{"auto", CollectivesMode::kAuto},
                                            {"flat", CollectivesMode::kFlat},
                                            {"hierarchical", CollectivesMode::kHierarchical}})
      .value_or(CollectivesMode::kAuto);
}

HierarchyDecision decide_hierarchy(const Topology& topology, CollectivesMode mode) {
  const bool asked = mode == CollectivesMode::kHierarchical;
  if (mode == CollectivesMode::kFlat) return {false, "DDP_COLLECTIVES=flat", false};
  if (topology.nodes() == 1) return {false, "one node", asked};
  if (!topology.uniform()) {
    std::string sizes;
    for (int n = 0; n < topology.nodes(); ++n) {
      sizes += (n == 0 ? "" : ", ") + std::to_string(topology.local_size_of(n));
    }
    return {false, "uneven nodes (ranks per node: " + sizes + ")", true};
  }
  if (topology.local_size() == 1) return {false, "one rank per node", asked};
  return {true, topology.describe(), false};
}

std::string describe(const HierarchyDecision& decision, const std::string& inside,
                     const std::string& between) {
  if (!decision.hierarchical) return "flat (" + decision.reason + ")";
  return "hierarchical (" + inside + " inside nodes, " + between + " between them)";
}

namespace {

// The three steps of a sliced allreduce, for one piece of the buffer.
// Reduces `piece` over the node; returns this rank's slice of it (the ring's block local_rank).
Buffer reduce_scatter_in_node(const Hierarchy& h, Buffer piece, ReduceOp op) {
  PeerTransport& local = h.local;
  const int l = local.size();
  const auto layout =
      ring_layout(piece.count, piece.dtype, l, h.local_config, local.max_message_bytes());
  OpScope scope(local, CollectiveKind::kAllreduce, piece, h.local_config,
                static_cast<std::uint32_t>(op), kLocalReduceScatter);
  local.expose(piece.data, piece.bytes());
  char* slots = static_cast<char*>(local.scratch(layout.slot_bytes(h.local_config)));
  const Reduction sum(piece.dtype, partial_reduction(op), l);
  run_ring(local, piece, RingPhases::kReduceScatter, &sum, layout, h.local_config, slots);
  scope.finish();
  const Piece mine =
      partition(piece.count, static_cast<std::size_t>(l), static_cast<std::size_t>(local.rank()));
  return Buffer(static_cast<char*>(piece.data) + mine.offset * element_size(piece.dtype),
                mine.count, piece.dtype);
}

void allreduce_across_nodes(const Hierarchy& h, Buffer slice, ReduceOp op) {
  OpScope scope(h.cross, CollectiveKind::kAllreduce, slice, h.cross_config,
                static_cast<std::uint32_t>(op), kCrossSlice);
  allreduce_in_op(h.cross, slice, Reduction(slice.dtype, op, h.local.size() * h.cross.size()),
                  h.cross_config);
  scope.finish();
}

void allgather_in_node(const Hierarchy& h, Buffer piece, ReduceOp op) {
  PeerTransport& local = h.local;
  const auto layout = ring_layout(piece.count, piece.dtype, local.size(), h.local_config,
                                  local.max_message_bytes());
  OpScope scope(local, CollectiveKind::kAllreduce, piece, h.local_config,
                static_cast<std::uint32_t>(op), kLocalAllgather);
  local.expose(piece.data, piece.bytes());
  run_ring(local, piece, RingPhases::kAllgather, nullptr, layout, h.local_config, nullptr);
  scope.finish();
}

// The steps across nodes of a pipelined allreduce, on a thread of their own: the caller submits
// each piece's slice when the node has reduced it and waits for it before the node allgathers
// it. Only this thread touches the cross transport while it runs, only the caller the local one.
class AcrossNodes {
 public:
  AcrossNodes(const Hierarchy& h, ReduceOp op) : h_(h), op_(op), thread_([this] { run(); }) {}
  // Joins after the piece being sent, if any; pieces not yet started are dropped (the caller is
  // failing, and the transports' abort tells the other nodes).
  ~AcrossNodes() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }
  AcrossNodes(const AcrossNodes&) = delete;
  AcrossNodes& operator=(const AcrossNodes&) = delete;

  void submit(Buffer slice) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(slice);
    }
    changed_.notify_all();
  }
  // Until the piece'th submitted slice is allreduced; rethrows the step's error.
  void wait(std::size_t piece) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_ > piece || error_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run() {
    for (std::size_t next = 0;; ++next) {
      Buffer slice;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || queue_.size() > next; });
        if (stopping_) return;
        slice = queue_[next];
      }
      try {
        allreduce_across_nodes(h_, slice, op_);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = std::current_exception();
        changed_.notify_all();
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        done_ = next + 1;
      }
      changed_.notify_all();
    }
  }

  const Hierarchy& h_;
  const ReduceOp op_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Buffer> queue_;
  std::size_t done_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace

std::size_t pipeline_pieces(const AlgorithmConfig& cross_config, std::size_t bytes, int nodes) {
  if (cross_config.piece_bytes == 0 || nodes < 2) return 1;
  const std::size_t piece = cross_config.piece_bytes * static_cast<std::size_t>(nodes - 1);
  return std::clamp<std::size_t>(bytes / piece, 1, AlgorithmConfig::kMaxPieces);
}

void allreduce_hierarchical(const Hierarchy& h, Buffer buffer, ReduceOp op) {
  PeerTransport& local = h.local;
  PeerTransport& cross = h.cross;
  const int l = local.size();
  const int world = l * cross.size();
  const auto detail = static_cast<std::uint32_t>(op);
  // The split pays from the cross level's slice_from_bytes: below it the two extra steps cost
  // more than sending the whole buffer across.
  if (buffer.bytes() < h.cross_config.slice_from_bytes ||
      buffer.count < static_cast<std::size_t>(l)) {
    {
      OpScope scope(local, CollectiveKind::kAllreduce, buffer, h.local_config, detail, kLocalWhole);
      allreduce_in_op(local, buffer, Reduction(buffer.dtype, partial_reduction(op), l),
                      h.local_config);
      scope.finish();
    }
    OpScope scope(cross, CollectiveKind::kAllreduce, buffer, h.cross_config, detail, kCrossWhole);
    allreduce_in_op(cross, buffer, Reduction(buffer.dtype, op, world), h.cross_config);
    scope.finish();
    return;
  }
  // Every piece keeps at least one element per local rank.
  const std::size_t pieces = std::min(pipeline_pieces(h.cross_config, buffer.bytes(), cross.size()),
                                      buffer.count / static_cast<std::size_t>(l));
  auto piece = [&](std::size_t k) {
    const Piece p = partition(buffer.count, pieces, k);
    return Buffer(static_cast<char*>(buffer.data) + p.offset * element_size(buffer.dtype), p.count,
                  buffer.dtype);
  };
  if (pieces == 1) {
    allreduce_across_nodes(h, reduce_scatter_in_node(h, buffer, op), op);
    return allgather_in_node(h, buffer, op);
  }
  // Piece k crosses nodes while the node reduce-scatters piece k+1 and allgathers piece k-1.
  AcrossNodes across(h, op);
  for (std::size_t k = 0; k < pieces; ++k) {
    across.submit(reduce_scatter_in_node(h, piece(k), op));
    if (k == 0) continue;
    across.wait(k - 1);
    allgather_in_node(h, piece(k - 1), op);
  }
  across.wait(pieces - 1);
  allgather_in_node(h, piece(pieces - 1), op);
}

bool gathers_hierarchically(const Hierarchy& h, std::size_t output_bytes) {
  return output_bytes >= h.cross_config.slice_from_bytes;
}

void allgather_hierarchical(const Hierarchy& h, const Topology& topology, Buffer input,
                            Buffer output) {
  const std::size_t nodes = static_cast<std::size_t>(h.cross.size());
  const std::size_t block = input.bytes();
  // This rank's row is [local rank][node] order's row local_rank: its counterparts' inputs.
  // Every byte is written before it is read: no zeroing.
  const std::unique_ptr<char[]> rows(new char[output.bytes()]);
  Buffer row(rows.get() + static_cast<std::size_t>(h.local.rank()) * nodes * block,
             input.count * nodes, input.dtype);
  {
    OpScope scope(h.cross, CollectiveKind::kAllgather, input, h.cross_config, 0, kCrossAllgather);
    allgather_in_op(h.cross, input, row, h.cross_config);
    scope.finish();
  }
  {
    OpScope scope(h.local, CollectiveKind::kAllgather, row, h.local_config, 0, kLocalAllgatherRows);
    allgather_in_op(h.local, row, Buffer(rows.get(), output.count, output.dtype), h.local_config);
    scope.finish();
  }
  permute(topology, rows.get(), static_cast<char*>(output.data), block, false);
}

void reduce_scatter_hierarchical(const Hierarchy& h, const Topology& topology, Buffer input,
                                 Buffer output, ReduceOp op) {
  const std::size_t nodes = static_cast<std::size_t>(h.cross.size());
  const int world = h.local.size() * h.cross.size();
  const auto detail = static_cast<std::uint32_t>(op);
  const std::unique_ptr<char[]> rows(new char[input.bytes()]);
  permute(topology, static_cast<const char*>(input.data), rows.get(), output.bytes(), true);
  // The node's reduce-scatter leaves this rank its row, in place: the blocks of its counterparts
  // on every node, summed over this node (an output inside the input is allowed).
  Buffer row(rows.get() + static_cast<std::size_t>(h.local.rank()) * nodes * output.bytes(),
             output.count * nodes, output.dtype);
  {
    OpScope scope(h.local, CollectiveKind::kReduceScatter, row, h.local_config, detail,
                  kLocalReduceScatterRows);
    reduce_scatter_in_op(h.local, Buffer(rows.get(), input.count, input.dtype), row,
                         Reduction(input.dtype, partial_reduction(op), h.local.size()),
                         h.local_config);
    scope.finish();
  }
  OpScope scope(h.cross, CollectiveKind::kReduceScatter, output, h.cross_config, detail,
                kCrossReduceScatter);
  reduce_scatter_in_op(h.cross, row, output, Reduction(input.dtype, op, world), h.cross_config);
  scope.finish();
}

void broadcast_hierarchical(const Hierarchy& h, Buffer buffer, int root_node, int root_local_rank) {
  const auto root = static_cast<std::uint32_t>(root_node * h.local.size() + root_local_rank);
  if (h.local.rank() == root_local_rank) {
    OpScope scope(h.cross, CollectiveKind::kBroadcast, buffer, h.cross_config, root,
                  kCrossBroadcast);
    broadcast_in_op(h.cross, buffer, root_node, h.cross_config);
    scope.finish();
  }
  OpScope scope(h.local, CollectiveKind::kBroadcast, buffer, h.local_config, root, kLocalBroadcast);
  broadcast_in_op(h.local, buffer, root_local_rank, h.local_config);
  scope.finish();
}

void barrier_hierarchical(const Hierarchy& h) {
  {
    OpScope scope(h.local, CollectiveKind::kBarrier, Buffer(), h.local_config, 0, kLocalBarrier);
    barrier_in_op(h.local, h.local_config);
    scope.finish();
  }
  OpScope scope(h.cross, CollectiveKind::kBarrier, Buffer(), h.cross_config, 0, kCrossBarrier);
  barrier_in_op(h.cross, h.cross_config);
  scope.finish();
}

}  // namespace ddp::detail::collectives
