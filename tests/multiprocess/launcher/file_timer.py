# A worker using torchelastic's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1 in the agent):
# every rank releases a section in time; rank 1 then overstays one named "stuck_step", whose
# expiry the agent's watchdog must punish with SIGKILL and name in the failure.
import os
import time

import torch
import torch.distributed.elastic.timer as timer

rank = int(os.environ["RANK"])
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
with timer.expires(after=5, scope="warmup"):
    pass
print(f"python rank={rank} torch {torch.__version__} released warmup", flush=True)
if rank == 1:
    with timer.expires(after=1, scope="stuck_step"):
        time.sleep(60)
    print(f"python rank={rank} outlived its timer", flush=True)
