#include "fabric_variants.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "ddp/comm/factory.h"
#include "fabric_reference.h"

namespace ddp::bench {

std::vector<VariantFactory> fabric_variants(int world_size) {
  std::vector<VariantFactory> variants;
  const auto backends = available_backends();
  if (std::find(backends.begin(), backends.end(), "fabric") == backends.end()) return variants;
#ifdef DDP_BENCH_WITH_FABRIC
  if (world_size == 2) {
    variants.push_back(bare_ring_variant("fabric_bare_ring_shm", "shm"));
    variants.push_back(bare_ring_variant("fabric_bare_ring_tcp", "tcp;ofi_rxm"));
    variants.push_back(bare_doubling_variant("fabric_bare_doubling_shm", "shm"));
  }
#endif
  const char* tuning = std::getenv("DDP_BENCH_FABRIC_TUNING");
  if (!tuning || std::string(tuning) != "1") return variants;
  using Env = std::vector<std::pair<std::string, std::string>>;
  const Env shm{{"DDP_FABRIC_PROVIDER", "shm"}};
  const Env tcp{{"DDP_FABRIC_PROVIDER", "tcp;ofi_rxm"}};
  // A provider's variables plus the settings a variant changes.
  auto with = [](Env provider, const Env& extra) {
    provider.insert(provider.end(), extra.begin(), extra.end());
    return provider;
  };
  for (const char* chunk : {"131072", "262144", "1048576", "2097152"}) {
    variants.push_back(ddp_variant(std::string("ddp_fabric_shm_chunk") + chunk, "fabric",
                                   with(shm, {{"DDP_CHUNK_BYTES", chunk}})));
  }
  for (const char* chunk : {"262144", "1048576", "2097152", "4194304"}) {
    variants.push_back(ddp_variant(std::string("ddp_fabric_tcp_chunk") + chunk, "fabric",
                                   with(tcp, {{"DDP_CHUNK_BYTES", chunk}})));
  }
  for (const char* chunk : {"131072", "262144", "1048576", "2097152"}) {
    variants.push_back(
        ddp_variant(std::string("ddp_fabric_shm_depth1_chunk") + chunk, "fabric",
                    with(shm, {{"DDP_CHUNK_BYTES", chunk}, {"DDP_PIPELINE_DEPTH", "1"}})));
  }
  for (const char* depth : {"1", "4"}) {
    variants.push_back(ddp_variant(std::string("ddp_fabric_shm_depth") + depth, "fabric",
                                   with(shm, {{"DDP_PIPELINE_DEPTH", depth}})));
  }
  // The ring forced at every size, and recursive doubling, on both providers: on TCP, where every
  // message past the eager size costs ofi_rxm a rendezvous, where the two cross need not be where
  // they cross on shm.
  for (const auto& [provider, env] :
       {std::pair<const char*, const Env&>{"shm", shm}, {"tcp", tcp}}) {
    const std::string prefix = std::string("ddp_fabric_") + provider + "_";
    variants.push_back(
        ddp_variant(prefix + "ring_always", "fabric", with(env, {{"DDP_ALGORITHM", "ring"}})));
    variants.push_back(ddp_variant(prefix + "doubling_always", "fabric",
                                   with(env, {{"DDP_ALGORITHM", "recursive_doubling"}})));
    // The ring taking its chunks step by step instead of in a wavefront.
    variants.push_back(
        ddp_variant(prefix + "step_order", "fabric", with(env, {{"DDP_RING_ORDER", "step"}})));
    // The ring as EFA pipelines it (the defaults before shm and tcp got their own).
    variants.push_back(
        ddp_variant(prefix + "efa_pipeline", "fabric",
                    with(env, {{"DDP_CHUNK_BYTES", "262144"}, {"DDP_PIPELINE_DEPTH", "4"}})));
  }
  return variants;
}

}  // namespace ddp::bench
