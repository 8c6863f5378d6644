#include "comm/collectives/hierarchical.h"

#include <cstring>
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
  const auto layout =
      ring_layout(buffer.count, buffer.dtype, l, h.local_config, local.max_message_bytes());
  {
    OpScope scope(local, CollectiveKind::kAllreduce, buffer, h.local_config, detail,
                  kLocalReduceScatter);
    local.expose(buffer.data, buffer.bytes());
    char* slots = static_cast<char*>(local.scratch(layout.slot_bytes(h.local_config)));
    const Reduction sum(buffer.dtype, partial_reduction(op), l);
    run_ring(local, buffer, RingPhases::kReduceScatter, &sum, layout, h.local_config, slots);
    scope.finish();
  }
  // The ring left block local_rank reduced over this node on this rank.
  const Piece piece =
      partition(buffer.count, static_cast<std::size_t>(l), static_cast<std::size_t>(local.rank()));
  Buffer slice(static_cast<char*>(buffer.data) + piece.offset * element_size(buffer.dtype),
               piece.count, buffer.dtype);
  {
    OpScope scope(cross, CollectiveKind::kAllreduce, slice, h.cross_config, detail, kCrossSlice);
    allreduce_in_op(cross, slice, Reduction(buffer.dtype, op, world), h.cross_config);
    scope.finish();
  }
  OpScope scope(local, CollectiveKind::kAllreduce, buffer, h.local_config, detail, kLocalAllgather);
  local.expose(buffer.data, buffer.bytes());
  run_ring(local, buffer, RingPhases::kAllgather, nullptr, layout, h.local_config, nullptr);
  scope.finish();
}

bool gathers_hierarchically(const Hierarchy& h, std::size_t output_bytes) {
  return output_bytes >= h.cross_config.slice_from_bytes;
}

void allgather_hierarchical(const Hierarchy& h, const Topology& topology, Buffer input,
                            Buffer output) {
  const std::size_t nodes = static_cast<std::size_t>(h.cross.size());
  const std::size_t block = input.bytes();
  // This rank's row is [local rank][node] order's row local_rank: its counterparts' inputs.
  std::vector<char> rows(output.bytes());
  Buffer row(rows.data() + static_cast<std::size_t>(h.local.rank()) * nodes * block,
             input.count * nodes, input.dtype);
  {
    OpScope scope(h.cross, CollectiveKind::kAllgather, input, h.cross_config, 0, kCrossAllgather);
    allgather_in_op(h.cross, input, row, h.cross_config);
    scope.finish();
  }
  {
    OpScope scope(h.local, CollectiveKind::kAllgather, row, h.local_config, 0, kLocalAllgatherRows);
    allgather_in_op(h.local, row, Buffer(rows.data(), output.count, output.dtype), h.local_config);
    scope.finish();
  }
  permute(topology, rows.data(), static_cast<char*>(output.data), block, false);
}

void reduce_scatter_hierarchical(const Hierarchy& h, const Topology& topology, Buffer input,
                                 Buffer output, ReduceOp op) {
  const std::size_t nodes = static_cast<std::size_t>(h.cross.size());
  const int world = h.local.size() * h.cross.size();
  const auto detail = static_cast<std::uint32_t>(op);
  std::vector<char> rows(input.bytes());
  permute(topology, static_cast<const char*>(input.data), rows.data(), output.bytes(), true);
  // After the node's reduce-scatter this rank holds its row: the blocks of its counterparts on
  // every node, summed over this node.
  std::vector<char> mine(nodes * output.bytes());
  Buffer row(mine.data(), output.count * nodes, output.dtype);
  {
    OpScope scope(h.local, CollectiveKind::kReduceScatter, row, h.local_config, detail,
                  kLocalReduceScatterRows);
    reduce_scatter_in_op(h.local, Buffer(rows.data(), input.count, input.dtype), row,
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
