"""The "ddprun" torch.distributed backend (lib/python/ddprun_torch) with PyTorch 2.6 workers.

    ddprun_torch_test.py DDPRUN PYTHON_PACKAGE_DIR INTEROP_DIR [WORLDS]
    ddprun_torch_test.py --recipe-only DDPRUN PYTHON_PACKAGE_DIR INTEROP_DIR

Runs conformance_worker.py under ddprun at each world size (default 1 2 3 4), its workers being
the trixie root's torch 2.6 (tests/interop/torch2-python), and requires every rank to report its
cases passed; over libfabric at 2 and 3; and at 2 pods x 2 ranks (hierarchical collectives).
Then trains ddp_worker.py at 2 ranks on gloo and on ddprun (plain, no_sync accumulation, the bf16
and fp16 compression hooks) and requires the same losses (1e-5) and accuracy; checks that
--collectives ddprun gives an unchanged gloo script the "ddprun" backend; that a rank SIGKILLed
mid-allreduce makes the others raise within the op timeout; and that ddprun's abort notice for a
node lost by its heartbeat ends the other node's blocked allreduce with the reason (gloo and
libfabric). Each job has a hard bound and is killed by process group. Exits 77 (skip) without
root or the root, saying why. --recipe-only runs the copy recipe alone (the arm64 label, with an
arm64 ddprun and package and DDP_TORCH2_ROOT naming the arm64 root).
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOB_SECONDS = 300
DATASETS = "/usr/share/datasets"


def run_job(ddprun, package_dir, interop_dir, world, script_args, flags=(), python_path=True,
            extra_env=None):
    """Runs one job to its end or its bound; returns (exit code or None, output, seconds)."""
    env = dict(os.environ, **(extra_env or {}))
    env.update({
        "PYTHON_EXEC": os.path.join(interop_dir, "torch2-python"),
        "DDP_TORCH2_BIND": ":".join([HERE, interop_dir, package_dir, DATASETS]),
        "GLOO_SOCKET_IFNAME": "lo",
    })
    env.pop("PYTHONPATH", None)
    if python_path:
        env["PYTHONPATH"] = package_dir
    argv = [ddprun, "--standalone", "--nproc-per-node", str(world), *flags,
            os.path.join(HERE, script_args[0])] + script_args[1:]
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=JOB_SECONDS)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n(killed: still running after {JOB_SECONDS} s)"
        code = None
    return code, out, time.monotonic() - start


def conformance(ddprun, package_dir, interop_dir, world, backend="gloo"):
    code, out, seconds = run_job(ddprun, package_dir, interop_dir, world,
                                 ["conformance_worker.py"], extra_env={"DDP_BACKEND": backend})
    reports = re.findall(r"CONFORMANCE rank=(\d+) passed=(\d+) failed=(\d+)", out)
    ok = (code == 0 and len(reports) == world and
          all(int(failed) == 0 and int(passed) > 0 for _, passed, failed in reports))
    if not ok:
        print(out)
    cases = reports[0][1] if reports else "?"
    transports = set(re.findall(r"transport=(\w+)", out))
    ok = ok and transports == {backend}
    print(f"{'ok  ' if ok else 'FAIL'} conformance world {world} over {transports}: {cases} "
          f"cases per rank, "
          f"exit {code}, {seconds:.1f} s", flush=True)
    return ok


def two_pods(ddprun, package_dir, interop_dir):
    """Conformance at 2 pods x 2 ranks: each agent in a UTS and IPC namespace of its own (its own
    hostname), as a Kubernetes pod is, on loopback. The library then sees two nodes and runs its
    hierarchical collectives, which must agree with gloo as the flat ones do."""
    env = dict(os.environ, PYTHON_EXEC=os.path.join(interop_dir, "torch2-python"),
               DDP_TORCH2_BIND=":".join([HERE, interop_dir, package_dir]), PYTHONPATH=package_dir,
               GLOO_SOCKET_IFNAME="lo")
    port = free_port()
    agents = []
    for node in range(2):
        argv = ["unshare", "--uts", "--ipc", "sh", "-c", f'hostname ddprun-pod{node} && exec "$@"',
                "sh", ddprun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(port),
                os.path.join(HERE, "conformance_worker.py")]
        agents.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True,
                                       start_new_session=True))
    outs, codes = collect(agents, JOB_SECONDS)
    out = "\n".join(outs)
    reports = re.findall(r"CONFORMANCE rank=(\d+) passed=(\d+) failed=(\d+)", out)
    hierarchical = re.findall(r"hierarchical=(True|False)", out)
    ok = (codes == [0, 0] and len(reports) == 4 and all(f == "0" for _, _, f in reports) and
          hierarchical == ["True"] * 4)
    if not ok:
        print(out)
    print(f"{'ok  ' if ok else 'FAIL'} conformance 2 pods x 2 ranks: hierarchical {hierarchical}, "
          f"{reports[0][1] if reports else '?'} cases per rank, exits {codes}", flush=True)
    return ok


def training(ddprun, package_dir, interop_dir, mode):
    """The same DDP training on gloo and on ddprun: losses within 1e-5, equal accuracy."""
    runs = {}
    for backend in ("gloo", "ddprun"):
        code, out, seconds = run_job(ddprun, package_dir, interop_dir, 2,
                                     ["ddp_worker.py", backend, mode])
        if code != 0:
            print(out)
            print(f"FAIL ddp {mode} on {backend}: exit {code}", flush=True)
            return False
        losses = [float(x) for x in re.findall(r"STEP \d+ loss=([-0-9.e]+)", out)]
        accuracy = re.findall(r"ACCURACY ([0-9.]+)", out)
        runs[backend] = (losses, accuracy, seconds)
    (gl, ga, gs), (dl, da, ds) = runs["gloo"], runs["ddprun"]
    worst = max((abs(a - b) for a, b in zip(gl, dl)), default=float("inf"))
    ok = len(gl) == len(dl) > 0 and worst <= 1e-5 and ga == da and len(ga) == 1
    print(f"{'ok  ' if ok else 'FAIL'} ddp {mode}: {len(dl)} steps, largest loss difference "
          f"{worst:.2e}, accuracy gloo {ga} ddprun {da} ({gs:.1f} s / {ds:.1f} s)", flush=True)
    return ok


def killed_rank(package_dir, interop_dir, world=3, timeout_s=10):
    """A rank SIGKILLed mid-allreduce: every survivor raises within the op timeout."""
    env = dict(os.environ)
    port = free_port()
    env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
                "PYTHONPATH": package_dir, "DDP_TIMEOUT_SEC": str(timeout_s),
                "DDP_TORCH2_BIND": ":".join([HERE, interop_dir, package_dir])})
    procs = []
    for r in range(world):
        env_r = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        procs.append(subprocess.Popen(
            [os.path.join(interop_dir, "torch2-python"), os.path.join(HERE, "failure_worker.py")],
            env=env_r, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True))
    outs, codes = collect(procs, timeout_s + 60)
    raised = [re.search(r"RAISED ([0-9.]+) (.*)", o) for o in outs[:-1]]
    ok = (all(m and float(m.group(1)) <= timeout_s for m in raised) and
          codes[-1] == -signal.SIGKILL and all(c == 0 for c in codes[:-1]))
    if not ok:
        print("\n".join(outs))
    times = [m.group(1) + " s" for m in raised if m]
    print(f"{'ok  ' if ok else 'FAIL'} killed rank: survivors raised after {times} "
          f"(op timeout {timeout_s} s) and exited {codes[:-1]}: "
          f"{raised[0].group(2) if raised[0] else '-'}", flush=True)
    return ok


class Streamed:
    """A process whose output is read as it comes (a thread per process), to act on its lines."""

    def __init__(self, argv, env):
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self):
        return "".join(self.lines)

    def wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output())
            if found or self.proc.poll() is not None:
                return re.search(pattern, self.output())
            time.sleep(0.05)
        return None

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.reader.join(5)


def lost_node(ddprun, package_dir, interop_dir, backend):
    """Two nodes of one rank each (heartbeat every 0.3 s, limit 3), allreducing through "ddprun"
    with a long op timeout (600 s). Node 1's agent and worker stop without closing a socket
    (SIGSTOP). Node 0's ddprun declares it lost by its heartbeat and writes the abort notice;
    node 0's worker, blocked in the allreduce, must end with "aborted by ddprun: node 1 (...)"
    within seconds and unkilled: over libfabric the op raises DdprunError in Python, over gloo the
    library ends the process with 70 after its 1 s grace, as for C++ workers."""
    env = dict(os.environ, PYTHON_EXEC=os.path.join(interop_dir, "torch2-python"),
               DDP_TORCH2_BIND=":".join([HERE, interop_dir, package_dir]), PYTHONPATH=package_dir,
               GLOO_SOCKET_IFNAME="lo", DDP_BACKEND=backend, DDP_TIMEOUT_SEC="600")
    port = free_port()
    nodes = [Streamed(["unshare", "--uts", "sh", "-c", f'hostname ddprun-node{n} && exec "$@"', "sh",
                       ddprun, "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "1",
                       "--master-addr", "127.0.0.1", "--master-port", str(port),
                       "--rdzv-conf", "keep_alive_interval=0.3,keep_alive_max_attempt=3",
                       os.path.join(HERE, "lost_node_worker.py")], env) for n in range(2)]
    stopped = []
    try:
        ready = [node.wait_for(r"READY rank=\d+ pid=(\d+)", JOB_SECONDS) for node in nodes]
        if not all(ready):
            print("\n".join(node.output() for node in nodes))
            print(f"FAIL lost node over {backend}: the workers did not start", flush=True)
            return False
        stopped = [nodes[1].proc.pid, int(ready[1].group(1))]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        try:
            code = nodes[0].proc.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - start
        nodes[0].reader.join(5)
        out = nodes[0].output()
        worker = (r"RAISED .*aborted by ddprun: node 1 \(" if backend == "fabric" else
                  r"aborted by ddprun: node 1 \(")
        ok = (code == 70 and took < 20 and re.search(worker, out) is not None and
              "was lost: no heartbeat for 0.9 s" in out and "sending SIGKILL" not in out)
        if not ok:
            print(out)
        reason = re.search(r"aborted by ddprun: [^\n]*", out)
        print(f"{'ok  ' if ok else 'FAIL'} lost node over {backend}: node 0 exited {code} "
              f"{took:.1f} s after node 1 fell silent; worker: "
              f"{reason.group(0)[:90] if reason else '-'}", flush=True)
        return ok
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for node in nodes:
            node.kill()


def collect(procs, timeout):
    """Each process's output and exit code (None: killed at the deadline, with every other
    process of the job, by process group)."""
    outs, codes = [], []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
            codes.append(p.returncode)
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            outs.append(p.communicate()[0] + "\n(killed at the deadline)")
            codes.append(None)
    return outs, codes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hook(ddprun, package_dir, interop_dir):
    """An unchanged script that asks for gloo gets "ddprun" under --collectives ddprun (ddprun
    finds ddprun_torch beside itself: no PYTHONPATH is given), and gloo without the flag."""
    ok = True
    for flags, want in (((), "gloo"), (("--collectives", "ddprun"), "ddprun")):
        code, out, seconds = run_job(ddprun, package_dir, interop_dir, 2, ["hook_worker.py"],
                                     flags, python_path=False)
        got = re.findall(r"BACKEND (\S+) SUM (\d+)", out)
        announced = "CPU collectives on the ddprun backend" in out
        good = (code == 0 and got == [(want, "3")] * 2 and announced == (want == "ddprun"))
        if not good:
            print(out)
        ok = ok and good
        print(f"{'ok  ' if good else 'FAIL'} hook {' '.join(flags) or '(no flag)'}: backends "
              f"{[g[0] for g in got]}, exit {code}, {seconds:.1f} s", flush=True)
    return ok


def copied_recipe(ddprun, package_dir, interop_dir):
    """k8s/README.md's recipe for a user's own image: ddprun and ddprun_torch copied into
    /usr/local of a PyTorch 2.6 system (here a folder bound into the trixie root), ddprun running
    inside it with that root's python3. A script that imports ddprun_torch finds it with no
    PYTHONPATH, and --collectives ddprun turns an unchanged gloo script to "ddprun"."""
    stage = tempfile.mkdtemp(prefix="ddprun-recipe-", dir="/tmp")
    try:
        prefix = os.path.join(stage, "usr", "local")
        os.makedirs(os.path.join(prefix, "bin"))
        shutil.copy2(ddprun, os.path.join(prefix, "bin", "ddprun"))
        shutil.copytree(os.path.join(package_dir, "ddprun_torch"),
                        os.path.join(prefix, "lib", "python3", "dist-packages", "ddprun_torch"))
        ok = True
        for args in (["hook_worker.py", "ddprun"], ["--collectives", "ddprun", "hook_worker.py"]):
            env = dict(os.environ, DDP_TORCH2_EXEC=os.path.join(prefix, "bin", "ddprun"),
                       DDP_TORCH2_BIND=":".join([HERE, interop_dir]), GLOO_SOCKET_IFNAME="lo")
            env.pop("PYTHONPATH", None)
            env.pop("PYTHON_EXEC", None)
            script = args.index("hook_worker.py")
            argv = ([os.path.join(interop_dir, "torch2-python"), "--standalone",
                     "--nproc-per-node", "2"] + args[:script] +
                    [os.path.join(HERE, "hook_worker.py")] + args[script + 1:])
            proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=JOB_SECONDS)
            got = re.findall(r"BACKEND (\S+) SUM (\d+)", proc.stdout)
            good = proc.returncode == 0 and got == [("ddprun", "3")] * 2
            if not good:
                print(proc.stdout)
            ok = ok and good
            print(f"{'ok  ' if good else 'FAIL'} copied recipe, {' '.join(args)}: backends "
                  f"{[g[0] for g in got]}, exit {proc.returncode}", flush=True)
        return ok
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def refuses_torch_1(package_dir):
    """Debian's torch 1.13 (this machine's /usr/bin/python3): the import fails with one line."""
    if subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode:
        print("skip torch 1.13 refusal: /usr/bin/python3 has no torch (python3-torch)")
        return True
    proc = subprocess.run(["/usr/bin/python3", "-c", "import ddprun_torch"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=package_dir), timeout=120)
    ok = proc.returncode != 0 and "ddprun_torch needs PyTorch 2.x; this is 1." in proc.stderr
    print(f"{'ok  ' if ok else 'FAIL'} torch 1.13 refused: {proc.stderr.strip().splitlines()[-1]}",
          flush=True)
    return ok


def main():
    recipe_only = sys.argv[1] == "--recipe-only"
    args = sys.argv[2:] if recipe_only else sys.argv[1:]
    ddprun, package_dir, interop_dir = (os.path.abspath(a) for a in args[0:3])
    worlds = [int(w) for w in (args[3].split() if len(args) > 3 else ["1", "2", "3", "4"])]
    if os.geteuid() != 0:
        print("skip: needs root, PyTorch 2.6 runs in a chroot (tests/interop/torch2-python)")
        return 77
    root = os.environ.get("DDP_TORCH2_ROOT", "/var/cache/ddprun/torch2-trixie")
    if not os.path.exists(os.path.join(root, ".ddprun-torch2-ready")):
        print(f"skip: no PyTorch 2.6 root at {root}; run tests/interop/prepare-torch2-root")
        return 77
    if recipe_only:  # the arm64 label: ddprun and ddprun_torch of an arm64 build, an arm64 root
        return 0 if copied_recipe(ddprun, package_dir, interop_dir) else 1
    results = [conformance(ddprun, package_dir, interop_dir, w) for w in worlds]
    # The libfabric transport (shm on one node), with the root's own libfabric.
    results += [conformance(ddprun, package_dir, interop_dir, w, "fabric") for w in (2, 3)]
    results.append(two_pods(ddprun, package_dir, interop_dir))
    results.append(refuses_torch_1(package_dir))
    results.append(hook(ddprun, package_dir, interop_dir))
    results.append(copied_recipe(ddprun, package_dir, interop_dir))
    # Five times: an exit while the completer thread finished a future aborted 3 runs in 11.
    results += [killed_rank(package_dir, interop_dir) for _ in range(5)]
    results += [lost_node(ddprun, package_dir, interop_dir, b) for b in ("gloo", "fabric")]
    results += [training(ddprun, package_dir, interop_dir, mode)
                for mode in ("plain", "no_sync", "bf16_hook", "fp16_hook", "join")]
    return 0 if all(results) else 1


sys.exit(main())
