#include "comm/gloo/gloo_communicator.h"

#include <csignal>
#include <cstdint>
#include <cstring>

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>

#include "comm/collectives/collectives.h"
#include "comm/collectives/hierarchical.h"
#include "comm/gloo/gloo_device.h"
#include "comm/gloo/gloo_store_bridge.h"
#include "comm/reduce_kernels.h"
#ifdef DDP_WITH_FABRIC
#include "comm/fabric_module.h"
#endif
#include "ddp/env_vars.h"
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::detail {
namespace {

// Up to this many bytes sent per rank (payload x peers), broadcast, allgather and
// reduce-scatter take one round of messages (the direct exchange, and the payload exchange beside
// it) rather than the ring's 2(P-1) steps. The payload exchange keeps two receive slots per peer
// of budget / peers bytes (2 MiB in all).
constexpr std::size_t kDirectExchangeBudget = 1024 * 1024;
// An allreduce takes the ring from this many bytes sent per rank, where its payload would
// still fit the exchange: the ring reduces one block per step where the exchange reduces every
// payload whole. 2 ranks, back to back, the buffer rewritten before each op as DDP's buckets
// are (p50 of 1500 ops, 3 runs each way): 1 MiB took 627-637 us through the ring and 792-842 in
// one round; 768 KiB took 478-506 through the ring and 413-468 in one round
// (bench/results/2026-11-23-gloo-allreduce-crossover.txt). Earlier, on a VM with slower cores,
// one round had won at 1 MiB too (1.39-1.42 vs 1.52-1.62 ms).
constexpr std::size_t kAllreduceRingFromBytes = 1024 * 1024;
// The ring's pipeline unit on gloo's pairs. Every message costs gloo a notification and a
// wake-up of the waiting thread, so chunks are larger than on libfabric. Measured with
// allreduce_bench --interleave, 2 ranks: 64 MiB took 56-65 ms in 4 MiB chunks, 63-76 ms in 2 or
// 16 MiB chunks and 79-87 ms in 1 MiB chunks. A block of a few MiB is still cut into up to four
// chunks of at least 1 MiB: 4 MiB took 5.2 ms that way and 6.0 ms as one chunk per block.
constexpr std::size_t kRingChunkBytes = 4u << 20;
constexpr std::size_t kRingMinChunkBytes = 1u << 20;

// The plan of the direct exchanges of a hierarchical allreduce (allreduce_by_direct_levels).
constexpr std::uint64_t kDirectLevelsPlan = 0x4C564C53;  // "LVLS"

// A per-rank byte budget as the payload size it allows: the rank sends its payload to each peer.
std::size_t per_peer(std::size_t bytes_sent_per_rank, int size) {
  return bytes_sent_per_rank / static_cast<std::size_t>(std::max(size - 1, 1));
}

// The hierarchical levels' settings: the ring's chunks as on the whole mesh; below 512 KiB
// recursive doubling, which sends log2(n) messages to the ring's 2(n-1), each a wake-up on gloo's
// pairs (the threshold of tcp;ofi_rxm, whose messages cost alike; not measured on gloo).
collectives::AlgorithmConfig level_config() {
  collectives::AlgorithmConfig config;
  config.ring_threshold_bytes = 512u << 10;
  config.chunk_bytes = kRingChunkBytes;
  config.min_chunk_bytes = kRingMinChunkBytes;
  return config;
}

collectives::AlgorithmConfig collectives_config(GlooAllreduceAlgorithm forced) {
  collectives::AlgorithmConfig config;
  config.allreduce = forced == GlooAllreduceAlgorithm::kRing
                         ? collectives::AllreduceAlgorithm::kRing
                         : collectives::AllreduceAlgorithm::kAuto;
  // The collectives only see payloads the direct exchange could not carry: always the ring
  // (and the pipelined chain for broadcasts).
  config.ring_threshold_bytes = 0;
  config.chunk_bytes = kRingChunkBytes;
  config.min_chunk_bytes = kRingMinChunkBytes;
  return config;
}

std::string first_line(const std::string& text) {
  auto nl = text.find('\n');
  return nl == std::string::npos ? text : text.substr(0, nl);
}

// gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that died raises SIGPIPE,
// which kills a C++ process before gloo can report the error (Python ignores SIGPIPE, so torch
// never sees this). Ignoring it turns that write into EPIPE and a CommError. A handler the
// program installed itself is left alone.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

// out = ((p(0) + p(1)) + p(2)) + ... for the ranks' payloads p (size >= 2); the last
// combination completes the result (for kAvg, divides too).
template <typename PayloadOf>
void reduce_in_rank_order(const Reduction& reduction, void* out, std::size_t count, int size,
                          PayloadOf&& payload_of) {
  auto combine = [&](const void* a, int peer) {
    if (peer + 1 < size) {
      reduction.combine(out, a, payload_of(peer), count);
    } else {
      reduction.complete(out, a, payload_of(peer), count);
    }
  };
  combine(payload_of(0), 1);
  for (int peer = 2; peer < size; ++peer) combine(out, peer);
}

// A full mesh of gloo pairs over `store`, with errors that say what to check.
std::shared_ptr<gloo::rendezvous::Context> connect_mesh(
    gloo::rendezvous::Store& store, std::shared_ptr<gloo::transport::Device> device, int rank,
    int size, std::chrono::milliseconds timeout) {
  auto mesh = std::make_shared<gloo::rendezvous::Context>(rank, size);
  mesh->setTimeout(timeout);
  try {
    mesh->connectFullMesh(store, device);
  } catch (const ddp::Error& e) {
    throw CommError("connect", rank, -1, std::string("gloo rendezvous failed: ") + e.what());
  } catch (const std::exception& e) {
    throw CommError("connect", rank, -1,
                    "gloo could not connect the full mesh: " + first_line(e.what()) +
                        "; check that every rank is running and that the chosen interface "
                        "(DDP_SOCKET_IFNAME) reaches the others");
  }
  return mesh;
}

}  // namespace

GlooAllreduceAlgorithm gloo_algorithm_from_env() {
  return env::get_choice<GlooAllreduceAlgorithm>("DDP_GLOO_ALGORITHM",
                                                 {{"auto", GlooAllreduceAlgorithm::kAuto},
                                                  {"direct", GlooAllreduceAlgorithm::kDirect},
                                                  {"ring", GlooAllreduceAlgorithm::kRing},
                                                  {"gloo_ring", GlooAllreduceAlgorithm::kGlooRing},
                                                  {"bcube", GlooAllreduceAlgorithm::kBcube}})
      .value_or(GlooAllreduceAlgorithm::kAuto);
}

const char* to_string(GlooAllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case GlooAllreduceAlgorithm::kAuto:
      return "auto";
    case GlooAllreduceAlgorithm::kDirect:
      return "direct";
    case GlooAllreduceAlgorithm::kRing:
      return "ring";
    case GlooAllreduceAlgorithm::kGlooRing:
      return "gloo_ring";
    case GlooAllreduceAlgorithm::kBcube:
      return "bcube";
  }
  return "unknown";
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                   const CommOptions& options)
    : Communicator(rank, size, options),
      direct_budget_(per_peer(kDirectExchangeBudget, size)),
      allreduce_ring_from_(per_peer(kAllreduceRingFromBytes, size)),
      forced_algorithm_(gloo_algorithm_from_env()),
      collectives_config_(collectives_config(forced_algorithm_)) {
  ignore_sigpipe_unless_handled();
  auto device = make_gloo_device(store->endpoint_host());
  GlooStoreBridge bridge(store);
  context_ = connect_mesh(bridge, device, rank, size, options.timeout);
  // The direct exchange gets a mesh of its own: it puts its pairs in synchronous mode.
  gloo::rendezvous::PrefixStore exchange_store("exchange", bridge);
  exchange_mesh_ = connect_mesh(exchange_store, device, rank, size, options.timeout);
  try {
    // Switches the exchange's pairs to synchronous mode and posts the payload exchange's first
    // receives: a peer that already failed and closed its connection shows here, and must be
    // reported as a communication error like any later one.
    // auto and direct behave alike, so they make the same plan.
    const auto planned = forced_algorithm_ == GlooAllreduceAlgorithm::kDirect
                             ? GlooAllreduceAlgorithm::kAuto
                             : forced_algorithm_;
    const std::uint64_t plan =
        collectives_config_.fingerprint() * 31 + static_cast<std::uint64_t>(planned);
    exchange_ = std::make_unique<GlooDirectExchange>(exchange_mesh_, plan);
    if (direct_budget_ > GlooDirectExchange::kMaxPayloadBytes) {
      payloads_ = std::make_unique<GlooPayloadExchange>(context_, direct_budget_);
    }
  } catch (const gloo::Exception& e) {
    throw CommError("connect", rank, -1,
                    first_line(e.what()) +
                        "; a peer exited while the group was forming, see the other ranks' logs");
  }
  transport_ = std::make_unique<GlooPeerTransport>(context_, *exchange_, options.timeout);

  Topology topology = exchange_topology(*store, rank, size);
  auto decision = collectives::decide_hierarchy(topology, collectives::collectives_mode_from_env());
  if (decision.hierarchical && forced_algorithm_ != GlooAllreduceAlgorithm::kAuto) {
    // A forced algorithm is one for the whole job: the collectives stay flat.
    decision = {false, std::string("DDP_GLOO_ALGORITHM=") + to_string(forced_algorithm_), false};
  }
  if (decision.hierarchical) {
    local_ = connect_node_level(store->with_prefix("node" + std::to_string(topology.node())),
                                device, topology);
    cross_ = connect_level(store->with_prefix("local" + std::to_string(topology.local_rank())),
                           device, topology.node(), topology.nodes());
  }
  log::debug("gloo: connected {} ranks, allreduce algorithm {}", size,
             to_string(forced_algorithm_));
  announce_topology(std::move(topology), decision.hierarchical,
                    collectives::describe(decision, local_.provider, cross_.provider),
                    decision.fell_back);
}

