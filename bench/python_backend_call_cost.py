#!/usr/bin/python3
"""What one collective costs through the "ddprun" torch.distributed backend (lib/python), against
c10d gloo and against the library reached through its C ABI alone, per call at 4 bytes (and any
other sizes given). Run under ddprun, one job, the variants interleaved in rounds:
    ddprun --standalone --nproc-per-node N bench/python_backend_call_cost.py [SIZE_BYTES...]
with ddprun_torch importable (PYTHONPATH=build/lib/python; under ddprun it is found beside ddprun).
Prints per size: the median microseconds of dist.all_reduce on gloo, on "ddprun", and of the same
allreduce issued and waited through ctypes on the group's communicator (the library plus ctypes);
"ddprun" minus the last is what the Python ProcessGroup adds (torch's dispatch into a Python
ProcessGroup, the argument checks, its Work and op record).
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import ddprun_torch
from c10d_exit import leave
from ddprun_torch import _capi

ROUNDS, CALLS = 7, 200


def timed(call, n):
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


def raw_allreduce(group, tensor):
    err = _capi.error_buffer()
    handle = _capi.LIB.ddp_allreduce(group._comm, tensor.data_ptr(), tensor.numel(),
                                     _capi.DTYPE_FLOAT32, _capi.OP_SUM, err, len(err))
    if _capi.LIB.ddp_work_wait(handle, err, len(err)) != 0:
        _capi.raise_from(err)
    _capi.LIB.ddp_work_free(handle)


def main():
    sizes = [int(s) for s in sys.argv[1:]] or [4]
    dist.init_process_group("gloo")
    ours = dist.new_group(backend=ddprun_torch.BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    transport, hierarchical = ours.transport()
    if rank == 0:
        print(f"# torch {torch.__version__}, {world} ranks, ddprun transport {transport}"
              f"{' hierarchical' if hierarchical else ''}; median of {ROUNDS} rounds of {CALLS} "
              f"calls, variants interleaved", flush=True)
        print(f"{'bytes':>9} {'gloo us':>9} {'ddprun us':>10} {'C ABI us':>9} "
              f"{'python layer us':>16} {'gloo/ddprun':>12}", flush=True)
    for size in sizes:
        t = torch.ones(max(size // 4, 1))
        variants = {"gloo": lambda: dist.all_reduce(t),
                    "ddprun": lambda: dist.all_reduce(t, group=ours),
                    "capi": lambda: raw_allreduce(ours, t)}
        for call in variants.values():
            timed(call, 20)  # warm up
        samples = {name: [] for name in variants}
        for _ in range(ROUNDS):
            for name, call in variants.items():
                samples[name].append(timed(call, CALLS))
        med = {name: statistics.median(v) for name, v in samples.items()}
        if rank == 0:
            print(f"{size:>9} {med['gloo']:>9.1f} {med['ddprun']:>10.1f} {med['capi']:>9.1f} "
                  f"{med['ddprun'] - med['capi']:>16.1f} {med['gloo'] / med['ddprun']:>11.2f}x",
                  flush=True)
    dist.barrier()
    leave()  # not destroy_process_group: torch 2.6's gloo teardown can deadlock (c10d_exit.py)


main()
