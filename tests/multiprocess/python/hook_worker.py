"""An unchanged script for the --collectives test: it asks for gloo, allreduces, and says which
backend it got ("BACKEND <name> SUM <value>")."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"BACKEND {dist.get_backend()} SUM {t[0].item():.0f}", flush=True)
dist.destroy_process_group()