GlooCommunicator::Level GlooCommunicator::connect_node_level(
    const std::shared_ptr<Store>& store, const std::shared_ptr<gloo::transport::Device>& device,
    const Topology& topology) {
#ifdef DDP_WITH_FABRIC
  // Every rank of the node loads the same module from the same image, so all take this path or
  // all take gloo's pairs below.
  std::string why;
  try {
    auto node = connect_fabric_node(*store->with_prefix("fabric"), topology.local_rank(),
                                    topology.local_size(), timeout(),
                                    "inside node " + std::to_string(topology.node()));
    Level level;
    level.transport = std::move(node.transport);
    level.config = node.config;
    level.provider = "libfabric " + node.provider;
    return level;
  } catch (const ConfigError& e) {
    why = e.what();
  }
  if (topology.rank() == 0) {
    log::warn("gloo: the ranks of each node use gloo's TCP pairs, not shared memory: {}", why);
  }
#endif
  return connect_level(store, device, topology.local_rank(), topology.local_size());
}

GlooCommunicator::Level GlooCommunicator::connect_level(
    const std::shared_ptr<Store>& store, const std::shared_ptr<gloo::transport::Device>& device,
    int rank, int size) {
  Level level;
  level.config = level_config();
  GlooStoreBridge bridge(store);
  level.mesh = connect_mesh(bridge, device, rank, size, timeout());
  gloo::rendezvous::PrefixStore exchange_store("exchange", bridge);
  level.exchange_mesh = connect_mesh(exchange_store, device, rank, size, timeout());
  try {
    level.exchange =
        std::make_unique<GlooDirectExchange>(level.exchange_mesh, level.config.fingerprint());
  } catch (const gloo::Exception& e) {
    throw CommError("connect", this->rank(), -1,
                    first_line(e.what()) +
                        "; a peer exited while the group was forming, see the other ranks' logs");
  }
  level.transport = std::make_unique<GlooPeerTransport>(level.mesh, *level.exchange, timeout());
  level.provider = "gloo's TCP pairs";
  return level;
}

