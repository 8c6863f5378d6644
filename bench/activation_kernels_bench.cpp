// The fused activation loops per instruction-set variant (baseline vs AVX-512), on the MNIST
// CNN's pool input per rank (batch 64, 64 x 24 x 24, dropout 0.25) and fc1's weight casts, on
// one core. Compare variants within one run, their repetitions interleaved (this VM's speed
// drifts between runs):
//   build/bench/activation_kernels_bench --benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <benchmark/benchmark.h>

#include "models/activation_kernels.h"

namespace ddp::models::detail {
namespace {

constexpr PoolGeometry kPool{64, 64, 24, 24, 12, 12};
constexpr int64_t kPoolPerImage = kPool.C * kPool.OH * kPool.OW;
constexpr int64_t kFc1Weights = 128 * 9216;

std::vector<uint8_t> random_bytes(std::size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<uint8_t> bytes(n);
  for (std::size_t i = 0; i + 4 <= n; i += 4) {
    const float v = normal(rng);
    std::memcpy(bytes.data() + i, &v, 4);
  }
  return bytes;
}

struct PoolBuffers {
  explicit PoolBuffers(Precision precision) {
    const std::size_t element = precision == Precision::kFloat32 ? 4 : 2;
    const int64_t in_n = kPool.B * kPool.C * kPool.H * kPool.W, out_n = kPool.B * kPoolPerImage;
    in = random_bytes(in_n * element, 1);
    grad_out = random_bytes(out_n * element, 2);
    out.resize(out_n * element);
    grad_in.resize(in_n * element);
    arg.resize(out_n);
    multipliers.resize(kPoolPerImage);
    draws.resize(kPoolPerImage + 3);
  }
  std::vector<uint8_t> in, grad_out, out, grad_in, arg;
  std::vector<float> multipliers;
  std::vector<uint16_t> draws;
};

void pool_forward(benchmark::State& state, const char* isa, Precision precision,
                  bool channels_last) {
  const ActivationKernels* k = activation_kernels_for(isa);
  if (!k) return state.SkipWithError("this CPU or build has no such variant");
  PoolBuffers b(precision);
  const DropoutMask mask{42, 16384, 4.0f / 3.0f};  // p = 0.25, as the MNIST CNN
  for (auto _ : state) {
    k->pool_forward(precision, channels_last, kPool, b.in.data(), b.out.data(), b.arg.data(), &mask,
                    b.multipliers.data(), b.draws.data());
    benchmark::ClobberMemory();
  }
}

void pool_backward(benchmark::State& state, const char* isa, Precision precision,
                   bool channels_last) {
  const ActivationKernels* k = activation_kernels_for(isa);
  if (!k) return state.SkipWithError("this CPU or build has no such variant");
  PoolBuffers b(precision);
  const DropoutMask mask{42, 16384, 4.0f / 3.0f};
  k->pool_forward(precision, channels_last, kPool, b.in.data(), b.out.data(), b.arg.data(), &mask,
                  b.multipliers.data(), b.draws.data());
  for (auto _ : state) {
    k->pool_backward(precision, channels_last, kPool, b.grad_out.data(), b.out.data(), b.arg.data(),
                     b.grad_in.data(), mask.scale);
    benchmark::ClobberMemory();
  }
}

void weight_casts(benchmark::State& state, const char* isa) {
  const ActivationKernels* k = activation_kernels_for(isa);
  if (!k) return state.SkipWithError("this CPU or build has no such variant");
  std::vector<float> weights(kFc1Weights, 0.5f), widened(kFc1Weights);
  std::vector<uint16_t> narrowed(kFc1Weights);
  for (auto _ : state) {  // fc1 under bfloat16 autocast: the weight down, its gradient up
    k->to_bfloat16(weights.data(), narrowed.data(), kFc1Weights);
    k->to_float32(narrowed.data(), widened.data(), kFc1Weights);
    benchmark::ClobberMemory();
  }
}

void register_all() {
  const char* isas[] = {"baseline", "avx512"};
  for (const auto& [name, precision, channels_last] :
       {std::tuple{"fp32_nchw", Precision::kFloat32, false},
        std::tuple{"bf16_channels_last", Precision::kBFloat16, true}}) {
    for (const char* isa : isas) {
      benchmark::RegisterBenchmark(("pool_forward/" + std::string(name) + "/" + isa).c_str(),
                                   pool_forward, isa, precision, channels_last)
          ->Unit(benchmark::kMicrosecond);
    }
    for (const char* isa : isas) {
      benchmark::RegisterBenchmark(("pool_backward/" + std::string(name) + "/" + isa).c_str(),
                                   pool_backward, isa, precision, channels_last)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  for (const char* isa : isas) {
    benchmark::RegisterBenchmark(("fc1_weight_casts/" + std::string(isa)).c_str(), weight_casts,
                                 isa)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace ddp::models::detail

int main(int argc, char** argv) {
  ddp::models::detail::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
