#include "comm/gloo/gloo_communicator.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>

#include "comm/gloo/gloo_device.h"
#include "comm/gloo/gloo_store_bridge.h"
#include "comm/reduce_kernels.h"
#include "ddp/env_vars.h"
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::detail {
namespace {

constexpr std::size_t kClassicCacheEntries = 16;
// Below this, the classic ring's single pass with no per-call setup wins (measured in
// bench/allreduce_bench: see README "Allreduce performance").
constexpr std::size_t kSmallMessageBytes = 256 * 1024;

std::string first_line(const std::string& text) {
  auto nl = text.find('\n');
  return nl == std::string::npos ? text : text.substr(0, nl);
}

template <typename T>
const gloo::ReductionFunction<T>* classic_reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return gloo::ReductionFunction<T>::min;
    case ReduceOp::kMax: return gloo::ReductionFunction<T>::max;
    default: return gloo::ReductionFunction<T>::sum;
  }
}

template <typename T>
std::unique_ptr<gloo::Algorithm> make_classic(const std::shared_ptr<gloo::Context>& context,
                                              void* data, std::size_t count, ReduceOp op,
                                              GlooAllreduceAlgorithm algorithm) {
  std::vector<T*> ptrs{static_cast<T*>(data)};
  const int n = static_cast<int>(count);
  if (algorithm == GlooAllreduceAlgorithm::kHalvingDoubling) {
    return std::make_unique<gloo::AllreduceHalvingDoubling<T>>(context, ptrs, n,
                                                               classic_reduction<T>(op));
  }
  return std::make_unique<gloo::AllreduceRing<T>>(context, ptrs, n, classic_reduction<T>(op));
}

bool has_classic_kernel(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
         dtype == DataType::kInt32 || dtype == DataType::kInt64;
}

}  // namespace

GlooAllreduceAlgorithm gloo_algorithm_from_env() {
  const std::string name = env::get("DDP_GLOO_ALGORITHM").value_or("auto");
  if (name == "auto") return GlooAllreduceAlgorithm::kAuto;
  if (name == "ring") return GlooAllreduceAlgorithm::kRing;
  if (name == "bcube") return GlooAllreduceAlgorithm::kBcube;
  if (name == "classic_ring") return GlooAllreduceAlgorithm::kClassicRing;
  if (name == "halving_doubling") return GlooAllreduceAlgorithm::kHalvingDoubling;
  throw ConfigError("DDP_GLOO_ALGORITHM='" + name +
                    "' is not known; use auto, ring, bcube, classic_ring or halving_doubling");
}

const char* to_string(GlooAllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case GlooAllreduceAlgorithm::kAuto: return "auto";
    case GlooAllreduceAlgorithm::kRing: return "ring";
    case GlooAllreduceAlgorithm::kBcube: return "bcube";
    case GlooAllreduceAlgorithm::kClassicRing: return "classic_ring";
    case GlooAllreduceAlgorithm::kHalvingDoubling: return "halving_doubling";
  }
  return "unknown";
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                   const CommOptions& options)
    : Communicator(rank, size, options), forced_algorithm_(gloo_algorithm_from_env()) {
  auto device = make_gloo_device(store->endpoint_host());
  context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context_->setTimeout(options.timeout);
  GlooStoreBridge bridge(store);
  try {
    context_->connectFullMesh(bridge, device);
  } catch (const ddp::Error& e) {
    throw CommError("connect", rank, -1, std::string("gloo rendezvous failed: ") + e.what());
  } catch (const std::exception& e) {
    throw CommError("connect", rank, -1,
                    "gloo could not connect the full mesh: " + first_line(e.what()) +
                        "; check that every rank is running and that the chosen interface "
                        "(DDP_SOCKET_IFNAME) reaches the others");
  }
  log::debug("gloo: connected {} ranks, allreduce algorithm {}", size,
             to_string(forced_algorithm_));
}

GlooCommunicator::~GlooCommunicator() {
  shutdown();
  classic_cache_.clear();
}

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
    const bool timed_out = failure_.find("Timed out") != std::string::npos ||
                           failure_.find("timed out") != std::string::npos;
    if (timed_out) {
      throw TimeoutError(op, rank(), -1,
                         "no progress within the " +
                             std::to_string(timeout().count()) +
                             " ms timeout (" + failure_ +
                             "); a peer is stuck, dead, or issued a different collective");
    }
    throw CommError(op, rank(), -1,
                    failure_ + "; a peer process exited or the network dropped, see the "
                               "other ranks' logs");
  } catch (const gloo::Exception& e) {
    failure_ = first_line(e.what());
    throw CommError(op, rank(), -1, "gloo error: " + failure_);
  }
}

GlooAllreduceAlgorithm GlooCommunicator::choose_allreduce_algorithm(std::size_t bytes,
                                                                    DataType dtype) const {
  GlooAllreduceAlgorithm chosen = forced_algorithm_;
  if (chosen == GlooAllreduceAlgorithm::kAuto) {
    chosen = bytes <= kSmallMessageBytes ? GlooAllreduceAlgorithm::kClassicRing
                                         : GlooAllreduceAlgorithm::kRing;
  }
  const bool classic = chosen == GlooAllreduceAlgorithm::kClassicRing ||
                       chosen == GlooAllreduceAlgorithm::kHalvingDoubling;
  // Classic algorithms only have kernels for native types.
  if (classic && !has_classic_kernel(dtype)) chosen = GlooAllreduceAlgorithm::kRing;
  return chosen;
}

