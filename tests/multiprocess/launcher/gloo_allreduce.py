# An unchanged torch.distributed program: env:// init, gloo, one allreduce. Run under ddprun
# by the interop test to show that Python workers join ddprun's agent store like torchrun's.
# With GLOO_INIT_METHOD (tcp://host:port) the script brings its own store instead, as many do,
# and GLOO_INIT_TIMEOUT (seconds) bounds the wait for it.
import datetime
import os

import torch
import torch.distributed as dist

if "GLOO_INIT_METHOD" in os.environ:
    dist.init_process_group("gloo", init_method=os.environ["GLOO_INIT_METHOD"],
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(
                                seconds=float(os.environ.get("GLOO_INIT_TIMEOUT", "300"))))
else:
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
expected = world * (world + 1) / 2
print(f"python rank={rank} world={world} sum={value.item()} expected={expected}", flush=True)
if rank == 0:
    print(f"torch {torch.__version__}", flush=True)
dist.barrier()
dist.destroy_process_group()
raise SystemExit(0 if value.item() == expected else 1)
