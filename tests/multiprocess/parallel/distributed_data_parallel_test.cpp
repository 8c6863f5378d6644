// DistributedDataParallel against the gold standard: N ranks each training on their slice of a
// batch must end with the parameters one process gets training on the whole batch. Also: overlap
// on/off bit-identical, bucket layout, no_sync, bf16 compression, unused parameters, errors.
// Ranks are forked processes joined by the Gloo backend on loopback; every test has a deadline.
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstring>

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "ddp/parallel/distributed_data_parallel.h"
#include "multiprocess.h"

namespace ddp {
namespace {

using namespace std::chrono_literals;
using testing::require;

// A small CNN that exists only in this test: DDP must work with any module.
struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)));
    fc1 = register_module("fc1", torch::nn::Linear(4 * 3 * 3, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(conv(x)), 2);
    return fc2(torch::tanh(fc1(h.flatten(1))));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TinyNet);

constexpr int64_t kPerRank = 4;

struct Data {
  torch::Tensor x, y;
};

// The global batch of `step` for `world` ranks; rank r trains on rows [r * kPerRank, ...).
Data global_batch(int step, int world) {
  auto gen = at::detail::createCPUGenerator(1000 + step);
  return {torch::randn({world * kPerRank, 1, 8, 8}, gen),
          torch::randint(0, 3, {world * kPerRank}, gen)};
}

TinyNet make_net(uint64_t seed) {
  torch::manual_seed(seed);
  return TinyNet();
}

double max_difference(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = a.parameters();
  auto pb = b.parameters();
  double worst = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    worst = std::max(worst, (pa[i] - pb[i]).abs().max().item<double>());
  }
  return worst;
}

CommOptions short_timeout() {
  CommOptions o;
  o.timeout = 20s;
  return o;
}

// Trains `steps` SGD steps with DDP on this rank's slices; returns the module.
TinyNet train_with_ddp(Communicator& comm, int steps, DdpOptions options,
                       BackwardStats* stats = nullptr) {
  TinyNet net = make_net(100 + comm.rank());  // different on purpose: DDP broadcasts rank 0's
  DistributedDataParallel ddp(net.ptr(), comm, options);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    Data d = global_batch(step, comm.size());
    auto x = d.x.narrow(0, comm.rank() * kPerRank, kPerRank);
    auto y = d.y.narrow(0, comm.rank() * kPerRank, kPerRank);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    opt.step();
    if (stats) *stats = ddp.last_backward();
  }
  return net;
}

// One process, whole batches, starting from rank 0's initial parameters.
TinyNet train_reference(int world, int steps) {
  TinyNet net = make_net(100);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < steps; ++step) {
    Data d = global_batch(step, world);
    opt.zero_grad();
    torch::nn::functional::cross_entropy(net->forward(d.x), d.y).backward();
    opt.step();
  }
  return net;
}

class GoldStandard : public ::testing::TestWithParam<int> {};

TEST_P(GoldStandard, RanksTrainingOnSlicesMatchOneProcessOnTheWholeBatch) {
  const int world = GetParam();
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", world, short_timeout(), 90s, [&](Communicator& comm) {
        torch::set_num_threads(1);
        DdpOptions options;
        options.first_bucket_cap_bytes = 64;  // several buckets even for this small model
        options.bucket_cap_bytes = 256;
        TinyNet trained = train_with_ddp(comm, 6, options);
        TinyNet reference = train_reference(comm.size(), 6);
        const double diff = max_difference(*trained, *reference);
        require(diff < 1e-5,
                "parameters differ from the single-process run by " + std::to_string(diff));
        // And training moved them: the comparison is not between two untouched models.
        TinyNet initial = make_net(100);
        require(max_difference(*trained, *initial) > 1e-2, "parameters did not change");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GoldStandard, ::testing::Values(2, 3));

