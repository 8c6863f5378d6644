// The reduction kernels per instruction-set variant (baseline, AVX2, AVX-512): out = a + b in
// float32 and bfloat16, and the fused average, from a DDP bucket's piece that stays in L1/L2 up
// to one that streams from DRAM, on one core. Compare variants within one run, their repetitions
// interleaved (this VM's speed drifts between runs):
//   build/bench/reduce_kernels_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
#include <cstdint>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "comm/reduce_kernels.h"

namespace ddp::detail {
namespace {

enum class Kernel { kSum, kAverage };

void reduce(benchmark::State& state, const ReduceKernels* kernels, DataType dtype, Kernel kernel,
            std::size_t bytes) {
  const std::size_t count = bytes / element_size(dtype);
  // Bits that are ordinary values in both types: 1.0 as float32, and pairs of 1.0 as bfloat16.
  // One allocation, the inputs 1 KiB apart beyond a page multiple, so that every run lays them
  // out alike (loads and stores 4 KiB apart would stall on false dependencies).
  constexpr std::size_t kGapWords = 256;
  std::vector<std::uint32_t> buffer(2 * (bytes / 4) + kGapWords, 0x3F803F80u);
  std::uint32_t* a = buffer.data();
  const std::uint32_t* b = a + bytes / 4 + kGapWords;
  const auto& k = kernels->by_type[static_cast<int>(dtype)];
  for (auto _ : state) {
    if (kernel == Kernel::kSum) {
      k.sum(a, a, b, count);
    } else {
      k.sum_divide(a, a, b, count, 2);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void register_all() {
  for (const char* isa : {"baseline", "avx2", "avx512"}) {
    const ReduceKernels* kernels = reduce_kernels_for(isa);
    if (!kernels) continue;  // not in this build, or not run by this CPU
    for (auto [type_name, dtype] :
         {std::pair{"float32", DataType::kFloat32}, {"bfloat16", DataType::kBFloat16}}) {
      for (auto [kernel_name, kernel] :
           {std::pair{"sum", Kernel::kSum}, {"average", Kernel::kAverage}}) {
        for (std::size_t bytes : {16u << 10, 256u << 10, 1u << 20, 4u << 20, 64u << 20}) {
          const std::string name = std::string(kernel_name) + "/" + type_name + "/" +
                                   std::to_string(bytes >> 10) + "KiB/" + isa;
          benchmark::RegisterBenchmark(name.c_str(), reduce, kernels, dtype, kernel, bytes)
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
}

}  // namespace
}  // namespace ddp::detail

int main(int argc, char** argv) {
  ddp::detail::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
