# An unchanged torch.distributed program brought back by a restart: env:// init, gloo, one
# allreduce per attempt. In attempt 0 the last rank leaves once the group has formed (exit 3);
# in attempt 1 every rank must form the group again, which fails if it reads what attempt 0's
# ranks left in their store (their gloo addresses).
import os

import torch
import torch.distributed as dist

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
expected = world * (world + 1) / 2
if attempt == 0:
    if rank == world - 1:
        print(f"python rank={rank} leaves attempt 0 on purpose", flush=True)
        os._exit(3)
    dist.barrier()  # fails once the last rank has left
print(f"python rank={rank} attempt={attempt} sum={value.item()} expected={expected} "
      f"agent_store={os.environ['TORCHELASTIC_USE_AGENT_STORE']}", flush=True)
dist.destroy_process_group()
raise SystemExit(0 if value.item() == expected else 1)