void GlooCommunicator::allreduce_by_direct_levels(Buffer buffer, ReduceOp op) {
  auto signature = CollectiveSignature::make(CollectiveKind::kAllreduce, buffer.dtype, buffer.count,
                                             static_cast<std::uint32_t>(op), 0);
  // Tells these exchanges from the ones that open the levels' other collectives.
  signature.plan = kDirectLevelsPlan;
  const ReduceOp partial = collectives::partial_reduction(op);
  for (Level* level : {&local_, &cross_}) {
    // The node sums; then each rank's counterparts combine the node sums, where kAvg divides.
    const bool last = level == &cross_;
    if (!level->exchange) {  // libddp_fabric's shared memory, inside the node
      collectives::allreduce(*level->transport, buffer, partial, level->config);
      continue;
    }
    const int ranks = level->mesh->size;
    level->exchange->run(signature, buffer.data, buffer.bytes());
    const Reduction reduction(buffer.dtype, last ? op : partial, last ? size() : ranks);
    reduce_in_rank_order(reduction, buffer.data, buffer.count, ranks,
                         [&](int peer) { return level->exchange->payload_of(peer); });
  }
}

collectives::Hierarchy GlooCommunicator::levels() const {
  return {*local_.transport, *cross_.transport, local_.config, cross_.config};
}

