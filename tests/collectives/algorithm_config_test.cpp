// The collectives' settings: each libfabric provider's defaults, and the environment's overrides
// on top of them.
#include "comm/collectives/algorithm_config.h"

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "scoped_env.h"

namespace ddp::detail::collectives {
namespace {

using testing::ScopedEnv;

TEST(AlgorithmConfig, TcpStartsTheRingAtLargerPayloadsThanShm) {
  EXPECT_EQ(AlgorithmConfig::for_provider("shm").ring_threshold_bytes, 128u * 1024);
  EXPECT_EQ(AlgorithmConfig::for_provider("efa").ring_threshold_bytes, 64u * 1024);
  EXPECT_EQ(AlgorithmConfig::for_provider("tcp;ofi_rxm").ring_threshold_bytes, 512u * 1024);
}

TEST(AlgorithmConfig, WhereACoreCopiesEveryByteTheRingRunsInLargerChunksOneReceiveAhead) {
  for (const char* provider : {"shm", "tcp;ofi_rxm", "tcp"}) {
    SCOPED_TRACE(provider);
    EXPECT_EQ(AlgorithmConfig::for_provider(provider).chunk_bytes, 512u * 1024);
    EXPECT_EQ(AlgorithmConfig::for_provider(provider).pipeline_depth, 2);
  }
  // EFA's NIC moves data while the core reduces: the deeper pipeline stays.
  EXPECT_EQ(AlgorithmConfig::for_provider("efa").chunk_bytes, 256u * 1024);
  EXPECT_EQ(AlgorithmConfig::for_provider("efa").pipeline_depth, 4);
}

TEST(AlgorithmConfig, TheEnvironmentOverridesTheProvidersDefaults) {
  ScopedEnv threshold("DDP_FABRIC_RING_THRESHOLD", "131072");
  ScopedEnv algorithm("DDP_FABRIC_ALGORITHM", nullptr);
  ScopedEnv chunk("DDP_FABRIC_CHUNK_BYTES", nullptr);
  ScopedEnv depth("DDP_FABRIC_PIPELINE_DEPTH", nullptr);
  ScopedEnv order("DDP_FABRIC_RING_ORDER", nullptr);
  const auto config = AlgorithmConfig::from_env(AlgorithmConfig::for_provider("tcp;ofi_rxm"));
  EXPECT_EQ(config.ring_threshold_bytes, 131072u);
}

TEST(AlgorithmConfig, UnsetVariablesKeepTheProvidersDefaults) {
  ScopedEnv threshold("DDP_FABRIC_RING_THRESHOLD", nullptr);
  ScopedEnv algorithm("DDP_FABRIC_ALGORITHM", nullptr);
  const auto config = AlgorithmConfig::from_env(AlgorithmConfig::for_provider("tcp;ofi_rxm"));
  EXPECT_EQ(config.ring_threshold_bytes, 512u * 1024);
  EXPECT_NE(config.fingerprint(), AlgorithmConfig::from_env(AlgorithmConfig{}).fingerprint())
      << "ranks on different providers' defaults must not agree on a plan";
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
}

TEST(AlgorithmConfig, TheRingOrderIsAWavefrontUnlessTheEnvironmentAsksForSteps) {
  {
    ScopedEnv order("DDP_FABRIC_RING_ORDER", nullptr);
    for (const char* provider : {"shm", "tcp;ofi_rxm", "efa"}) {
      EXPECT_EQ(AlgorithmConfig::from_env(AlgorithmConfig::for_provider(provider)).ring_order,
                RingOrder::kWavefront)
          << provider;
    }
  }
  ScopedEnv order("DDP_FABRIC_RING_ORDER", "step");
  EXPECT_EQ(AlgorithmConfig::from_env(AlgorithmConfig::for_provider("shm")).ring_order,
            RingOrder::kStep);
}

TEST(AlgorithmConfig, AMalformedSettingIsAConfigError) {
  {
    ScopedEnv algorithm("DDP_FABRIC_ALGORITHM", "halving");
    EXPECT_THROW(AlgorithmConfig::from_env(AlgorithmConfig{}), ConfigError);
  }
  ScopedEnv order("DDP_FABRIC_RING_ORDER", "diagonal");
  EXPECT_THROW(AlgorithmConfig::from_env(AlgorithmConfig{}), ConfigError);
}

}  // namespace
}  // namespace ddp::detail::collectives
