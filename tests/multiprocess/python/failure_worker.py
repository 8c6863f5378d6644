"""One rank of the killed-rank case (ddprun_torch_test.py), started without ddprun so that
nothing but the collective itself tells the survivors: the last rank SIGKILLs itself while the
others wait in an allreduce; each survivor must raise, prints "RAISED <seconds> <message>", and
exits normally (exit 0, not an abort) with the broken group left as it is."""

import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import ddprun_torch

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("ddprun", timeout=timedelta(seconds=60))
data = torch.ones(4 << 20)
dist.all_reduce(data)  # everyone is connected and working
if rank == world - 1:
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    time.sleep(10)
start = time.monotonic()
try:
    for _ in range(1000):
        dist.all_reduce(data)
    print("NOT RAISED", flush=True)
    sys.exit(1)
except ddprun_torch.DdprunError as e:
    print(f"RAISED {time.monotonic() - start:.1f} {str(e).splitlines()[0]}", flush=True)
    sys.exit(0)  # an ordinary exit with the group broken and not destroyed: must not abort
