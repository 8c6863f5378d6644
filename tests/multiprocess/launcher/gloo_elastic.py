# An unchanged torch.distributed program in an elastic job (--nnodes MIN:MAX): each round
# (TORCHELASTIC_RESTART_COUNT) forms the group at the size it has and allreduces every 0.2 s,
# until rank 0 finds the file named by argv[1] and tells the others to finish.
import os
import sys
import time

import torch
import torch.distributed as dist

stop_file = sys.argv[1]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
first = True
while True:
    value = torch.tensor([1.0])
    dist.all_reduce(value)  # every rank counts itself once: the group's size
    if value.item() != world:
        print(f"python rank={rank} round={attempt} allreduce gave {value.item()}", flush=True)
        raise SystemExit(1)
    if first:
        print(f"python rank={rank} round={attempt} world={world} ok", flush=True)
        first = False
    stop = torch.tensor([1.0 if rank == 0 and os.path.exists(stop_file) else 0.0])
    dist.broadcast(stop, 0)
    if stop.item() == 1.0:
        break
    time.sleep(0.2)
print(f"python rank={rank} round={attempt} finished", flush=True)
dist.destroy_process_group()
