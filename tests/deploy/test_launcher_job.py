#!/usr/bin/python3
"""The rendered manifests with the real ddprun, the trainer replaced by a stand-in worker
(fixtures/launcher/rank-probe, torch.distributed over gloo): the data-prep Job stages the data,
then the three training pods, each in its own network namespace, find their node ranks from the
Indexed Job, rendezvous at ddp-train-0.ddp-train through the simulated headless Service, run one
allreduce across the pods, and write to the checkpoint directory on the shared volume as uid 1000
under a read-only root. Everything but the program name is as rendered.

  test_launcher_job.py --rendered DIR --path DIR... --bind DIR..."""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import podsim  # noqa: E402

PROBE = os.path.join(HERE, "fixtures", "launcher")
results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rendered", required=True)
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--bind", action="append", default=[])
    args = parser.parse_args()
    podsim.skip_unless_root("the launcher Job test")
    binds = [os.path.abspath(d) for d in args.bind] + [PROBE]
    path = [os.path.abspath(d) for d in args.path] + [PROBE]

    with tempfile.TemporaryDirectory(prefix="ddp-launcher-job-") as work:
        os.chmod(work, 0o755)
        shared = os.path.join(work, "pvc")
        os.makedirs(shared)
        os.chown(shared, 1000, 1000)  # an EFS access point's root belongs to its uid

        prep = podsim.load_render(os.path.join(args.rendered, "data-prep.yaml"))
        with podsim.Cluster(work) as cluster:
            pods = cluster.make_pods(prep, "ddp-data-prep")
            codes = list(cluster.run_pods(pods, shared, 120, bind_dirs=binds, path_prepend=path).values())
        check("data-prep Job stages the dataset", codes == [0], f"exit {codes}")

        train = podsim.load_render(os.path.join(args.rendered, "e2e.yaml"))
        container = podsim.find(train, "Job", "ddp-train")["spec"]["template"]["spec"]["containers"][0]
        program = next(i for i, a in enumerate(container["args"]) if not a.startswith("--"))
        container["args"][program] = "rank-probe"  # the one change: the stand-in for the trainer
        with podsim.Cluster(work) as cluster:
            pods = cluster.make_pods(train, "ddp-train")
            codes = list(cluster.run_pods(pods, shared, 180, bind_dirs=binds, path_prepend=path).values())
        n = len(pods)
        check(f"{n} pods run to completion under ddprun", codes == [0] * n, f"exit codes {codes}")
        for pod in pods:
            said = "\n".join(pod.output)
            check(f"{pod.hostname}: node {pod.index} of {n} from the Indexed Job, rendezvous via the Service",
                  f"node {pod.index} of {n} (rank from JOB_COMPLETION_INDEX" in said and
                  "rendezvous at ddp-train-0.ddp-train:" in said)
        ckpt = os.path.join(shared, "checkpoints", "fashion-mnist")
        lines = sorted(open(os.path.join(ckpt, f)).read().split() for f in sorted(os.listdir(ckpt))) \
            if os.path.isdir(ckpt) else []
        expected = [[str(r), str(n), str(float(n * (n - 1) / 2)), "4"] for r in range(n)]
        check("every rank allreduced across the pods and wrote to the checkpoint directory",
              lines == expected, f"{lines}")
        owners = {os.stat(os.path.join(ckpt, f)).st_uid for f in os.listdir(ckpt)} if lines else set()
        check("as the pods' non-root user", owners == {1000}, f"owners {owners}")

    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
