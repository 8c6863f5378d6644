#!/usr/bin/python3
"""End to end, as a user runs it on a cluster, with the rendered manifests and nothing edited:
data-prep Job -> Indexed training Job (three pods, each its own network namespace and hostname,
ddprun finding its rank from the Job) -> checkpoint on the shared volume -> eval Job.
Then an eviction: SIGTERM to one pod mid-run makes the group checkpoint and exit 75, which the
Job's podFailurePolicy ignores, and the replacement pods resume from that checkpoint. Then the
failure path: a corrupt dataset makes the pods exit with codes the policy turns into FailJob,
instead of retrying.

  test_e2e.py --rendered DIR --path DIR... --bind DIR... [--train RENDER] [--image NAME]
--path: directories holding the image's programs (first on the pods' PATH); --bind: directories
the pods see at their own paths (the build tree, for the programs' libraries).
With --image the pods run the real image under podman instead of the host's binaries."""
import argparse
import glob
import os
import re
import shutil
import signal
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import podsim  # noqa: E402

results = []


def check(name, ok, detail=""):
    """Records one result; the detail is shown for a failure (and kept short for a pass)."""
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                   "Sneaker", "Bag", "Ankle boot"]


def policy_action(job, exit_codes):
    """What the Job controller does with failed pods exiting with these codes: the first
    matching podFailurePolicy rule's action, FailJob winning over the rest; Count when none."""
    actions = []
    container = job["spec"]["template"]["spec"]["containers"][0]["name"]
    for code in exit_codes:
        if code == 0:
            continue
        action = "Count"
        for rule in job["spec"].get("podFailurePolicy", {}).get("rules", []):
            on = rule.get("onExitCodes")
            if not on or on.get("containerName", container) != container:
                continue
            hit = code in on["values"]
            if hit == (on["operator"] == "In"):
                action = rule["action"]
                break
        actions.append(action)
    if "FailJob" in actions:
        return "FailJob"
    return "Count" if "Count" in actions else ("Ignore" if actions else "Succeeded")


class Run:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.bind_dirs = [os.path.abspath(d) for d in args.bind]
        self.path = [os.path.abspath(d) for d in args.path]

    def job(self, render, job_name, shared, deadline_s, when=None):
        objs = render if isinstance(render, list) else \
            podsim.load_render(os.path.join(self.args.rendered, render))
        with podsim.Cluster(self.work) as cluster:
            pods = self.pods = cluster.make_pods(objs, job_name)
            started = time.monotonic()
            codes = cluster.run_pods(pods, shared, deadline_s, bind_dirs=self.bind_dirs,
                                     path_prepend=self.path, image=self.args.image, when=when)
            elapsed = time.monotonic() - started
        print(f"e2e: {job_name}: {len(pods)} pod(s), exit codes {list(codes.values())}, "
              f"{elapsed:.1f} s", flush=True)
        return podsim.find(objs, "Job", job_name), pods, list(codes.values()), elapsed


    def longer_run(self, render):
        """The rendered training Job on three times the data, so that an eviction lands mid-run."""
        objs = podsim.load_render(os.path.join(self.args.rendered, render))
        args = podsim.find(objs, "Job", "ddp-train")["spec"]["template"]["spec"]["containers"][0]["args"]
        i = next(i for i, a in enumerate(args) if a.startswith("--train-subset="))
        args[i] = f"--train-subset={3 * int(args[i].split('=')[1])}"
        return objs


