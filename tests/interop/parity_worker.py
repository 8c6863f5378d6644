# The worker of tests/interop/torchrun_parity.py: writes what its launcher gave it (environment,
# arguments) to $PARITY_OUT/rank<RANK>-attempt<TORCHELASTIC_RESTART_COUNT>.json, prints one line
# on each stream, and exits 0, or with the code $PARITY_FAIL asks of it ("RANK:CODE:ATTEMPTS":
# that rank exits CODE in its first ATTEMPTS attempts). No torch: only the launcher is compared.
import json
import os
import sys
import time

rank = os.environ.get("RANK", "?")
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
sys.stdout.write(f"parity out rank={rank} attempt={attempt}\n")
sys.stderr.write(f"parity err rank={rank} attempt={attempt}\n")
sys.stdout.flush()
sys.stderr.flush()
# Written whole or not at all (a rename): the launcher may stop this worker at any moment once
# another has failed.
out = os.path.join(os.environ["PARITY_OUT"], f"rank{rank}-attempt{attempt}.json")
with open(out + ".partial", "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv[1:]}, f, sort_keys=True)
os.rename(out + ".partial", out)
fail = os.environ.get("PARITY_FAIL", "")
if fail:
    fail_rank, code, attempts = fail.split(":")
    if rank == fail_rank and int(attempt) < int(attempts):
        # Fail only once every worker of the node has written its record: the launcher stops
        # the others at once, and what is compared must not depend on which was quicker.
        deadline = time.monotonic() + 60
        want = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        while time.monotonic() < deadline and sum(
                f.endswith(f"-attempt{attempt}.json")
                for f in os.listdir(os.environ["PARITY_OUT"])) < want:
            time.sleep(0.05)
        sys.exit(int(code))
