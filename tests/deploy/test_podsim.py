#!/usr/bin/python3
"""The pod simulator's own test: a three-pod Indexed Job (fixtures/harness) checks from inside
each pod what Kubernetes promises it; a failing pod's exit code comes back; a hung pod group is
killed at its deadline; nothing is left behind."""
import copy
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import podsim  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "harness")


def leftovers():
    mine = f"{podsim.NETNS_PREFIX}{os.getpid()}-"
    ns = [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                      text=True).stdout.splitlines() if line.split()]
    etc = os.listdir("/etc/netns") if os.path.isdir("/etc/netns") else []
    return [n for n in ns + etc if n.startswith(mine)]


def run_job(objs, deadline_s, when=None):
    with tempfile.TemporaryDirectory(prefix="podsim-test-") as work:
        shared = os.path.join(work, "pvc")
        os.makedirs(os.path.join(shared, "data"))
        with open(os.path.join(shared, "data", "input.txt"), "w") as f:
            f.write("staged\n")
        for d in (shared, os.path.join(shared, "data")):
            os.chown(d, 1000, 1000)
        os.chmod(work, 0o755)
        with podsim.Cluster(work) as cluster:
            pods = cluster.make_pods(objs, "probe")
            started = time.monotonic()
            codes = cluster.run_pods(pods, shared, deadline_s, bind_dirs=[FIXTURE],
                                     path_prepend=[FIXTURE], when=when)
            elapsed = time.monotonic() - started
            collected = None
            path = os.path.join(shared, "out", "collected.txt")
            if os.path.exists(path):
                collected = open(path).read().splitlines()
        return codes, collected, elapsed


def main():
    podsim.skip_unless_root("the pod simulation test")
    objs = podsim.load_render(os.path.join(FIXTURE, "job.yaml"))
    results = []

    def check(name, ok, detail=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)

    codes, collected, _ = run_job(objs, deadline_s=60)
    check("three pods keep every promise and exit 0", list(codes.values()) == [0, 0, 0], str(codes))
    hosts = [line.split()[1] for line in collected or []]
    check("pod 0 heard from every peer over the simulated network",
          hosts == ["probe-0", "probe-1", "probe-2"], str(collected))

    wrong = copy.deepcopy(objs)
    podsim.find(wrong, "ConfigMap", "probe-env")["data"]["GREETING"] = "bye"
    codes, _, _ = run_job(wrong, deadline_s=60)
    check("a pod's failure comes back as its exit code", list(codes.values()) == [1, 1, 1], str(codes))

    hung = copy.deepcopy(objs)
    container = podsim.find(hung, "Job", "probe")["spec"]["template"]["spec"]["containers"][0]
    container["command"], container["args"] = ["sleep"], ["600"]
    evict = (lambda: True, lambda pids: os.kill(pids["probe-1"], signal.SIGTERM))
    codes, _, elapsed = run_job(hung, deadline_s=3, when=[evict])
    check("a signal sent while pods run reaches that pod: exit 128 + SIGTERM",
          list(codes.values())[1] == 143, str(codes))
    check("a hung group is killed at its deadline", list(codes.values())[0::2] == [None] * 2 and elapsed < 15,
          f"{codes} after {elapsed:.1f} s")

    check("no namespace or /etc/netns entry left behind", leftovers() == [], str(leftovers()))
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
