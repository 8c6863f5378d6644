#!/usr/bin/python3
"""The anchor of bench/simulated_pods: PyTorch's c10d gloo (torch.distributed, ProcessGroupGloo)
doing what bench/pod_allreduce does, with the same output lines:
    size_bytes median_us algbw_GBps busbw_GBps link_bytes_per_op
Run by the script once per rank with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; GLOO_SOCKET_IFNAME where the pod's interface is not the default route's).
    pod_allreduce_c10d.py SIZE_BYTES... [--iterations=N] [--min-seconds=S]
DDP_BENCH_TORCH_BACKEND=ddprun measures the library's torch.distributed backend (ddprun_torch,
found on PYTHONPATH) instead of gloo, through the same calls.
DDP_BENCH_BATCH=1 times back-to-back ops instead: 5 batches, each started by a barrier, its time
per op the slowest rank's (as nccl-tests does). Timing one op from a barrier on rank 0 alone
favours a backend whose barrier lets rank 0 go last, since the others have started by then;
batches measure what a training step's bucket after bucket sees.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

from c10d_exit import leave


def tx_bytes(iface):
    if not iface:
        return 0
    try:
        with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:  # no sysfs (a chroot without it): the column says -1
        return 0


def timed_ops(data, ops):
    times = []
    for _ in range(ops):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(data)
        times.append(time.perf_counter() - start)
    return times, ops


def timed_batches(data, ops, batches=5):
    times = []
    per_batch = max(ops // batches, 1)
    for _ in range(batches):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(per_batch):
            dist.all_reduce(data)
        slowest = torch.tensor([(time.perf_counter() - start) / per_batch], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times.append(float(slowest))
    return times, batches * per_batch


def main():
    sizes, iterations, min_seconds = [], 20, 1.0
    for arg in sys.argv[1:]:
        if arg.startswith("--iterations="):
            iterations = int(arg.split("=", 1)[1])
        elif arg.startswith("--min-seconds="):
            min_seconds = float(arg.split("=", 1)[1])
        else:
            sizes.append(int(arg))
    backend = os.environ.get("DDP_BENCH_TORCH_BACKEND", "gloo")
    if backend == "ddprun":
        import ddprun_torch  # noqa: F401 -- registers the backend
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = os.environ.get("DDP_BENCH_BATCH") == "1"
    link = os.environ.get("DDP_BENCH_LINK")
    if link and not os.path.exists(f"/sys/class/net/{link}"):
        link = None
    if rank == 0:
        print(f"# c10d {backend} (torch {torch.__version__}), {world} ranks"
              f"{', back-to-back batches' if batch else ''}", flush=True)
    for size in sizes:
        data = torch.ones(size // 4, dtype=torch.float32)
        dist.all_reduce(data)
        dist.all_reduce(data)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(data)
        one = time.perf_counter() - start
        count = torch.tensor([float(min(max(int(min_seconds / max(one, 1e-6)), iterations), 2000))])
        dist.broadcast(count, 0)
        ops = int(count.item())
        sent_before = tx_bytes(link)
        times, ops = timed_batches(data, ops) if batch else timed_ops(data, ops)
        sent = tx_bytes(link) - sent_before
        times.sort()
        median = times[len(times) // 2]
        algbw = size / median / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if rank == 0:
            print(f"{size} {median * 1e6:.1f} {algbw:.4f} {busbw:.4f} "
                  f"{sent // ops if link else -1}", flush=True)
    dist.barrier()
    leave()


if __name__ == "__main__":
    main()
