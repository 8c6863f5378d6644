#include "comm/collectives/algorithm_config.h"

#include <cstdint>
#include <string>

#include "ddp/env_vars.h"
#include "ddp/error.h"

namespace ddp::detail::collectives {

const char* to_string(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kAuto:
      return "auto";
    case AllreduceAlgorithm::kRing:
      return "ring";
    case AllreduceAlgorithm::kRecursiveDoubling:
      return "recursive_doubling";
  }
  return "unknown";
}

std::uint64_t AlgorithmConfig::fingerprint() const {
  std::uint64_t hash = static_cast<std::uint64_t>(allreduce);
  for (std::uint64_t value : {std::uint64_t{ring_threshold_bytes}, std::uint64_t{chunk_bytes},
                              std::uint64_t{min_chunk_bytes}}) {
    hash = (hash ^ value) * 0x100000001b3ULL;
  }
  return hash;
}

AlgorithmConfig AlgorithmConfig::from_env() {
  AlgorithmConfig config;
  if (auto name = env::get("DDP_FABRIC_ALGORITHM")) {
    if (*name == "auto") {
      config.allreduce = AllreduceAlgorithm::kAuto;
    } else if (*name == "ring") {
      config.allreduce = AllreduceAlgorithm::kRing;
    } else if (*name == "recursive_doubling") {
      config.allreduce = AllreduceAlgorithm::kRecursiveDoubling;
    } else {
      throw ConfigError("DDP_FABRIC_ALGORITHM='" + *name +
                        "' is not known; use auto, ring or recursive_doubling");
    }
  }
  constexpr long kGiB = 1L << 30;
  if (auto v = env::get_int("DDP_FABRIC_RING_THRESHOLD", 0, kGiB)) {
    config.ring_threshold_bytes = static_cast<std::size_t>(*v);
  }
  if (auto v = env::get_int("DDP_FABRIC_CHUNK_BYTES", 64, kGiB)) {
    config.chunk_bytes = static_cast<std::size_t>(*v);
  }
  if (auto v = env::get_int("DDP_FABRIC_PIPELINE_DEPTH", 1, 64)) {
    config.pipeline_depth = static_cast<int>(*v);
  }
  return config;
}

}  // namespace ddp::detail::collectives
