#!/usr/bin/python3
"""The container image, built for real from docker/Dockerfile (docker/build-offline: podman, a
debootstrap debian:bookworm base, no registry), then run: `ddprun --help`, its contents (only the
runtime, non-root), and the end-to-end Jobs with every pod a container of this image in its own
network namespace (test_e2e.py --image): data prep, two-pod training, eval. With --mpijob, the
image's mpi target too (Open MPI and sshd added), and the MPIJob overlay run in it as the MPI
operator runs it (test_mpijob.py). With --elasticjob, the etcd target too, and the ElasticJob
overlay's etcd pod run in it (test_elasticjob.py --etcd-image).

  test_image.py --repo DIR --rendered DIR --program NAME... [--e2e] [--mpijob] [--elasticjob] [--tag NAME] [--jobs N]
                [--platform linux/arm64]
--program: what /usr/local/bin must hold, exactly; --e2e: also run the Jobs in the image.
--platform: another architecture's image (docker/build-offline --platform, under qemu): the same
checks, then its two pods train train_mnist on a Fashion-MNIST subset to at least 45 %."""
import argparse
import os
import shutil
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import podsim  # noqa: E402

results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    return ok


def podman(*args, timeout=120):
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


POD_CHECK = ('test "$WORLD_SIZE" = 2 && test "$MASTER_ADDR" = ddp-train-0.ddp-train '
             '&& echo "$RANK of $WORLD_SIZE" > /ckpt/rank$RANK')
# The image's train_mnist on a Fashion-MNIST subset (the image's own dataset package), sized for
# emulation: rank 0's metrics and each rank's machine name land on the shared volume.
POD_TRAIN = ('train_mnist --train-subset 1000 --test-subset 300 --epochs 1 --threads 1 '
             '--log-every 0 --metrics /ckpt/metrics.jsonl '
             '&& echo "$RANK of $WORLD_SIZE $(uname -m)" > /ckpt/rank$RANK')


def launcher_pods_in_image(args, command=POD_CHECK, timeout=120):
    """The rendered two-pod Job, each pod a container of the image in its own network namespace,
    with a shell command standing in for the trainer: ddprun must find its rank from the Job,
    rendezvous through the simulated Service and start workers that see the group and can write
    to the checkpoint volume (as uid 1000, under a read-only root). Returns (ok, detail, lines
    written to the volume); with POD_TRAIN, also the accuracy rank 0 logged."""
    import tempfile
    objs = podsim.load_render(os.path.join(args.rendered, "e2e-2pods.yaml"))
    container = podsim.find(objs, "Job", "ddp-train")["spec"]["template"]["spec"]["containers"][0]
    program = next(i for i, a in enumerate(container["args"]) if not a.startswith("--"))
    container["args"][program:] = ["/bin/sh", "-c", command]
    with tempfile.TemporaryDirectory(prefix="ddp-image-pods-") as work:
        os.chmod(work, 0o755)
        shared = os.path.join(work, "pvc")
        os.makedirs(os.path.join(shared, "data"))
        for d in (shared, os.path.join(shared, "data")):
            os.chown(d, 1000, 1000)
        with podsim.Cluster(work) as cluster:
            pods = cluster.make_pods(objs, "ddp-train")
            codes = list(cluster.run_pods(pods, shared, timeout, image=args.tag).values())
        ckpt = os.path.join(shared, "checkpoints")
        wrote = sorted(open(os.path.join(ckpt, f)).read().strip() for f in os.listdir(ckpt)
                       if f.startswith("rank")) if os.path.isdir(ckpt) else []
        metrics = os.path.join(ckpt, "metrics.jsonl")
        accuracy = re.findall(r'"test_accuracy":([0-9.]+)', open(metrics).read()) \
            if os.path.exists(metrics) else []
    if command == POD_CHECK:
        return codes == [0, 0] and wrote == ["0 of 2", "1 of 2"], f"exit codes {codes}, wrote {wrote}"
    machine = platform_machine(args)
    good = (codes == [0, 0] and wrote == [f"0 of 2 {machine}", f"1 of 2 {machine}"] and accuracy and
            float(accuracy[-1]) >= 0.45)
    return good, f"exit codes {codes}, wrote {wrote}, test accuracy {accuracy[-1:] or 'none'} (needs 0.45)"


