#include "comm/collectives/algorithm_config.h"

#include <cstdint>
#include <string>

#include "ddp/env_vars.h"
#include "ddp/error.h"

namespace ddp::detail::collectives {
namespace {

// The per-backend variables of earlier releases, and what replaced each.
struct Renamed {
  const char* old_name;
  const char* new_name;
};
constexpr Renamed kRenamed[] = {
    {"DDP_GLOO_ALGORITHM",
     "DDP_ALGORITHM=auto|direct|ring|recursive_doubling (gloo's own "
     "gloo_ring and bcube are gone; bench/ keeps them as references)"},
    {"DDP_FABRIC_ALGORITHM", "DDP_ALGORITHM"},
    {"DDP_FABRIC_RING_THRESHOLD", "DDP_RING_THRESHOLD"},
    {"DDP_FABRIC_CHUNK_BYTES", "DDP_CHUNK_BYTES"},
    {"DDP_FABRIC_PIPELINE_DEPTH", "DDP_PIPELINE_DEPTH"},
    {"DDP_FABRIC_RING_ORDER", "DDP_RING_ORDER"},
};

}  // namespace

const char* to_string(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kAuto:
      return "auto";
    case AllreduceAlgorithm::kDirect:
      return "direct";
    case AllreduceAlgorithm::kRing:
      return "ring";
    case AllreduceAlgorithm::kRecursiveDoubling:
      return "recursive_doubling";
  }
  return "unknown";
}

std::uint64_t AlgorithmConfig::fingerprint() const {
  std::uint64_t hash = static_cast<std::uint64_t>(allreduce);
  for (std::uint64_t value :
       {std::uint64_t{direct_bytes}, std::uint64_t{ring_threshold_bytes},
        std::uint64_t{chunk_bytes}, std::uint64_t{min_chunk_bytes},
        static_cast<std::uint64_t>(ring_order), std::uint64_t{slice_from_bytes}}) {
    hash = (hash ^ value) * 0x100000001b3ULL;
  }
  return hash;
}

AlgorithmConfig AlgorithmConfig::from_env(AlgorithmConfig defaults) {
  for (const auto& [old_name, new_name] : kRenamed) {
    if (env::get(old_name)) {
      throw ConfigError(std::string(old_name) + " is no longer read: one set of algorithm " +
                        "settings serves every backend; use " + new_name);
    }
  }
  AlgorithmConfig config = defaults;
  if (auto algorithm = env::get_choice<AllreduceAlgorithm>(
          "DDP_ALGORITHM", {{"auto", AllreduceAlgorithm::kAuto},
                            {"direct", AllreduceAlgorithm::kDirect},
                            {"ring", AllreduceAlgorithm::kRing},
                            {"recursive_doubling", AllreduceAlgorithm::kRecursiveDoubling}})) {
    config.allreduce = *algorithm;
  }
  if (auto order = env::get_choice<RingOrder>(
          "DDP_RING_ORDER", {{"wavefront", RingOrder::kWavefront}, {"step", RingOrder::kStep}})) {
    config.ring_order = *order;
  }
  constexpr long kGiB = 1L << 30;
  // One round stops paying long before this; gloo keeps receive slots of this size per level.
  constexpr long kMaxDirectBytes = 16L << 20;
  if (auto v = env::get_int("DDP_DIRECT_BYTES", 0, kMaxDirectBytes)) {
    config.direct_bytes = static_cast<std::size_t>(*v);
  }
  if (auto v = env::get_int("DDP_RING_THRESHOLD", 0, kGiB)) {
    config.ring_threshold_bytes = static_cast<std::size_t>(*v);
  }
  if (auto v = env::get_int("DDP_CHUNK_BYTES", 64, kGiB)) {
    config.chunk_bytes = static_cast<std::size_t>(*v);
  }
  if (auto v = env::get_int("DDP_PIPELINE_DEPTH", 1, 64)) {
    config.pipeline_depth = static_cast<int>(*v);
  }
  if (auto v = env::get_int("DDP_HIERARCHY_SLICE_BYTES", 0, kGiB)) {
    config.slice_from_bytes = static_cast<std::size_t>(*v);
  }
  return config;
}

}  // namespace ddp::detail::collectives