void GlooCommunicator::do_allreduce(Buffer buffer, ReduceOp op) {
  if (size() == 1 || buffer.count == 0) return;
  const auto algorithm = choose_allreduce_algorithm(buffer.bytes(), buffer.dtype);
  guarded("allreduce", [&] {
    if (algorithm == GlooAllreduceAlgorithm::kClassicRing ||
        algorithm == GlooAllreduceAlgorithm::kHalvingDoubling) {
      allreduce_classic(buffer, op, algorithm);
    } else {
      allreduce_unbound(buffer, op, algorithm);
    }
  });
  if (op == ReduceOp::kAvg) divide_in_place(buffer.data, buffer.count, buffer.dtype, size());
}

void GlooCommunicator::allreduce_unbound(Buffer buffer, ReduceOp op,
                                         GlooAllreduceAlgorithm algorithm) {
  gloo::AllreduceOptions opts(context_);
  opts.setAlgorithm(algorithm == GlooAllreduceAlgorithm::kBcube
                        ? gloo::AllreduceOptions::Algorithm::BCUBE
                        : gloo::AllreduceOptions::Algorithm::RING);
  // gloo sizes messages from the element size alone; the kernel knows the real type.
  switch (element_size(buffer.dtype)) {
    case 2: opts.setOutput(static_cast<std::uint16_t*>(buffer.data), buffer.count); break;
    case 4: opts.setOutput(static_cast<std::uint32_t*>(buffer.data), buffer.count); break;
    default: opts.setOutput(static_cast<std::uint64_t*>(buffer.data), buffer.count); break;
  }
  opts.setReduceFunction(reduce_kernel(buffer.dtype, op));
  opts.setTimeout(timeout());
  gloo::allreduce(opts);
}

void GlooCommunicator::allreduce_classic(Buffer buffer, ReduceOp op,
                                         GlooAllreduceAlgorithm algorithm) {
  auto it = classic_cache_.begin();
  for (; it != classic_cache_.end(); ++it) {
    if (it->data == buffer.data && it->count == buffer.count && it->dtype == buffer.dtype &&
        it->op == op && it->algorithm == algorithm) {
      break;
    }
  }
  if (it == classic_cache_.end()) {
    std::unique_ptr<gloo::Algorithm> instance;
    switch (buffer.dtype) {
      case DataType::kFloat32:
        instance = make_classic<float>(context_, buffer.data, buffer.count, op, algorithm);
        break;
      case DataType::kFloat64:
        instance = make_classic<double>(context_, buffer.data, buffer.count, op, algorithm);
        break;
      case DataType::kInt32:
        instance = make_classic<std::int32_t>(context_, buffer.data, buffer.count, op, algorithm);
        break;
      default:
        instance = make_classic<std::int64_t>(context_, buffer.data, buffer.count, op, algorithm);
        break;
    }
    classic_cache_.push_front({buffer.data, buffer.count, buffer.dtype, op, algorithm,
                               std::move(instance)});
    if (classic_cache_.size() > kClassicCacheEntries) classic_cache_.pop_back();
  } else if (it != classic_cache_.begin()) {
    classic_cache_.splice(classic_cache_.begin(), classic_cache_, it);
  }
  classic_cache_.front().instance->run();
}

void GlooCommunicator::do_broadcast(Buffer buffer, int root) {
  if (size() == 1 || buffer.count == 0) return;
  guarded("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setRoot(root);
    opts.setOutput(static_cast<std::uint8_t*>(buffer.data), buffer.bytes());
    opts.setTimeout(timeout());
    gloo::broadcast(opts);
  });
}

void GlooCommunicator::do_allgather(Buffer input, Buffer output) {
  if (input.count == 0) return;
  if (size() == 1) {
    std::memmove(output.data, input.data, input.bytes());
    return;
  }
  guarded("allgather", [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<std::uint8_t*>(input.data), input.bytes());
    opts.setOutput(static_cast<std::uint8_t*>(output.data), output.bytes());
    opts.setTimeout(timeout());
    gloo::allgather(opts);
  });
}

void GlooCommunicator::do_reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  // gloo has no unbound-buffer reduce-scatter: reduce a copy of the whole input with the ring
  // allreduce and keep this rank's block.
  if (output.count == 0) return;
  std::vector<char> scratch(input.bytes());
  std::memcpy(scratch.data(), input.data, input.bytes());
  Buffer whole(scratch.data(), input.count, input.dtype);
  if (size() > 1) {
    guarded("reduce_scatter", [&] { allreduce_unbound(whole, op, GlooAllreduceAlgorithm::kRing); });
  }
  std::memcpy(output.data, scratch.data() + output.bytes() * rank(), output.bytes());
  if (op == ReduceOp::kAvg) divide_in_place(output.data, output.count, output.dtype, size());
}

void GlooCommunicator::do_barrier() {
  if (size() == 1) return;
  guarded("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(timeout());
    gloo::barrier(opts);
  });
}

}  // namespace ddp::detail
