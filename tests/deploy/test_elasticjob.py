#!/usr/bin/python3
"""The rendered ElasticJob overlay (k8s/overlays/elasticjob) with the real ddprun and etcd: the
test does what the ElasticJob controller and Kubernetes would. It runs the etcd Deployment's pod
(Debian's etcd with the rendered command) behind a simulated etcd-service, and two worker pods
whose args get the controller's --rdzv_backend=etcd --rdzv_endpoint --rdzv_id --nnodes=MIN:MAX
in front; each pod has its own network namespace. The trainer is replaced by the stand-in
worker (fixtures/launcher/rank-probe: torch.distributed over gloo), and the last call is cut
from 30 s to 3 s, so that the two pods close their round without waiting for more. The pods
must rendezvous in etcd, meet at the workers' store of the round's node 0, allreduce, and write
to the shared volume.

With --etcd-image, the etcd pod runs in that image (the Dockerfile's etcd target) instead of
the host's etcd.

  test_elasticjob.py --rendered DIR --path DIR... --bind DIR... [--etcd-image TAG]"""
import argparse
import copy
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


def controller_workers(job):
    """The worker pods' Job-shaped parent, as the ElasticJob controller makes them."""
    spec = job["spec"]
    worker = spec["replicaSpecs"]["Worker"]
    template = copy.deepcopy(worker["template"])
    c = template["spec"]["containers"][0]
    c["args"] = [f"--rdzv_backend=etcd", f"--rdzv_endpoint={spec['rdzvEndpoint']}",
                 f"--rdzv_id={job['metadata']['name']}",
                 f"--nnodes={spec['minReplicas']}:{spec['maxReplicas']}"] + c["args"]
    program = next(i for i, a in enumerate(c["args"]) if not a.startswith("--"))
    c["args"][program] = "rank-probe"  # the stand-in for the trainer
    c["args"].insert(program, "--rdzv-conf=last_call_timeout=3")
    c.setdefault("env", []).append({"name": "NPROC_PER_NODE", "value": "1"})
    return {"metadata": {"name": job["metadata"]["name"] + "-worker"},
            "spec": {"completions": worker["replicas"], "template": template}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rendered", required=True)
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("--etcd-image")
    args = parser.parse_args()
    podsim.skip_unless_root("the ElasticJob test")
    if not args.etcd_image and not os.access("/usr/bin/etcd", os.X_OK):
        print("SKIP: etcd-server is not installed (scripts/install-deps installs it)")
        return 77
    binds = [os.path.abspath(d) for d in args.bind] + [PROBE]
    path = [os.path.abspath(d) for d in args.path] + [PROBE]
    objs = podsim.load_render(os.path.join(args.rendered, "elasticjob.yaml"))
    job = podsim.find(objs, "ElasticJob")
    deployment = podsim.find(objs, "Deployment")
    service = podsim.find(objs, "Service", "etcd-service")

    with tempfile.TemporaryDirectory(prefix="ddp-elasticjob-") as work:
        os.chmod(work, 0o755)
        shared = os.path.join(work, "pvc")
        os.makedirs(os.path.join(shared, "data", "fashion-mnist"))
        for d in (shared, os.path.join(shared, "data"), os.path.join(shared, "data", "fashion-mnist")):
            os.chown(d, 1000, 1000)
        with podsim.Cluster(work) as cluster:
            etcd = cluster.make_pods(objs, None, job={
                "metadata": {"name": deployment["metadata"]["name"]},
                "spec": {"completions": 1, "template": deployment["spec"]["template"]}})
            workers = cluster.make_pods(objs, None, job=controller_workers(job))
            cluster.add_service(service["metadata"]["name"], etcd[0])
            cluster.publish(etcd + workers)
            for pod in workers:
                pod.env["RANK_PROBE_MASTER"] = ",".join(p.ip for p in workers)
            codes = cluster.run_pods(etcd + workers, shared, 240, bind_dirs=binds,
                                     path_prepend=path, finish_with=workers,
                                     image={etcd[0].name: args.etcd_image} if args.etcd_image else None)
        n = len(workers)
        check(f"{n} worker pods run to completion under ddprun",
              [codes[p.name] for p in workers] == [0] * n, f"exit codes {codes}")
        check("etcd ran until the job ended", codes[etcd[0].name] is None,
              "\n".join(etcd[0].output[-5:]))
        for pod in workers:
            said = "\n".join(pod.output)
            check(f"{pod.hostname}: etcd-v2 rendezvous at the Service, one round of {n} nodes",
                  f"etcd-v2 rendezvous at {job['spec']['rdzvEndpoint']}" in said and
                  f" of {n}, ranks " in said, said[-2000:])
        serving = [p.hostname for p in workers if "serving the workers' store on port 29500" in "\n".join(p.output)]
        check("one pod, the round's node 0, serves the workers' store on --master-port", len(serving) == 1,
              f"{serving}")
        ckpt = os.path.join(shared, "checkpoints", "fashion-mnist")
        lines = sorted(open(os.path.join(ckpt, f)).read().split() for f in sorted(os.listdir(ckpt))) \
            if os.path.isdir(ckpt) else []
        expected = [[str(r), str(n), str(float(n * (n - 1) / 2)), "0"] for r in range(n)]
        check("every rank allreduced across the pods and wrote to the checkpoint directory",
              lines == expected, f"{lines}")

    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