def platform_machine(args):
    """What `uname -m` says in a container of --platform (qemu answers for the emulated one)."""
    return {"linux/arm64": "aarch64", "linux/amd64": "x86_64"}.get(args.platform, os.uname().machine)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--rendered", required=True)
    parser.add_argument("--tag", default="localhost/ddprun:test")
    parser.add_argument("--jobs", default="2")
    parser.add_argument("--program", action="append", default=[])
    parser.add_argument("--e2e", action="store_true")
    parser.add_argument("--mpijob", action="store_true",
                        help="also build the mpi target and run the MPIJob overlay in it")
    parser.add_argument("--mpi-tag", default="localhost/ddprun-mpi:test")
    parser.add_argument("--elasticjob", action="store_true",
                        help="also build the etcd target and run the ElasticJob overlay's etcd in it")
    parser.add_argument("--etcd-tag", default="localhost/ddprun-etcd:test")
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--bind", action="append", default=[])
    parser.add_argument("--platform", default=None,
                        help="build and check the image of this platform (linux/arm64: under qemu, "
                             "and its pods train train_mnist); the Jobs of --e2e, --mpijob and "
                             "--elasticjob run on this machine's own")
    args = parser.parse_args()
    if args.platform and (args.e2e or args.mpijob or args.elasticjob):
        print("FAIL: --platform checks the one image; --e2e, --mpijob and --elasticjob run without it")
        return 1
    podsim.skip_unless_root("the image test")
    for tool in ("podman", "runc", "debootstrap"):
        if not shutil.which(tool):
            print(f"FAIL: {tool} is missing; scripts/install-deps installs it")
            return 1
    os.environ.setdefault("CONTAINERS_CONF", os.path.join(args.repo, "docker", "podman-containers.conf"))

    started = time.monotonic()
    build = subprocess.run([os.path.join(args.repo, "docker", "build-offline"), "--tag", args.tag,
                            "--jobs", args.jobs] + (["--platform", args.platform] if args.platform else []))
    print(f"image: build took {time.monotonic() - started:.0f} s", flush=True)
    if not check("the image builds from docker/Dockerfile", build.returncode == 0, f"exit {build.returncode}"):
        print("0 passed, 1 failed")
        return 1

    r = podman("run", "--rm", args.tag)
    check("the entrypoint is ddprun: the default command prints its help",
          r.returncode == 0 and "--nproc-per-node" in r.stdout + r.stderr,
          f"exit {r.returncode}: {(r.stdout + r.stderr)[:300]}")

    r = podman("run", "--rm", "--entrypoint", "sh", args.tag, "-c",
               "ls /usr/local/bin; echo uid=$(id -u); "
               "for t in c++ g++ cmake ninja; do command -v $t; done; true")
    out = r.stdout.split()
    tools = sorted(t for t in out if "/" not in t and not t.startswith("uid="))
    check("the image carries ddprun (and its doctor's sweep), the examples and the stager, nothing else in /usr/local/bin",
          tools == sorted(args.program),
          f"{tools}")
    check("it runs as uid 1000, not root", "uid=1000" in out, " ".join(t for t in out if t.startswith("uid=")))
    check("no build toolchain in the runtime image", not [t for t in out if t.startswith("/")],
          f"{[t for t in out if t.startswith('/')]}")
    r = podman("image", "inspect", "--format", "{{.Size}}", args.tag)
    print(f"image: {args.tag} is {int(r.stdout.strip() or 0) / 2**20:.0f} MiB", flush=True)

    r = podman("image", "inspect", "--format", "{{.Architecture}}", args.tag)
    want = (args.platform or "linux/" + {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine]).split("/")[1]
    check(f"the image is built for {want}", r.stdout.strip() == want, r.stdout.strip())
    check("two pods of the rendered Job run ddprun in the image and form one group",
          *launcher_pods_in_image(args))
    if args.platform:
        started = time.monotonic()
        ok, detail = launcher_pods_in_image(args, POD_TRAIN, timeout=900)
        check(f"two pods of the {args.platform} image train train_mnist as one group", ok,
              f"{detail}, {time.monotonic() - started:.0f} s")

    if args.e2e:
        started = time.monotonic()
        e2e = subprocess.run([sys.executable, os.path.join(HERE, "test_e2e.py"), "--rendered", args.rendered,
                              "--train", "e2e-2pods.yaml", "--image", args.tag])
        check("data prep, two-pod training and eval run in the image as simulated pods",
              e2e.returncode == 0, f"exit {e2e.returncode} after {time.monotonic() - started:.0f} s")
    if args.mpijob:
        mpi_image(args)
    if args.elasticjob:
        etcd_image(args)

    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