GlooCommunicator::~GlooCommunicator() { shutdown(); }

template <typename Fn>
void GlooCommunicator::guarded(const char* op, Fn&& fn) {
  if (!failure_.empty()) {
    throw CommError(op, rank(), -1,
                    "the gloo mesh is unusable after an earlier failure (" + failure_ +
                        "); recreate the communicator or restart the job");
  }
  try {
    fn();
  } catch (const gloo::IoException& e) {
    failure_ = first_line(e.what());
    // "Timed out" from the asynchronous pairs, "Read timeout"/"Write timeout" from the
    // exchange's synchronous ones.
    if (failure_.find("Timed out") != std::string::npos ||
        failure_.find(" timeout") != std::string::npos) {
      throw TimeoutError(op, rank(), -1,
                         "no progress within the " + std::to_string(timeout().count()) +
                             " ms timeout (" + failure_ +
                             "); a peer is stuck, dead, or issued a different collective");
    }
    throw CommError(op, rank(), -1,
                    failure_ +
                        "; a peer process exited or the network dropped, see the "
                        "other ranks' logs");
  } catch (const gloo::Exception& e) {
    failure_ = first_line(e.what());
    throw CommError(op, rank(), -1, "gloo error: " + failure_);
  }
}

template <typename Fn>
void GlooCommunicator::collective(const char* op, Fn&& fn) {
  try {
    guarded(op, std::forward<Fn>(fn));
  } catch (const std::exception& e) {
    poison(first_line(e.what()));
    throw;
  }
}

void GlooCommunicator::poison(const std::string& cause) {
  if (failure_.empty()) failure_ = cause;
  if (!context_) return;
  // The op's buffers go first, so gloo can no longer write into them; then the pairs, which
  // close with the last owner of their mesh. Their sockets close with a FIN where gloo's own
  // closeConnections would reset them, so a peer normally still reads what this rank sent, its
  // signature first, and reports the same mismatch (unread data on a socket still turns the
  // close into a reset). The receive storage of the transport and of the payload exchange is
  // freed last: closing a pair takes the lock under which gloo's device thread reads into it.
  transport_->abandon();
  if (payloads_) payloads_->abandon();
  for (Level* level : {&local_, &cross_}) {
    if (level->transport) level->transport->abort(cause);
  }
  exchange_.reset();
  exchange_mesh_.reset();
  context_.reset();
  for (Level* level : {&local_, &cross_}) {
    level->exchange.reset();
    level->exchange_mesh.reset();
    level->mesh.reset();
  }
  transport_.reset();
  payloads_.reset();
  local_.transport.reset();
  cross_.transport.reset();
}

