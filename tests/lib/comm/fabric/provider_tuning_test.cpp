// The collectives' defaults for each libfabric provider (before the environment's overrides,
// tests/lib/comm/collectives/algorithm_config_test.cpp).
#include "comm/fabric/provider_tuning.h"

#include <gtest/gtest.h>

namespace ddp::detail::fabric {
namespace {

TEST(ProviderTuning, TcpStartsTheRingAtLargerPayloadsThanShm) {
  EXPECT_EQ(algorithm_defaults("shm").ring_threshold_bytes, 128u * 1024);
  EXPECT_EQ(algorithm_defaults("efa").ring_threshold_bytes, 64u * 1024);
  EXPECT_EQ(algorithm_defaults("tcp;ofi_rxm").ring_threshold_bytes, 512u * 1024);
}

TEST(ProviderTuning, WhereACoreCopiesEveryByteTheRingRunsInLargerChunksOneReceiveAhead) {
  for (const char* provider : {"shm", "tcp;ofi_rxm", "tcp"}) {
    SCOPED_TRACE(provider);
    EXPECT_EQ(algorithm_defaults(provider).chunk_bytes, 512u * 1024);
    EXPECT_EQ(algorithm_defaults(provider).pipeline_depth, 2);
  }
  // EFA's NIC moves data while the core reduces: the deeper pipeline stays.
  EXPECT_EQ(algorithm_defaults("efa").chunk_bytes, 256u * 1024);
  EXPECT_EQ(algorithm_defaults("efa").pipeline_depth, 4);
}

TEST(ProviderTuning, NoProviderTakesOneRoundCollectivesByDefault) {
  for (const char* provider : {"shm", "tcp;ofi_rxm", "efa"}) {
    EXPECT_EQ(algorithm_defaults(provider).direct_bytes, 0u) << provider;
  }
}

TEST(ProviderTuning, TwoRanksKeepTheRingOnEveryProvider) {
  for (const char* provider : {"shm", "tcp;ofi_rxm", "efa"}) {
    EXPECT_TRUE(algorithm_defaults(provider).ring_for_two_ranks) << provider;
  }
}

TEST(ProviderTuning, NoProviderPipelinesTheHierarchicalAllreduceByDefault) {
  for (const char* provider : {"shm", "tcp;ofi_rxm", "efa", "verbs;ofi_rxm"}) {
    EXPECT_EQ(algorithm_defaults(provider).piece_bytes, 0u) << provider;
  }
}

TEST(ProviderTuning, ProvidersDefaultsDoNotAgreeOnAPlan) {
  EXPECT_NE(algorithm_defaults("tcp;ofi_rxm").fingerprint(),
            algorithm_defaults("efa").fingerprint())
      << "ranks on different providers' defaults must not agree on a plan";
}

}  // namespace
}  // namespace ddp::detail::fabric