def build_target(args, target, tag):
    """docker/build-offline --target TARGET --tag TAG; whether it built (a check)."""
    started = time.monotonic()
    build = subprocess.run([os.path.join(args.repo, "docker", "build-offline"), "--tag", tag,
                            "--jobs", args.jobs, "--target", target])
    print(f"image: the {target} target took {time.monotonic() - started:.0f} s", flush=True)
    return check(f"the {target} target builds", build.returncode == 0, f"exit {build.returncode}")


def etcd_image(args):
    """The etcd target (Debian's etcd-server), then the ElasticJob overlay with its etcd in it."""
    if not build_target(args, "etcd", args.etcd_tag):
        return
    r = podman("run", "--rm", "--entrypoint", "sh", args.etcd_tag, "-c", "id -u; etcd --version")
    check("the etcd target runs etcd 3.4 or newer as uid 1000",
          r.stdout.startswith("1000\n") and re.search(r"etcd Version: 3\.([4-9]|\d\d)", r.stdout),
          f"{r.stdout.strip()[:200]} {r.stderr.strip()[:200]}")
    r = podman("image", "inspect", "--format", "{{.Size}}", args.etcd_tag)
    print(f"image: {args.etcd_tag} is {int(r.stdout.strip() or 0) / 2**20:.0f} MiB", flush=True)
    job = subprocess.run([sys.executable, os.path.join(HERE, "test_elasticjob.py"), "--rendered", args.rendered,
                          "--etcd-image", args.etcd_tag]
                         + [f"--path={p}" for p in args.path] + [f"--bind={b}" for b in args.bind])
    check("the ElasticJob overlay rendezvous in etcd running in the etcd target",
          job.returncode == 0, f"exit {job.returncode}")


def mpi_image(args):
    """The mpi target (the runtime image plus Open MPI and sshd), then the MPIJob overlay in it."""
    if not build_target(args, "mpi", args.mpi_tag):
        return
    r = podman("run", "--rm", "--entrypoint", "sh", args.mpi_tag, "-c",
               "id -u; getent passwd ddp | cut -d: -f7; "
               "for t in mpirun sshd ssh orted; do command -v $t; done; ls /etc/ssh | grep -c _key")
    out = r.stdout.split("\n")
    check("the mpi target runs as uid 1000 with a login shell, has mpirun, orted, ssh and sshd, "
          "and no host keys of its own",
          out[0] == "1000" and out[1] == "/bin/bash" and out[-2] == "0" and
          all(any(line.endswith("/" + t) for line in out) for t in ("mpirun", "sshd", "ssh", "orted")),
          f"{r.stdout.strip()[:400]} {r.stderr.strip()[:200]}")
    r = podman("image", "inspect", "--format", "{{json .Config.Cmd}}", args.mpi_tag)
    check("the mpi target's default command is sshd as the user, as the MPIJob's workers run it",
          "sshd" in r.stdout and ".sshd_config" in r.stdout, r.stdout.strip())
    started = time.monotonic()
    job = subprocess.run([sys.executable, os.path.join(HERE, "test_mpijob.py"), "--rendered", args.rendered,
                          "--image", args.mpi_tag,
                          "--prepare-data", os.path.join(args.repo, "docker", "ddp-prepare-data")])
    check("the MPIJob overlay runs in the mpi target as the MPI operator runs it",
          job.returncode == 0, f"exit {job.returncode} after {time.monotonic() - started:.0f} s")

    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
