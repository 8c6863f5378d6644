# A torch.distributed job (gloo, env:// from the launcher) whose rank HANG_RANK holds the others
# up at iteration 5, for ddprun's hang diagnosis of Python workers:
#   sleep    sleeps SECONDS before its allreduce, then carries on
#   stop     stops itself (SIGSTOP) before it
#   skip     skips that allreduce, then sleeps SECONDS at the end instead of its last one
#   healthy  nobody hangs; each iteration sleeps 50 ms
# It registers faulthandler on SIGUSR1, as launcher/README.md tells users to.
# Usage: gloo_hang.py MODE HANG_RANK ITERATIONS SECONDS TIMEOUT_SECONDS
import datetime
import faulthandler
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

faulthandler.register(signal.SIGUSR1, all_threads=True)
mode, hang_rank, iterations, seconds, timeout = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                                 float(sys.argv[4]), float(sys.argv[5]))
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
rank = dist.get_rank()
print(f"python rank={rank} pid={os.getpid()}", flush=True)
t = torch.ones(256)
for i in range(iterations):
    if rank == hang_rank and i == 5:
        print(f"python rank={rank} hangs ({mode}) at iteration {i}", flush=True)
        if mode == "sleep":
            time.sleep(seconds)  # the line the traceback shows
        elif mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif mode == "skip":
            continue
    if mode == "skip" and rank == hang_rank and i == iterations - 1:
        time.sleep(seconds)
        break
    dist.all_reduce(t)
    if mode == "healthy":
        time.sleep(0.05)
print(f"python rank={rank} done", flush=True)
