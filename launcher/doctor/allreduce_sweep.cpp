// ddprun-allreduce-sweep: the ranks `ddprun doctor` starts to measure allreduce over the chosen
// backend (DDP_BACKEND) with the job's own ranks and placement. It joins through the launcher's
// store under a prefix of its own (so a --preflight sweep and the job's workers never share a
// key), times a few sizes, and rank 0 writes the bus bandwidth of each to DDP_DOCTOR_SWEEP_FILE.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "ddp/comm/factory.h"
#include "ddp/env.h"
#include "ddp/exit_codes.h"
#include "ddp/log.h"
#include "ddp/settings.h"
#include "ddp/store.h"
#include "doctor/doctor_report.h"

int main() {
  try {
    ddp::settings::validate_all();
    const auto env = ddp::DistributedEnv::from_environment();
    ddp::log::set_rank(env.rank);
    ddp::CommOptions options;
    options.timeout = std::chrono::seconds(60);
    auto store = ddp::Store::from_env(env, options.timeout)
                     ->with_prefix("ddprun-doctor/" + std::to_string(env.restart_count));
    auto comm =
        ddp::create_communicator(ddp::backend_from_env(), store, env.rank, env.world_size, options);
    std::vector<ddprun::doctor::SweepPoint> points;
    // Sizes and repetitions so that the sweep takes a few seconds on a slow link.
    const std::vector<std::pair<long long, int>> sizes = {
        {4 << 10, 100}, {64 << 10, 40}, {1 << 20, 10}, {16 << 20, 3}};
    for (const auto& [bytes, reps] : sizes) {
      std::vector<float> data(static_cast<std::size_t>(bytes) / sizeof(float), 1.0f);
      comm->allreduce(data);  // warm-up: connections and buffers
      comm->barrier();
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) comm->allreduce(data);
      double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
      std::vector<double> slowest = {seconds};
      comm->allreduce(slowest, ddp::ReduceOp::kMax);
      seconds = slowest[0];
      const int n = env.world_size;
      const double busbw =
          n > 1 ? static_cast<double>(bytes) * 8.0 * 2.0 * (n - 1) / n / seconds / 1e9 : 0.0;
      points.push_back({bytes, seconds, busbw});
    }
    if (env.rank == 0) {
      if (const auto file = ddp::settings::text(ddp::settings::kDoctorSweepFile)) {
        std::ofstream(*file, std::ios::trunc) << ddprun::doctor::sweep_to_json(points);
      }
    }
    return ddp::exit_code::kSuccess;
  } catch (const std::exception& e) {
    ddp::log::error("{}", e.what());
    return ddp::exit_code::for_exception(e);
  }
}