void GlooCommunicator::exchange(CollectiveKind kind, const Buffer& buffer, std::uint32_t detail,
                                const void* payload, std::size_t payload_bytes,
                                std::size_t largest_payload_bytes, SendFrom from) {
  // The exchange stamps the sequence number.
  const auto signature = CollectiveSignature::make(kind, buffer.dtype, buffer.count, detail, 0);
  // Chosen from what all ranks know alike: a broadcast's root sends a payload, the others none.
  payload_in_exchange_ = largest_payload_bytes <= GlooDirectExchange::kMaxPayloadBytes;
  if (payload_in_exchange_) {
    exchange_->run(signature, payload, payload_bytes);
    return;
  }
  // Signature and payload travel at once; the signatures are checked before any payload is
  // read, so the ranks agree on the payloads' sizes.
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  exchange_->start(signature, nullptr, 0);
  payloads_->start(payload, payload_bytes, from);
  exchange_->finish();
  payloads_->finish(deadline);
}

const void* GlooCommunicator::exchanged_payload(int peer) const {
  return payload_in_exchange_ ? exchange_->payload_of(peer) : payloads_->payload_of(peer);
}

GlooAllreduceAlgorithm GlooCommunicator::choose_allreduce_algorithm(std::size_t bytes) const {
  switch (forced_algorithm_) {
    case GlooAllreduceAlgorithm::kRing:
    case GlooAllreduceAlgorithm::kGlooRing:
    case GlooAllreduceAlgorithm::kBcube:
      return forced_algorithm_;
    case GlooAllreduceAlgorithm::kAuto:
    case GlooAllreduceAlgorithm::kDirect:
      break;
  }
  return bytes < allreduce_ring_from_ ? GlooAllreduceAlgorithm::kDirect
                                      : GlooAllreduceAlgorithm::kRing;
}

void GlooCommunicator::reduce_exchanged(Buffer out, ReduceOp op) const {
  // Rank order on every rank, so all ranks compute bit-identical results. The first step
  // combines ranks 0 and 1 straight into `out`: one pass over the data instead of a copy and
  // a pass.
  reduce_in_rank_order(Reduction(out.dtype, op, size()), out.data, out.count, size(),
                       [&](int peer) { return exchanged_payload(peer); });
}

void GlooCommunicator::do_allreduce(Buffer buffer, ReduceOp op) {
  if (size() == 1) return;
  if (hierarchical()) {
    return collective("allreduce", [&] {
      if (buffer.bytes() <= GlooDirectExchange::kMaxPayloadBytes) {
        return allreduce_by_direct_levels(buffer, op);
      }
      collectives::allreduce_hierarchical(levels(), buffer, op);
    });
  }
  const auto algorithm = choose_allreduce_algorithm(buffer.bytes());
  if (algorithm == GlooAllreduceAlgorithm::kRing) {
    // Divides for kAvg itself.
    collective("allreduce",
               [&] { collectives::allreduce(*transport_, buffer, op, collectives_config_); });
    return;
  }
  collective("allreduce", [&] {
    if (algorithm == GlooAllreduceAlgorithm::kDirect) {
      // The reduction overwrites this rank's payload; ranks 0 and 1 read theirs in its first
      // step, element by element as it writes, so only theirs can be sent in place.
      exchange(CollectiveKind::kAllreduce, buffer, static_cast<std::uint32_t>(op), buffer.data,
               buffer.bytes(), rank() < 2 ? SendFrom::kCallerMemory : SendFrom::kStagedCopy);
      reduce_exchanged(buffer, op);
    } else {
      exchange(CollectiveKind::kAllreduce, buffer, static_cast<std::uint32_t>(op), nullptr, 0,
               SendFrom::kStagedCopy);
      if (buffer.count > 0) gloo_allreduce(buffer, op, algorithm);
    }
  });
  // gloo's own algorithms only sum.
  const bool divided = algorithm == GlooAllreduceAlgorithm::kDirect;
  if (op == ReduceOp::kAvg && !divided) {
    divide_in_place(buffer.data, buffer.count, buffer.dtype, size());
  }
}

