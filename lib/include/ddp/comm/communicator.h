#pragma once
// The collective-communication interface every backend implements (Gloo over TCP, libfabric).
// Blocking calls and *_async calls that return a Work handle. Operations run in the order they
// are issued on each rank, and every rank must issue the same sequence with matching sizes.
// Failures (dead peer, mismatched sizes, timeout) throw CommError naming the op and the peer.
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "ddp/comm/topology.h"
#include "ddp/comm/types.h"
#include "ddp/comm/work.h"
#include "ddp/flight_recorder.h"

namespace ddp {

namespace detail {
class OpQueue;
}

// The allreduce algorithm (DDP_ALGORITHM). kDirect takes one round wherever the transport's
// round carries the payload, kAuto's choice elsewhere.
enum class AllreduceAlgorithm { kAuto, kDirect, kRing, kRecursiveDoubling };
// The order in which the ring takes its incoming chunks (DDP_RING_ORDER); ranks must agree.
enum class RingOrder { kWavefront, kStep };
// Hierarchical (inside each node, then across nodes) or flat collectives (DDP_COLLECTIVES).
enum class CollectivesMode { kAuto, kFlat, kHierarchical };

// How a communicator connects and runs its collectives. Every field but the timeout left unset
// takes its DDP_* setting from the environment (ddp/settings.h, where each is documented), and,
// where that is unset too, the transport's default; a field set here wins over the environment.
// Values are checked against the same ranges as the settings (ConfigError).
struct CommOptions {
  // Bound on every collective; a peer that does not take part within it fails the op. The fabric
  // backend counts it from the op's first poll that finds nothing complete (an op whose messages
  // are all there when polled reads no clock). init_process_group takes it from DDP_TIMEOUT_SEC.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);

  std::optional<CollectivesMode> collectives;        // DDP_COLLECTIVES
  std::optional<AllreduceAlgorithm> algorithm;       // DDP_ALGORITHM
  std::optional<std::size_t> direct_bytes;           // DDP_DIRECT_BYTES
  std::optional<std::size_t> ring_threshold_bytes;   // DDP_RING_THRESHOLD
  std::optional<std::size_t> chunk_bytes;            // DDP_CHUNK_BYTES
  std::optional<int> pipeline_depth;                 // DDP_PIPELINE_DEPTH
  std::optional<RingOrder> ring_order;               // DDP_RING_ORDER
  std::optional<std::size_t> hierarchy_slice_bytes;  // DDP_HIERARCHY_SLICE_BYTES
  std::optional<std::size_t> hierarchy_piece_bytes;  // DDP_HIERARCHY_PIECE_BYTES
  std::optional<std::string> socket_ifname;          // DDP_SOCKET_IFNAME
  std::optional<std::string> fabric_provider;        // DDP_FABRIC_PROVIDER
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  virtual const char* backend_name() const = 0;
  // Which ranks share a node, as the ranks found out when they connected.
  const Topology& topology() const { return topology_; }
  // Whether allreduce, broadcast and barrier run in two levels: inside each node, then between
  // nodes (DDP_COLLECTIVES, and the topology: several nodes with as many ranks each, more than
  // one). allgather and reduce_scatter stay flat.
  bool hierarchical() const { return hierarchical_; }

  // The last collectives this communicator ran (ddp/flight_recorder.h): DDP_FLIGHT_RECORDER_ENTRIES
  // of them, in DDP_FLIGHT_RECORDER_FILE for the first communicator of a process where that is
  // set (ddprun sets it), else in private memory.
  const flight::Recorder& flight_recorder() const { return *recorder_; }
  // After how long a collective's wait makes ddprun diagnose a hang (DDP_HANG_WARN_SEC; 0: never).
  void set_hang_warning(std::chrono::seconds after);
  // Precise start and end times in the flight recorder (a timeline's; the trainer's --trace-steps
  // turns them on for the traced steps), rather than the timer tick's.
  void set_precise_op_times(bool on) { recorder_->set_precise_stamps(on); }

  // In place: every rank ends with the reduction of all ranks' buffers.
  void allreduce(Buffer buffer, ReduceOp op = ReduceOp::kSum);
  // Every rank ends with the root's buffer.
  void broadcast(Buffer buffer, int root);
  // output.count == size() * input.count; rank r's input lands at output[r * input.count].
  void allgather(Buffer input, Buffer output);
  // input.count == size() * output.count; rank r gets the reduction of block r.
  void reduce_scatter(Buffer input, Buffer output, ReduceOp op = ReduceOp::kSum);
  void barrier();

  Work allreduce_async(Buffer buffer, ReduceOp op = ReduceOp::kSum);
  Work broadcast_async(Buffer buffer, int root);
  Work allgather_async(Buffer input, Buffer output);
  Work reduce_scatter_async(Buffer input, Buffer output, ReduceOp op = ReduceOp::kSum);
  Work barrier_async();

 protected:
  Communicator(int rank, int size, CommOptions options);

  // Backends implement the blocking algorithms; this base class validates arguments, orders
  // the calls and runs async ones on one communication thread (inline when it is idle).
  virtual void do_allreduce(Buffer buffer, ReduceOp op) = 0;
  virtual void do_broadcast(Buffer buffer, int root) = 0;
  virtual void do_allgather(Buffer input, Buffer output) = 0;
  virtual void do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) = 0;
  virtual void do_barrier() = 0;

  const CommOptions& options() const { return options_; }

  // Backends call this once connected. Rank 0 logs the topology and `collectives` (how they
  // run), at warning level when `warn` (hierarchical collectives were asked for or would have
  // paid, and cannot run).
  void announce_topology(Topology topology, bool hierarchical, const std::string& collectives,
                         bool warn);

  // Backends must call this at the start of their destructor, so that no queued op runs
  // against a half-destroyed backend.
  void shutdown();

 private:
  void validate_broadcast(const Buffer& buffer, int root) const;
  void validate_allgather(const Buffer& input, const Buffer& output) const;
  void validate_reduce_scatter(const Buffer& input, const Buffer& output) const;
  // Runs `op` (a do_* call) inline or queued, recorded in the flight recorder as it executes.
  template <typename Op>
  void run_recorded(flight::OpKind kind, const Buffer& buffer, Op&& op);
  template <typename Op>
  Work submit_recorded(flight::OpKind kind, const Buffer& buffer, Op&& op);

  int rank_;
  int size_;
  CommOptions options_;
  Topology topology_;
  bool hierarchical_ = false;
  std::unique_ptr<flight::Recorder> recorder_;
  bool owns_recorder_file_ = false;
  std::unique_ptr<detail::OpQueue> queue_;
};

}  // namespace ddp
