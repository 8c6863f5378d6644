"""ddprun_torch: the library's collectives as the torch.distributed backend "ddprun".

    import ddprun_torch  # registers the backend
    torch.distributed.init_process_group("ddprun")      # or "cpu:ddprun,cuda:nccl"

The collectives run in libddp_capi (shared memory inside a node, topology-aware hierarchical
allreduce, gloo TCP or libfabric/EFA by DDP_BACKEND), reached through ctypes: no extension is
compiled against torch, so one copy serves every PyTorch 2.x. See README.md next to this file.
"""

import torch
import torch.distributed as dist

from ._capi import DdprunError

if int(torch.__version__.split(".")[0]) < 2:
    raise ImportError(f"ddprun_torch needs PyTorch 2.x; this is {torch.__version__}, whose c10d "
                      f"Store lacks multi_get and whose ProcessGroup cannot keep a Python Work "
                      f"alive; use gloo with it")
from ._process_group import ProcessGroupDdprun, create

__all__ = ["BACKEND", "DdprunError", "ProcessGroupDdprun"]

BACKEND = "ddprun"


def _register():
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND, create, devices=["cpu"])


_register()
