// A worker for the launcher tests and the launch benchmark: joins the group ddprun (or torchrun)
// set up, allreduces its rank+1 and checks the sum. Options shape the fault tests:
//   --print-env           print the torchrun environment contract variables
//   --iterations N        allreduce N times (default 1), --interval-ms M between them
//   --fail-rank R --exit-code C   rank R exits with C after the first allreduce
//   --first-attempt-only  apply --fail-rank only when TORCHELASTIC_RESTART_COUNT is 0
//   --topology            print the communicator's topology and whether its collectives are
//                         hierarchical, and allreduce (sum and avg) 1,000,003 floats exactly too
//   --hang-rank R --hang-at K --hang-mode sleep|skip|stop [--hang-seconds S]
//                         before iteration K's allreduce, rank R sleeps S seconds (default 10),
//                         skips that allreduce (the others then wait for it at the end), or
//                         stops itself with SIGSTOP; the hang diagnosis tests
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddp/distributed.h"
#include "ddp/exit_codes.h"

namespace {

long long unix_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  bool print_env = false;
  bool first_attempt_only = false;
  int iterations = 1;
  int interval_ms = 0;
  int fail_rank = -1;
  int exit_code = 1;
  bool topology = false;
  int hang_rank = -1;
  int hang_at = 0;
  int hang_seconds = 10;
  std::string hang_mode;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--print-env")
      print_env = true;
    else if (a == "--first-attempt-only")
      first_attempt_only = true;
    else if (a == "--iterations")
      iterations = next();
    else if (a == "--interval-ms")
      interval_ms = next();
    else if (a == "--fail-rank")
      fail_rank = next();
    else if (a == "--exit-code")
      exit_code = next();
    else if (a == "--topology")
      topology = true;
    else if (a == "--hang-rank")
      hang_rank = next();
    else if (a == "--hang-at")
      hang_at = next();
    else if (a == "--hang-seconds")
      hang_seconds = next();
    else if (a == "--hang-mode" && i + 1 < argc)
      hang_mode = argv[++i];
  }
  try {
    auto group = ddp::init_process_group();
    const int rank = group.env.rank;
    const int world = group.env.world_size;
    std::printf("worker rank=%d pid=%d local_rank=%d world=%d\n", rank, static_cast<int>(getpid()),
                group.env.local_rank, world);
    if (print_env) {
      for (const char* name :
           {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
            "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
            "TORCHELASTIC_SIGNALS_TO_HANDLE", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}) {
        const char* value = std::getenv(name);
        std::printf("env rank=%d %s=%s\n", rank, name, value != nullptr ? value : "<unset>");
      }
    }
    if (topology) {
      std::printf("rank=%d topology=%s hierarchical=%d\n", rank,
                  group.comm->topology().describe().c_str(), group.comm->hierarchical() ? 1 : 0);
      std::vector<float> large(1000003);
      for (std::size_t i = 0; i < large.size(); ++i) {
        large[i] = static_cast<float>((rank + 1) * (i % 7 + 1));
      }
      std::vector<float> average = large;
      group.comm->allreduce(large);
      group.comm->allreduce(average, ddp::ReduceOp::kAvg);
      for (std::size_t i = 0; i < large.size(); ++i) {
        const double sum = world * (world + 1) / 2.0 * static_cast<double>(i % 7 + 1);
        if (large[i] != static_cast<float>(sum) || average[i] != static_cast<float>(sum / world)) {
          std::fprintf(stderr, "rank %d: large allreduce wrong at %zu: %g and %g\n", rank, i,
                       large[i], average[i]);
          return 2;
        }
      }
      std::printf("rank=%d large allreduce ok\n", rank);
    }
    std::printf("rank=%d ops_before_loop=%llu\n", rank,
                static_cast<unsigned long long>(group.comm->flight_recorder().snapshot().begun));
    std::fflush(stdout);
    const double expected = world * (world + 1) / 2.0;
    for (int it = 0; it < iterations; ++it) {
      std::vector<float> value = {static_cast<float>(rank + 1)};
      if (rank == hang_rank && it == hang_at) {
        std::printf(
            "rank=%d hangs (%s) before allreduce #%llu\n", rank, hang_mode.c_str(),
            static_cast<unsigned long long>(group.comm->flight_recorder().snapshot().begun + 1));
        std::fflush(stdout);
        if (hang_mode == "stop") raise(SIGSTOP);
        if (hang_mode == "sleep") std::this_thread::sleep_for(std::chrono::seconds(hang_seconds));
        if (hang_mode == "skip") continue;
      }
      group.comm->allreduce(value);
      if (it == 0) std::printf("first_allreduce_unix_ns=%lld rank=%d\n", unix_ns(), rank);
      if (value[0] != expected) {
        std::fprintf(stderr, "rank %d: allreduce gave %g, expected %g\n", rank, value[0], expected);
        return 2;
      }
      if (it == 0 && rank == fail_rank && (!first_attempt_only || group.env.restart_count == 0)) {
        std::fprintf(stderr, "rank %d: failing on purpose with exit code %d\n", rank, exit_code);
        return exit_code;
      }
      std::fflush(stdout);
      if (interval_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
    }
    // Leave together: a rank that exits while a peer still reads its last collective's
    // messages can make that peer's read fail (the socket closes under it).
    const std::string leaving = "worker_exit/" + std::to_string(group.env.restart_count);
    group.store->add(leaving, 1);
    while (group.store->add(leaving, 0) < world) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::printf("rank=%d sum=%g ok attempt=%d\n", rank, expected, group.env.restart_count);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker failed: %s\n", e.what());
    return ddp::exit_code::for_exception(e);
  }
}