void GlooCommunicator::gloo_allreduce(Buffer buffer, ReduceOp op,
                                      GlooAllreduceAlgorithm algorithm) {
  gloo::AllreduceOptions opts(context_);
  opts.setAlgorithm(algorithm == GlooAllreduceAlgorithm::kBcube
                        ? gloo::AllreduceOptions::Algorithm::BCUBE
                        : gloo::AllreduceOptions::Algorithm::RING);
  // gloo sizes messages from the element size alone; the kernel knows the real type.
  switch (element_size(buffer.dtype)) {
    case 2:
      opts.setOutput(static_cast<std::uint16_t*>(buffer.data), buffer.count);
      break;
    case 4:
      opts.setOutput(static_cast<std::uint32_t*>(buffer.data), buffer.count);
      break;
    default:
      opts.setOutput(static_cast<std::uint64_t*>(buffer.data), buffer.count);
      break;
  }
  opts.setReduceFunction(reduce_kernel(buffer.dtype, op));
  opts.setTimeout(timeout());
  gloo::allreduce(opts);
}

void GlooCommunicator::do_broadcast(Buffer buffer, int root) {
  if (size() == 1) return;
  if (hierarchical()) {
    return collective("broadcast", [&] {
      collectives::broadcast_hierarchical(levels(), buffer, topology().node_of(root),
                                          topology().local_rank_of(root));
    });
  }
  if (buffer.bytes() > direct_budget_) {
    collective("broadcast",
               [&] { collectives::broadcast(*transport_, buffer, root, collectives_config_); });
    return;
  }
  collective("broadcast", [&] {
    const bool sender = rank() == root;
    exchange(CollectiveKind::kBroadcast, buffer, static_cast<std::uint32_t>(root),
             sender ? buffer.data : nullptr, sender ? buffer.bytes() : 0, buffer.bytes(),
             SendFrom::kCallerMemory);  // the root does not change its buffer
    // An empty buffer may have no storage at all: memcpy must not see its null pointer.
    if (!sender && buffer.count > 0) {
      std::memcpy(buffer.data, exchanged_payload(root), buffer.bytes());
    }
  });
}

void GlooCommunicator::do_allgather(Buffer input, Buffer output) {
  if (size() == 1) {
    if (input.count > 0) std::memmove(output.data, input.data, input.bytes());
    return;
  }
  if (input.bytes() > direct_budget_) {
    collective("allgather",
               [&] { collectives::allgather(*transport_, input, output, collectives_config_); });
    return;
  }
  collective("allgather", [&] {
    // The input may lie inside the output, which the copies below overwrite.
    exchange(CollectiveKind::kAllgather, input, 0, input.data, input.bytes(),
             SendFrom::kStagedCopy);
    if (input.count == 0) return;  // empty buffers may have no storage
    for (int peer = 0; peer < size(); ++peer) {
      std::memcpy(static_cast<char*>(output.data) + input.bytes() * peer, exchanged_payload(peer),
                  input.bytes());
    }
  });
}

void GlooCommunicator::do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  if (size() == 1) {
    if (output.count > 0) std::memmove(output.data, input.data, output.bytes());
    return;
  }
  if (input.bytes() > direct_budget_) {
    // Divides for kAvg itself.
    collective("reduce_scatter", [&] {
      collectives::reduce_scatter(*transport_, input, output, op, collectives_config_);
    });
    return;
  }
  collective("reduce_scatter", [&] {
    // The output may lie inside the input, which the reduction below overwrites.
    exchange(CollectiveKind::kReduceScatter, output, static_cast<std::uint32_t>(op), input.data,
             input.bytes(), SendFrom::kStagedCopy);
    const std::size_t offset = output.bytes() * rank();
    reduce_in_rank_order(
        Reduction(output.dtype, op, size()), output.data, output.count, size(),
        [&](int peer) { return static_cast<const char*>(exchanged_payload(peer)) + offset; });
  });
}

void GlooCommunicator::do_barrier() {
  if (size() == 1) return;
  if (hierarchical()) {
    return collective("barrier", [&] { collectives::barrier_hierarchical(levels()); });
  }
  // No rank leaves the exchange before it has heard from every other rank.
  collective("barrier", [&] {
    exchange(CollectiveKind::kBarrier, Buffer(), 0, nullptr, 0, SendFrom::kStagedCopy);
  });
}

}  // namespace ddp::detail