def new_volume(work, name):
    """The ReadWriteMany claim: a directory whose root belongs to the pods' uid, as an EFS
    access point's does."""
    shared = os.path.join(work, name)
    os.makedirs(shared)
    os.chown(shared, 1000, 1000)
    return shared


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rendered", required=True)
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("--image")
    parser.add_argument("--train", default="e2e.yaml", help="the rendered training Job")
    parser.add_argument("--train-deadline", type=float, default=420)
    args = parser.parse_args()
    podsim.skip_unless_root("the end-to-end pod test")

    with tempfile.TemporaryDirectory(prefix="ddp-e2e-") as work:
        os.chmod(work, 0o755)
        run = Run(args, work)
        shared = new_volume(work, "pvc")

        _, _, codes, _ = run.job("data-prep.yaml", "ddp-data-prep", shared, 120)
        staged = sorted(os.listdir(os.path.join(shared, "data", "fashion-mnist")))
        check("data-prep Job stages Fashion-MNIST onto the volume", codes == [0] and len(staged) == 4,
              f"exit {codes}, files {staged}")

        job, pods, codes, elapsed = run.job(args.train, "ddp-train", shared, args.train_deadline)
        n = len(pods)
        check(f"training Job: {n} pods run to completion", codes == [0] * n,
              f"exit codes {codes} after {elapsed:.0f} s")
        for pod in pods:
            # ddprun's first line says where each value came from.
            said = "\n".join(pod.output)
            check(f"{pod.hostname}: ddprun took node {pod.index} of {n} from the Indexed Job",
                  f"node {pod.index} of {n} (rank from JOB_COMPLETION_INDEX" in said and
                  "rendezvous at ddp-train-0.ddp-train:" in said)
        ckpt_dir = os.path.join(shared, "checkpoints", "fashion-mnist")
        written = [f for f in glob.glob(os.path.join(ckpt_dir, "**"), recursive=True)
                   if os.path.isfile(f) and os.path.getsize(f) > 0]
        check("a checkpoint is on the shared volume", written, f"files in {ckpt_dir}: {written}")
        owners = {os.stat(f).st_uid for f in written}
        check("written by the pods' non-root user", owners == {1000}, f"owners {owners}")

        _, pods, codes, _ = run.job("eval.yaml", "ddp-eval", shared, 180)
        report = "\n".join(pods[0].output)
        newest = os.path.basename(sorted(written)[-1]) if written else "?"
        check("eval Job reads the training Job's newest checkpoint", codes == [0] and newest in report,
              f"exit {codes}, newest checkpoint {newest}")
        rows = {}
        for line in pods[0].output:
            m = re.match(r"(.+?)\s+(\d+)\s+(\d+)\s+([\d.]+)%$", line.strip())
            if m:
                rows[m.group(1)] = float(m.group(4))
        check("it reports accuracy for each of the ten classes and overall",
              all(c in rows for c in FASHION_CLASSES) and "overall" in rows, f"rows {sorted(rows)}")
        check("the model trained across the pods learned (overall test accuracy > 50 %; chance is 10 %)",
              rows.get("overall", 0) > 50, f"overall {rows.get('overall')} %")

        # An eviction: SIGTERM to one pod mid-run. The group must checkpoint and exit 75, which the
        # policy ignores; the replacement pods must resume from that checkpoint and finish.
        evicted = new_volume(work, "pvc-evicted")
        shutil.copytree(os.path.join(shared, "data"), os.path.join(evicted, "data"))
        longer = run.longer_run(args.train)
        joined = []

        def training():
            if not joined and any("joined as rank" in line for p in run.pods for line in p.output):
                joined.append(time.monotonic())
            return bool(joined) and time.monotonic() - joined[0] > 3

        def evict(pids):
            print("e2e: SIGTERM to ddp-train-1, as a node drain or spot interruption sends it", flush=True)
            os.kill(pids["ddp-train-1"], signal.SIGTERM)

        job, pods, codes, _ = run.job(longer, "ddp-train", evicted, 180, when=[(training, evict)])
        stopped = sorted(glob.glob(os.path.join(evicted, "checkpoints", "fashion-mnist", "*")))
        check("eviction: the group checkpoints and every pod exits 75 (preempted)",
              codes == [75] * len(pods) and stopped, f"exit codes {codes}, checkpoints {stopped}")
        check("eviction: podFailurePolicy ignores it (no retry counted)",
              policy_action(job, codes) == "Ignore", f"exit codes {codes}")
        _, pods, codes, _ = run.job(longer, "ddp-train", evicted, args.train_deadline)
        resumed = stopped and any(f"resumed from /ckpt/fashion-mnist/{os.path.basename(stopped[-1])}" in line
                                  for line in pods[0].output)
        check("eviction: the replacement pods resume from that checkpoint and finish",
              codes == [0] * len(pods) and resumed, f"exit codes {codes}")

        # A corrupt dataset: the pods must fail fast with codes that fail the Job, not retry it.
        broken = new_volume(work, "pvc-broken")
        shutil.copytree(os.path.join(shared, "data"), os.path.join(broken, "data"))
        with open(os.path.join(broken, "data", "fashion-mnist", "train-images-idx3-ubyte.gz"), "r+b") as f:
            f.truncate(1000)
        os.makedirs(os.path.join(broken, "checkpoints"))
        os.chown(os.path.join(broken, "checkpoints"), 1000, 1000)
        job, pods, codes, elapsed = run.job(args.train, "ddp-train", broken, 120)
        check("corrupt data: every pod exits, none hangs", None not in codes and 0 not in codes,
              f"exit codes {codes} after {elapsed:.0f} s")
        check("corrupt data: podFailurePolicy fails the Job instead of retrying",
              policy_action(job, [c for c in codes if c is not None]) == "FailJob", f"exit codes {codes}")

    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
