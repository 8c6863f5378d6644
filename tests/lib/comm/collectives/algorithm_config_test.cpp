// The collectives' settings: one configuration for every transport, the transports' defaults
// (gloo's here, libfabric's providers' in tests/lib/comm/fabric/provider_tuning_test.cpp), and the
// environment's overrides on top of them.
#include "comm/collectives/algorithm_config.h"

#include <gtest/gtest.h>

#include <string>

#include "comm/gloo/gloo_peer_transport.h"
#include "ddp/error.h"
#include "scoped_env.h"

namespace ddp::detail::collectives {
namespace {

using testing::ScopedEnv;

// Clears every variable from_env reads, so that the host's environment cannot leak in.
struct CleanEnv {
  ScopedEnv algorithm{"DDP_ALGORITHM", nullptr};
  ScopedEnv direct{"DDP_DIRECT_BYTES", nullptr};
  ScopedEnv threshold{"DDP_RING_THRESHOLD", nullptr};
  ScopedEnv chunk{"DDP_CHUNK_BYTES", nullptr};
  ScopedEnv depth{"DDP_PIPELINE_DEPTH", nullptr};
  ScopedEnv order{"DDP_RING_ORDER", nullptr};
  ScopedEnv slice{"DDP_HIERARCHY_SLICE_BYTES", nullptr};
  ScopedEnv piece{"DDP_HIERARCHY_PIECE_BYTES", nullptr};
};

TEST(AlgorithmConfig, GlooTakesOneRoundUpToOneMiBSentPerRankThenTheRing) {
  const auto gloo = gloo_algorithm_defaults();
  EXPECT_EQ(gloo.direct_bytes, 1u << 20);
  EXPECT_EQ(gloo.ring_threshold_bytes, 0u);
  EXPECT_EQ(gloo.chunk_bytes, 4u << 20);
  EXPECT_EQ(gloo.min_chunk_bytes, 1u << 20);
  EXPECT_EQ(gloo.slice_from_bytes, (64u << 10) + 1);
  EXPECT_EQ(gloo.piece_bytes, 1u << 20) << "gloo's hierarchical allreduce runs pipelined";
  EXPECT_FALSE(gloo.ring_for_two_ranks);
  EXPECT_EQ(AlgorithmConfig{}.direct_bytes, 0u) << "one-round collectives are opt-in";
}

TEST(AlgorithmConfig, TheEnvironmentOverridesTheTransportsDefaults) {
  CleanEnv clean;
  ScopedEnv threshold("DDP_RING_THRESHOLD", "131072");
  ScopedEnv direct("DDP_DIRECT_BYTES", "4096");
  ScopedEnv algorithm("DDP_ALGORITHM", "direct");
  ScopedEnv slice("DDP_HIERARCHY_SLICE_BYTES", "1024");
  ScopedEnv piece("DDP_HIERARCHY_PIECE_BYTES", "0");
  const auto config = AlgorithmConfig::resolve(gloo_algorithm_defaults(), {});
  EXPECT_EQ(config.ring_threshold_bytes, 131072u);
  EXPECT_EQ(config.direct_bytes, 4096u);
  EXPECT_EQ(config.allreduce, AllreduceAlgorithm::kDirect);
  EXPECT_EQ(config.slice_from_bytes, 1024u);
  EXPECT_EQ(config.piece_bytes, 0u);
  EXPECT_EQ(config.chunk_bytes, 4u << 20) << "an unset variable keeps the default";
}

TEST(AlgorithmConfig, UnsetVariablesKeepTheTransportsDefaults) {
  CleanEnv clean;
  const auto gloo = gloo_algorithm_defaults();
  EXPECT_EQ(AlgorithmConfig::resolve(gloo, {}).fingerprint(), gloo.fingerprint());
  EXPECT_NE(gloo.fingerprint(), AlgorithmConfig{}.fingerprint());
}

TEST(AlgorithmConfig, PlanFingerprintFollowsTheSettingsThatShapeMessages) {
  AlgorithmConfig a;
  AlgorithmConfig b = a;
  b.pipeline_depth = a.pipeline_depth + 3;  // depth does not change any message
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  b.chunk_bytes = a.chunk_bytes * 2;
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  AlgorithmConfig c = a;
  c.allreduce = AllreduceAlgorithm::kRing;
  EXPECT_NE(a.fingerprint(), c.fingerprint());
  AlgorithmConfig d = a;
  d.min_chunk_bytes = 4096;
  EXPECT_NE(a.fingerprint(), d.fingerprint());
  AlgorithmConfig e = a;
  e.ring_order = RingOrder::kStep;  // ranks taking chunks in different orders can deadlock
  EXPECT_NE(a.fingerprint(), e.fingerprint());
  AlgorithmConfig f = a;
  f.direct_bytes = 1 << 20;  // one round against the ring
  EXPECT_NE(a.fingerprint(), f.fingerprint());
  AlgorithmConfig g = a;
  g.slice_from_bytes = 1 << 20;  // a whole buffer against a slice across nodes
  EXPECT_NE(a.fingerprint(), g.fingerprint());
}

TEST(AlgorithmConfig, TheRingOrderIsAWavefrontUnlessTheEnvironmentAsksForSteps) {
  CleanEnv clean;
  EXPECT_EQ(AlgorithmConfig::resolve(AlgorithmConfig{}, {}).ring_order, RingOrder::kWavefront);
  ScopedEnv order("DDP_RING_ORDER", "step");
  EXPECT_EQ(AlgorithmConfig::resolve(AlgorithmConfig{}, {}).ring_order, RingOrder::kStep);
}

TEST(AlgorithmConfig, AMalformedSettingIsAConfigError) {
  CleanEnv clean;
  {
    ScopedEnv algorithm("DDP_ALGORITHM", "halving");
    EXPECT_THROW(AlgorithmConfig::resolve(AlgorithmConfig{}, {}), ConfigError);
  }
  for (const char* bytes : {"-1", "16777217"}) {  // one round is capped at 16 MiB sent per rank
    ScopedEnv direct("DDP_DIRECT_BYTES", bytes);
    EXPECT_THROW(AlgorithmConfig::resolve(AlgorithmConfig{}, {}), ConfigError) << bytes;
  }
  ScopedEnv order("DDP_RING_ORDER", "diagonal");
  EXPECT_THROW(AlgorithmConfig::resolve(AlgorithmConfig{}, {}), ConfigError);
}

// The per-backend variables of earlier releases fail with the name that replaced them, rather
// than being ignored while the job runs with settings its author did not ask for.
TEST(AlgorithmConfig, TheReplacedPerBackendVariablesNameTheirSuccessors) {
  CleanEnv clean;
  const std::pair<const char*, const char*> renamed[] = {
      {"DDP_GLOO_ALGORITHM", "DDP_ALGORITHM"},
      {"DDP_FABRIC_ALGORITHM", "DDP_ALGORITHM"},
      {"DDP_FABRIC_RING_THRESHOLD", "DDP_RING_THRESHOLD"},
      {"DDP_FABRIC_CHUNK_BYTES", "DDP_CHUNK_BYTES"},
      {"DDP_FABRIC_PIPELINE_DEPTH", "DDP_PIPELINE_DEPTH"},
      {"DDP_FABRIC_RING_ORDER", "DDP_RING_ORDER"},
      {"DDP_REDUCE_ISA", "DDP_ISA"},
      {"DDP_KERNEL_ISA", "DDP_ISA"}};
  for (const auto& [old_name, new_name] : renamed) {
    ScopedEnv old_variable(old_name, "1");
    try {
      AlgorithmConfig::resolve(AlgorithmConfig{}, {});
      ADD_FAILURE() << old_name << " was accepted";
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(old_name), std::string::npos) << what;
      EXPECT_NE(what.find(new_name), std::string::npos) << what;
    }
  }
}

// CommOptions' fields win over the environment, and are checked against the same ranges.
TEST(AlgorithmConfig, OptionsSetInCodeWinOverTheEnvironment) {
  CleanEnv clean;
  ScopedEnv chunk("DDP_CHUNK_BYTES", "65536");
  ScopedEnv algorithm("DDP_ALGORITHM", "ring");
  CommOptions options;
  options.chunk_bytes = 1u << 20;
  options.ring_order = RingOrder::kStep;
  options.hierarchy_slice_bytes = 0;
  const auto config = AlgorithmConfig::resolve(gloo_algorithm_defaults(), options);
  EXPECT_EQ(config.chunk_bytes, 1u << 20);
  EXPECT_EQ(config.ring_order, RingOrder::kStep);
  EXPECT_EQ(config.slice_from_bytes, 0u);
  EXPECT_EQ(config.allreduce, AllreduceAlgorithm::kRing) << "an unset field keeps the variable's";
  EXPECT_EQ(config.direct_bytes, 1u << 20) << "and then the transport's default";
  options.direct_bytes = (16u << 20) + 1;
  try {
    AlgorithmConfig::resolve(gloo_algorithm_defaults(), options);
    ADD_FAILURE() << "direct_bytes beyond 16 MiB was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("CommOptions::direct_bytes=16777217"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp::detail::collectives
