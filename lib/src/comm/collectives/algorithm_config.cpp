#include "comm/collectives/algorithm_config.h"

#include <cstdint>
#include <string>

#include "ddp/error.h"
#include "ddp/settings.h"

namespace ddp::detail::collectives {
namespace {

// The value `options` sets (checked against the setting's range), else the environment's, else
// `current` (the transport's default).
template <typename T>
T pick_number(const std::optional<T>& in_code, const settings::Setting& setting, const char* field,
              T current) {
  if (in_code) {
    const auto value = static_cast<long long>(*in_code);
    if (value < setting.min_value || value > setting.max_value) {
      throw ConfigError(std::string("CommOptions::") + field + "=" + std::to_string(value) +
                        " is out of range; expected a value in [" +
                        std::to_string(setting.min_value) + ", " +
                        std::to_string(setting.max_value) + "] (as for " + setting.name + ")");
    }
    return *in_code;
  }
  if (auto value = settings::integer(setting)) return static_cast<T>(*value);
  return current;
}

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
        static_cast<std::uint64_t>(ring_order), std::uint64_t{slice_from_bytes},
        std::uint64_t{piece_bytes}, std::uint64_t{ring_for_two_ranks}}) {
    hash = (hash ^ value) * 0x100000001b3ULL;
  }
  return hash;
}

AlgorithmConfig AlgorithmConfig::resolve(AlgorithmConfig defaults, const CommOptions& options) {
  settings::refuse_replaced();  // DDP_GLOO_ALGORITHM and DDP_FABRIC_*, naming their successors
  AlgorithmConfig config = defaults;
  if (options.algorithm) {
    config.allreduce = *options.algorithm;
  } else if (auto algorithm = settings::choice<AllreduceAlgorithm>(
                 settings::kAlgorithm,
                 {{"auto", AllreduceAlgorithm::kAuto},
                  {"direct", AllreduceAlgorithm::kDirect},
                  {"ring", AllreduceAlgorithm::kRing},
                  {"recursive_doubling", AllreduceAlgorithm::kRecursiveDoubling}})) {
    config.allreduce = *algorithm;
  }
  if (options.ring_order) {
    config.ring_order = *options.ring_order;
  } else if (auto order = settings::choice<RingOrder>(
                 settings::kRingOrder,
                 {{"wavefront", RingOrder::kWavefront}, {"step", RingOrder::kStep}})) {
    config.ring_order = *order;
  }
  config.direct_bytes = pick_number(options.direct_bytes, settings::kDirectBytes, "direct_bytes",
                                    config.direct_bytes);
  config.ring_threshold_bytes = pick_number(options.ring_threshold_bytes, settings::kRingThreshold,
                                            "ring_threshold_bytes", config.ring_threshold_bytes);
  config.chunk_bytes =
      pick_number(options.chunk_bytes, settings::kChunkBytes, "chunk_bytes", config.chunk_bytes);
  config.pipeline_depth = pick_number(options.pipeline_depth, settings::kPipelineDepth,
                                      "pipeline_depth", config.pipeline_depth);
  config.slice_from_bytes =
      pick_number(options.hierarchy_slice_bytes, settings::kHierarchySliceBytes,
                  "hierarchy_slice_bytes", config.slice_from_bytes);
  config.piece_bytes = pick_number(options.hierarchy_piece_bytes, settings::kHierarchyPieceBytes,
                                   "hierarchy_piece_bytes", config.piece_bytes);
  return config;
}

}  // namespace ddp::detail::collectives
