# A few lines on each stream, each in one write (so that two workers sharing a console cannot
# cut into each other's lines), for comparing ddprun's console with torchrun's: a plain line, a
# progress bar's "\r" and a "\r\n", and a line on stderr. No torch: only the launcher differs.
import os
import sys

rank, local_rank = os.environ["RANK"], os.environ["LOCAL_RANK"]
sys.stdout.write(f"console out rank={rank}\n")
sys.stdout.write(f"console bar rank={rank} 50%\rconsole bar rank={rank} 100%\r\n")
sys.stderr.write(f"console err rank={rank} local_rank={local_rank}\n")
