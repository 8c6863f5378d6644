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
  }
#endif
  const char* tuning = std::getenv("DDP_BENCH_FABRIC_TUNING");
  if (!tuning || std::string(tuning) != "1") return variants;
  using Env = std::vector<std::pair<std::string, std::string>>;
  const Env shm{{"DDP_FABRIC_PROVIDER", "shm"}};
  auto with = [&](Env extra) {
    Env env = shm;
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
  };
  for (const char* chunk : {"131072", "262144", "1048576"}) {
    variants.push_back(ddp_variant(std::string("ddp_fabric_shm_chunk") + chunk, "fabric",
                                   with({{"DDP_FABRIC_CHUNK_BYTES", chunk}})));
  }
  for (const char* depth : {"1", "4"}) {
    variants.push_back(ddp_variant(std::string("ddp_fabric_shm_depth") + depth, "fabric",
                                   with({{"DDP_FABRIC_PIPELINE_DEPTH", depth}})));
  }
  // The ring as EFA pipelines it (the defaults before shm and tcp got their own).
  const Env efa_pipeline{{"DDP_FABRIC_CHUNK_BYTES", "262144"}, {"DDP_FABRIC_PIPELINE_DEPTH", "4"}};
  variants.push_back(ddp_variant("ddp_fabric_shm_efa_pipeline", "fabric", with(efa_pipeline)));
  variants.push_back(ddp_variant("ddp_fabric_shm_ring_always", "fabric",
                                 with({{"DDP_FABRIC_ALGORITHM", "ring"}})));
  variants.push_back(ddp_variant("ddp_fabric_shm_doubling_always", "fabric",
                                 with({{"DDP_FABRIC_ALGORITHM", "recursive_doubling"}})));
  // The same choice on TCP, where every message past the eager size costs ofi_rxm a
  // rendezvous: where the two cross there need not be where they cross on shm.
  const Env tcp{{"DDP_FABRIC_PROVIDER", "tcp;ofi_rxm"}};
  for (const auto& [name, algorithm] :
       {std::pair<const char*, const char*>{"ring", "ring"}, {"doubling", "recursive_doubling"}}) {
    Env env = tcp;
    env.emplace_back("DDP_FABRIC_ALGORITHM", algorithm);
    variants.push_back(
        ddp_variant(std::string("ddp_fabric_tcp_") + name + "_always", "fabric", env));
  }
  Env tcp_efa_pipeline = tcp;
  tcp_efa_pipeline.insert(tcp_efa_pipeline.end(), efa_pipeline.begin(), efa_pipeline.end());
  variants.push_back(ddp_variant("ddp_fabric_tcp_efa_pipeline", "fabric", tcp_efa_pipeline));
  return variants;
}

}  // namespace ddp::bench
