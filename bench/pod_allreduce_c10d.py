#!/usr/bin/python3
"""The anchor of bench/simulated_pods: PyTorch's c10d gloo (torch.distributed, ProcessGroupGloo)
doing what bench/pod_allreduce does, with the same output lines:
    size_bytes median_us algbw_GBps busbw_GBps link_bytes_per_op
Run by the script once per rank with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; GLOO_SOCKET_IFNAME where the pod's interface is not the default route's).
    pod_allreduce_c10d.py SIZE_BYTES... [--iterations=N] [--min-seconds=S]
DDP_BENCH_TORCH_BACKEND=ddprun measures the library's torch.distributed backend (ddprun_torch,
found on PYTHONPATH) instead of gloo, through the same calls.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def tx_bytes(iface):
    if not iface:
        return 0
    try:
        with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
            return int(f.read())
    except OSError:  # no sysfs (a chroot without it): the column says -1
        return 0


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
    link = os.environ.get("DDP_BENCH_LINK")
    if link and not os.path.exists(f"/sys/class/net/{link}"):
        link = None
    if rank == 0:
        print(f"# c10d {backend} (torch {torch.__version__}), {world} ranks", flush=True)
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
        times = []
        sent_before = tx_bytes(link)
        for _ in range(ops):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(data)
            times.append(time.perf_counter() - start)
        sent = tx_bytes(link) - sent_before
        times.sort()
        median = times[len(times) // 2]
        algbw = size / median / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if rank == 0:
            print(f"{size} {median * 1e6:.1f} {algbw:.4f} {busbw:.4f} "
                  f"{sent // ops if link else -1}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
