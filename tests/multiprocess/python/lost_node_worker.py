"""One rank of the lost-node case (ddprun_torch_test.py): under ddprun, one rank per node, it
allreduces every 20 ms until told to stop. When the other node falls silent, ddprun writes an
abort notice naming it (lib/src/comm/abort_notice.h); this rank, blocked in the allreduce, must
end with that reason rather than wait out the op timeout. Over libfabric the collective raises
DdprunError, printed as "RAISED <message>"; over gloo, whose wait cannot be woken, the library
ends the process with the collective's exit code (70) after its grace."""

import os
import sys
import time

import torch
import torch.distributed as dist

import ddprun_torch

dist.init_process_group("ddprun")
data = torch.ones(1 << 14)
dist.all_reduce(data)
print(f"READY rank={dist.get_rank()} pid={os.getpid()}", flush=True)
try:
    for _ in range(100000):
        dist.all_reduce(data.fill_(1.0))
        time.sleep(0.02)
    print("NOT RAISED", flush=True)
    sys.exit(1)
except ddprun_torch.DdprunError as e:
    print(f"RAISED {str(e).splitlines()[0]}", flush=True)
    sys.exit(70)
