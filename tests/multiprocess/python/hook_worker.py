"""A script for the --collectives and packaging tests: it asks for gloo (or, given "ddprun", imports
ddprun_torch itself and asks for that), allreduces, and says which backend it got
("BACKEND <name> SUM <value>")."""

import sys

import torch
import torch.distributed as dist

backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
if backend == "ddprun":
    import ddprun_torch  # noqa: F401 -- registers the backend
dist.init_process_group(backend)
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"BACKEND {dist.get_backend()} SUM {t[0].item():.0f}", flush=True)
dist.destroy_process_group()