TEST(DistributedDataParallel, OverlapOnAndOffGiveBitIdenticalParameters) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 2, short_timeout(), 90s, [&](Communicator& comm) {
        torch::set_num_threads(1);
        DdpOptions options;
        options.first_bucket_cap_bytes = 64;
        options.bucket_cap_bytes = 256;
        BackwardStats on_stats, off_stats;
        options.overlap = true;
        TinyNet on = train_with_ddp(comm, 4, options, &on_stats);
        options.overlap = false;
        TinyNet off = train_with_ddp(comm, 4, options, &off_stats);
        auto a = on->parameters();
        auto b = off->parameters();
        for (std::size_t i = 0; i < a.size(); ++i) {
          require(torch::equal(a[i], b[i]), "parameter " + std::to_string(i) + " differs");
        }
        require(on_stats.buckets >= 3, "expected several buckets");
        require(on_stats.launched_during_backward >= 1,
                "with overlap no bucket was launched during backward");
        require(off_stats.launched_during_backward == 0,
                "without overlap a bucket was launched during backward");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// Parameters of chosen sizes, registered p0..p4 (float32) and an optional float64 one.
struct SizedImpl : torch::nn::Module {
  explicit SizedImpl(bool with_double) {
    const int64_t sizes[] = {100, 300, 50, 1000, 10};
    for (int i = 0; i < 5; ++i) {
      register_parameter("p" + std::to_string(i), torch::zeros({sizes[i]}));
    }
    if (with_double) register_parameter("d", torch::zeros({20}, torch::kDouble));
  }
};
TORCH_MODULE(Sized);

TEST(DistributedDataParallel, BucketsFollowReverseRegistrationOrderAndCaps) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 2, short_timeout(), 60s, [&](Communicator& comm) {
        DdpOptions options;
        options.first_bucket_cap_bytes = 1000;
        options.bucket_cap_bytes = 2000;
        {
          Sized m(false);
          DistributedDataParallel ddp(m.ptr(), comm, options);
          const auto& b = ddp.buckets();
          require(b.size() == 2, "expected 2 buckets, got " + std::to_string(b.size()));
          // p4 (40 B) + p3 (4000 B) reach the first cap; p2 + p1 + p0 = 1800 B stay under 2000.
          require(b[0].parameters == std::vector<std::string>{"p4", "p3"}, "bucket 0 wrong");
          require(b[0].bytes == 4040, "bucket 0 bytes " + std::to_string(b[0].bytes));
          require(b[1].parameters == std::vector<std::string>{"p2", "p1", "p0"}, "bucket 1 wrong");
          require(b[1].bytes == 1800, "bucket 1 bytes " + std::to_string(b[1].bytes));
        }
        {
          // Another dtype never shares a bucket; it is registered last, so it comes first.
          Sized m(true);
          DistributedDataParallel ddp(m.ptr(), comm, options);
          const auto& b = ddp.buckets();
          require(b.size() == 3 && b[0].parameters == std::vector<std::string>{"d"},
                  "float64 parameter should have its own first bucket");
        }
        {
          // Defaults on a realistic model: the 4.7 MB fc1 weight closes the 1 MiB first bucket.
          auto net = std::make_shared<torch::nn::Sequential>(
              torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3)),
              torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3)), torch::nn::Linear(9216, 128),
              torch::nn::Linear(128, 10));
          DistributedDataParallel ddp((*net).ptr(), comm);
          const auto& b = ddp.buckets();
          require(b.size() == 2, "expected 2 buckets with default caps");
          require(b[0].parameters ==
                      std::vector<std::string>{"3.bias", "3.weight", "2.bias", "2.weight"},
                  "default bucket 0 wrong");
          require(b[1].parameters.size() == 4, "default bucket 1 wrong");
        }
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// The gradient this rank's data gives a fresh copy of rank 0's initial model, without DDP.
std::vector<torch::Tensor> local_gradients(int rank, int world, int micro_batches) {
  TinyNet net = make_net(100);
  for (int m = 0; m < micro_batches; ++m) {
    Data d = global_batch(m, world);
    auto x = d.x.narrow(0, rank * kPerRank, kPerRank);
    auto y = d.y.narrow(0, rank * kPerRank, kPerRank);
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  }
  std::vector<torch::Tensor> grads;
  for (auto& p : net->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

// Requires each gradient of `net` to be the mean of what ranks 0 and 1 get alone.
void require_mean_of_two_ranks(TinyNet& net, int world, int micro_batches,
                               const std::string& what) {
  auto r0 = local_gradients(0, world, micro_batches);
  auto r1 = local_gradients(1, world, micro_batches);
  auto params = net->parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    require(torch::allclose(params[i].grad(), (r0[i] + r1[i]) / 2, 1e-5, 1e-6), what);
  }
}

TEST(DistributedDataParallel, NoSyncAccumulatesLocallyThenAveragesEverything) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 2, short_timeout(), 60s, [&](Communicator& comm) {
        torch::set_num_threads(1);
        TinyNet net = make_net(100 + comm.rank());
        DistributedDataParallel ddp(net.ptr(), comm);
        auto backward_on = [&](int m) {
          Data d = global_batch(m, comm.size());
          auto x = d.x.narrow(0, comm.rank() * kPerRank, kPerRank);
          auto y = d.y.narrow(0, comm.rank() * kPerRank, kPerRank);
          torch::nn::functional::cross_entropy(net->forward(x), y).backward();
        };
        {
          auto guard = ddp.no_sync();
          backward_on(0);
          backward_on(1);
          // Nothing communicated yet: the gradients are this rank's own.
          auto mine = local_gradients(comm.rank(), comm.size(), 2);
          auto params = net->parameters();
          for (std::size_t i = 0; i < params.size(); ++i) {
            require(torch::allclose(params[i].grad(), mine[i], 1e-5, 1e-6),
                    "no_sync gradients were changed");
          }
        }
        backward_on(2);
        require_mean_of_two_ranks(
            net, comm.size(), 3,
            "gradient after no_sync is not the average of all accumulated gradients");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(DistributedDataParallel, Bf16CompressionSendsBfloat16AndStaysClose) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 2, short_timeout(), 60s, [&](Communicator& comm) {
        torch::set_num_threads(1);
        DdpOptions options;
        options.compression = GradientCompression::kBFloat16;
        TinyNet net = make_net(100 + comm.rank());
        DistributedDataParallel ddp(net.ptr(), comm, options);
        Data d = global_batch(0, comm.size());
        torch::nn::functional::cross_entropy(
            net->forward(d.x.narrow(0, comm.rank() * kPerRank, kPerRank)),
            d.y.narrow(0, comm.rank() * kPerRank, kPerRank))
            .backward();
        auto r0 = local_gradients(0, comm.size(), 1);
        auto r1 = local_gradients(1, comm.size(), 1);
        auto params = net->parameters();
        bool any_rounded = false;
        for (std::size_t i = 0; i < params.size(); ++i) {
          const auto grad = params[i].grad().contiguous();
          const auto exact = (r0[i] + r1[i]) / 2;
          // Every value came off the wire as bfloat16: its low 16 mantissa bits are zero.
          const float* g = grad.data_ptr<float>();
          for (int64_t k = 0; k < grad.numel(); ++k) {
            uint32_t bits;
            std::memcpy(&bits, &g[k], 4);
            require((bits & 0xFFFF) == 0, "gradient value is not a bfloat16");
          }
          // Roundings to bfloat16 (unit roundoff 2^-8) of each rank's share and of their sum: at
          // most 2 * 2^-8 of the terms' magnitude (not of their possibly cancelling sum).
          const auto bound = 8e-3 * (r0[i].abs() + r1[i].abs()) / 2 + 1e-7;
          const auto excess = ((grad - exact).abs() / bound).max().item<double>();
          require(excess <= 1.0, "bf16 gradient of parameter " + std::to_string(i) + " is off by " +
                                     std::to_string(excess) + "x the bound");
          any_rounded |= !torch::equal(grad, exact);
        }
        require(any_rounded, "no gradient was rounded: compression did not happen");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(DistributedDataParallel, ConstructionBroadcastsRank0ParametersAndBuffers) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 3, short_timeout(), 60s, [&](Communicator& comm) {
        torch::manual_seed(comm.rank());
        auto bn = torch::nn::BatchNorm1d(4);
        bn->running_mean.fill_(comm.rank() + 1.0);
        DistributedDataParallel ddp(bn.ptr(), comm);
        torch::manual_seed(0);
        auto rank0 = torch::nn::BatchNorm1d(4);  // rank 0's initial parameters
        require(torch::equal(bn->weight, rank0->weight), "weight not broadcast");
        require(torch::equal(bn->running_mean, torch::full({4}, 1.0)), "buffer not broadcast");
        // Training mode updates the statistics from local data; sync_buffers takes rank 0's.
        bn->forward(torch::full({2, 4}, 10.0 * (comm.rank() + 1)));
        ddp.sync_buffers();
        require(torch::allclose(bn->running_mean, torch::full({4}, 0.9 + 1.0)),
                "sync_buffers did not copy rank 0's running mean");
        require(bn->num_batches_tracked.item<int64_t>() == 1, "int64 buffer not synced");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(DistributedDataParallel, DifferentModelsFailOnEveryRankWithTheFirstDifference) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 3, short_timeout(), 60s, [&](Communicator& comm) {
        auto linear = torch::nn::Linear(4, comm.rank() == 1 ? 5 : 6);
        try {
          DistributedDataParallel ddp(linear.ptr(), comm);
        } catch (const ConfigError& e) {
          const std::string what = e.what();
          require(what.find('\n') == std::string::npos, "multi-line error: " + what);
          if (comm.rank() == 1) {
            require(what.find("parameter 'weight' is Float [5, 4] on rank 1 but rank 0 has a "
                              "parameter Float [6, 4]") != std::string::npos,
                    "rank 1 message: " + what);
          } else {
            require(what.find("rank(s) 1 built a different model than rank 0") != std::string::npos,
                    "message: " + what);
          }
          require(what.find("every rank must build the same model") != std::string::npos,
                  "no fix in: " + what);
          return;
        }
        throw std::runtime_error("no error for mismatched models");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(DistributedDataParallel, ParameterCountMismatchIsReported) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 2, short_timeout(), 60s, [&](Communicator& comm) {
        auto linear = torch::nn::Linear(torch::nn::LinearOptions(4, 4).bias(comm.rank() == 0));
        try {
          DistributedDataParallel ddp(linear.ptr(), comm);
        } catch (const ConfigError& e) {
          const std::string what = e.what();
          if (comm.rank() == 1) {
            require(what.find("rank 1 has 1 parameters and buffers but rank 0 has more") !=
                        std::string::npos,
                    what);
          }
          return;
        }
        throw std::runtime_error("no error for a missing parameter");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

// Uses fc2 only on rank 0: rank 1's fc2 gets no gradient from autograd at all.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(3, 3));
    fc2 = register_module("fc2", torch::nn::Linear(3, 3));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_fc2) {
    auto h = fc1(x);
    return use_fc2 ? fc2(h) : h;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Branchy);

TEST(DistributedDataParallel, ParametersWithoutGradientOnSomeRanksContributeZeros) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 2, short_timeout(), 60s, [&](Communicator& comm) {
        torch::manual_seed(0);
        Branchy net;
        Branchy reference;  // same seed sequence is not needed: compare against rank 0 alone
        DistributedDataParallel ddp(net.ptr(), comm);
        {
          torch::NoGradGuard g;
          for (auto& item : reference->named_parameters()) {
            item.value().copy_(net->named_parameters()[item.key()]);
          }
        }
        const auto x = torch::ones({2, 3});
        net->forward(x, comm.rank() == 0).sum().backward();
        reference->forward(x, true).sum().backward();
        // fc2: rank 0's gradient averaged with rank 1's zeros.
        require(torch::allclose(net->fc2->weight.grad(), reference->fc2->weight.grad() / 2),
                "unused parameter's gradient is not the average with zeros");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(DistributedDataParallel, GradientsResetToNoneAreHandled) {
  testing::TestStoreServer server;
  auto outcomes = testing::run_with_communicators(
      server, "gloo", 2, short_timeout(), 60s, [&](Communicator& comm) {
        torch::set_num_threads(1);
        TinyNet net = make_net(100 + comm.rank());
        DistributedDataParallel ddp(net.ptr(), comm);
        for (int round = 0; round < 2; ++round) {
          net->zero_grad(/*set_to_none=*/true);
          Data d = global_batch(0, comm.size());
          torch::nn::functional::cross_entropy(
              net->forward(d.x.narrow(0, comm.rank() * kPerRank, kPerRank)),
              d.y.narrow(0, comm.rank() * kPerRank, kPerRank))
              .backward();
        }
        require_mean_of_two_ranks(net, comm.size(), 1,
                                  "wrong gradient after zero_grad(set_to_none)");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

TEST(DistributedDataParallel, DeadPeerFailsBackwardInsteadOfHanging) {
  testing::TestStoreServer server;
  CommOptions options;
  options.timeout = 3s;
  auto outcomes =
      testing::run_with_communicators(server, "gloo", 2, options, 60s, [&](Communicator& comm) {
        torch::set_num_threads(1);
        TinyNet net = make_net(100);
        DistributedDataParallel ddp(net.ptr(), comm);
        if (comm.rank() == 1) _exit(0);  // leaves without taking part in the allreduce
        Data d = global_batch(0, 2);
        try {
          torch::nn::functional::cross_entropy(net->forward(d.x), d.y).backward();
        } catch (const std::exception& e) {
          require(std::string(e.what()).find("allreduce") != std::string::npos,
                  std::string("unexpected error: ") + e.what());
          return;
        }
        throw std::runtime_error("backward succeeded without the peer");
      });
  EXPECT_TRUE(testing::all_ranks_succeeded(outcomes));
}

}  // namespace
}  // namespace ddp
