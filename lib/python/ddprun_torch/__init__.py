"""ddprun_torch: the library's collectives as the torch.distributed backend "ddprun".

    import ddprun_torch  # registers the backend
    torch.distributed.init_process_group("ddprun")      # or "cpu:ddprun,cuda:nccl"

The collectives run in libddp_capi (shared memory inside a node, topology-aware hierarchical
allreduce, gloo TCP or libfabric/EFA by DDP_BACKEND), reached through ctypes: no extension is
compiled against torch, so one copy serves every PyTorch 2.x. See README.md next to this file.
"""

import torch.distributed as dist

from ._capi import DdprunError
from ._process_group import ProcessGroupDdprun, create

__all__ = ["BACKEND", "DdprunError", "ProcessGroupDdprun"]

BACKEND = "ddprun"


def _register():
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    try:
        dist.Backend.register_backend(BACKEND, create, devices=["cpu"])
    except TypeError:  # torch 1.13: no devices argument
        dist.Backend.register_backend(BACKEND, create)


_register()
