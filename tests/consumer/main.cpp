// Joins a process group and allreduces: proves the installed headers, the exported target and
// its dependencies are complete. Runs as a single process (no launcher environment).
#include <cstdio>
#include <vector>

#include "ddp/distributed.h"

int main() {
  auto group = ddp::init_process_group();
  std::vector<float> values{1.0f, 2.0f};
  group.comm->allreduce(values, ddp::ReduceOp::kSum);
  std::printf("consumer: %s rank %d of %d, sum ok=%d\n", group.comm->backend_name(),
              group.comm->rank(), group.comm->size(), values[1] == 2.0f);
  return values[1] == 2.0f ? 0 : 1;
}
