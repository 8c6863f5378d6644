#!/usr/bin/python3
"""ddprun beside torchrun 2.6, flag by flag: the compatibility table as a test.

Every flag of torchrun 2.6's `torch/distributed/run.py` is given, in one case or another, to
torchrun (python3 -m torch.distributed.run of the trixie root, tests/interop/torch2-python) and
to ddprun, each running parity_worker.py with the same environment. For each case the test
compares what the launchers did:
  - the variables each worker got from its launcher (its environment less the one the launcher
    was given), rank by rank and attempt by attempt;
  - the exit code;
  - the worker lines on the console;
  - with --log-dir, the files under it and the content of each stdout.log and stderr.log.
Values that differ between any two runs of the same launcher are replaced before comparing: the
port each run was given or picked, a --standalone run id, and the random suffix torchrun puts
on its run folder. A difference that is ddprun's by design is listed in BY_DESIGN with its
reason and printed; any other fails the test. The table printed at the end is the one in
launcher/README.md ("torchrun 2.6 side by side").

  torchrun_parity.py DDPRUN [--case NAME]   exit 0 pass, 1 fail, 77 skip (says why)
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH2_PYTHON = os.path.join(HERE, "torch2-python")
WORKER = os.path.join(HERE, "parity_worker.py")
SKIP = 77
# One launch (a few seconds here); 26 launches stay inside CTest's 1,800 s.
RUN_SECONDS = 60

# Each case: its name, the flags (PORT stands for a free port of the run), the worker's
# PARITY_FAIL and how the worker is named on the command line ("script", "module", "no-python").
# Every case but those in EXPECTED_EXIT must end with torchrun exiting 0, and every case but
# logs-specs must leave worker records on both sides: two launchers that fail alike (a broken
# worker, a broken root) are not "alike".
CASES = [
    ("standalone", ["--standalone", "--nproc-per-node", "2"], "", "script"),
    ("static", ["--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
                "--master-port", "PORT", "--nproc-per-node", "2", "--rdzv-id", "job7",
                "--role", "trainer", "--local-addr", "127.0.0.1"], "", "script"),
    ("c10d", ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:PORT",
              "--rdzv-id", "job7", "--rdzv-conf", "join_timeout=60,last_call_timeout=1",
              "--nproc_per_node", "2", "--monitor-interval", "0.1"], "", "script"),
    ("restart", ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                 "--monitor_interval", "0.1"], "1:3:1", "script"),
    ("failure", ["--standalone", "--nproc-per-node", "2", "--max_restarts", "0"], "1:3:99",
     "script"),
    ("module", ["--standalone", "--nproc-per-node", "1", "-m"], "", "module"),
    ("no-python", ["--standalone", "--nproc-per-node", "1", "--no-python"], "", "no-python"),
    ("start-method", ["--standalone", "--nproc-per-node", "2", "--start-method", "fork"], "",
     "script"),
    ("run-path", ["--standalone", "--nproc-per-node", "1", "--run-path"], "", "script"),
    ("nproc-cpu", ["--standalone", "--nproc-per-node", "cpu"], "", "script"),
    ("log-dir", ["--nnodes", "1", "--master-port", "PORT", "--rdzv-id", "logs", "--nproc-per-node",
                 "2", "--log-dir", "LOGDIR", "--redirects", "1", "--tee", "2",
                 "--local-ranks-filter", "0"], "", "script"),
    ("tee", ["--standalone", "--nproc-per-node", "2", "-t", "3", "-r", "0"], "", "script"),
    ("logs-specs", ["--standalone", "--nproc-per-node", "1", "--logs-specs", "nosuchspecs"], "",
     "script"),
]

EXPECTED_EXIT = {"failure": 1, "logs-specs": 1}
NO_WORKERS = {"logs-specs"}

# (case or "*", what (a regular expression matched in full), the values allowed (torchrun's,
# ddprun's) -> bool, reason): differences that are ddprun's by design. "what" is "exit code",
# "console lines", or "<dump file>: <VARIABLE>".
BY_DESIGN = [
    ("failure", "exit code", lambda t, d: (t, d) == (1, 3),
     "a failed worker's own code is ddprun's exit code (3 here), so that a Job's podFailurePolicy "
     "can key on it; torchrun exits 1 with ChildFailedError (launcher/README.md, Exit codes)"),
    ("logs-specs", "exit code", lambda t, d: (t, d) == (1, 64),
     "both refuse; torchrun raises ValueError from its entry-point lookup (1), ddprun refuses "
     "the flag in one line as a configuration error (64)"),
    ("*", r".*: DDP_(ABORT_FILE|FLIGHT_RECORDER_FILE|TRACE_DIR|LIVE_METRICS_FILE|REGROUP_FILE|"
          r"REGROUP_WAIT_SEC)",
     lambda t, d: t is None,
     "ddprun's own variables (the abort notice, the flight recorder, hang traces, the live metrics, "
     "in-process regrouping), under its DDP_ prefix"),
    ("*", r".*: TORCHELASTIC_SIGNALS_TO_HANDLE",
     lambda t, d: t is None and d == "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     "--signals-to-handle's list, which torchrun exports from 2.9 on"),
    ("*", r".*: NCCL_ASYNC_ERROR_HANDLING", lambda t, d: t is None and d == "1",
     "torchrun 1.13's spelling (Debian's python3-torch), kept beside TORCH_NCCL_ASYNC_ERROR_HANDLING "
     "which both set; no effect on CPU"),
    ("*", r".*: PYTHONPATH",
     lambda t, d: t is None and re.fullmatch(r"/\S*/python-hook:" + re.escape(HERE) + r":\S*/python",
                                             d) is not None,
     "ddprun puts its Python hook first (the agent store only at MASTER_PORT: a script's own "
     "tcp:// store works, where torchrun leaves it hanging) and appends the folder of the "
     "ddprun_torch package beside it (after every entry the worker was given)"),
    ("standalone|c10d|restart|failure|module|no-python|start-method|run-path|nproc-cpu|tee",
     r".*: MASTER_ADDR", lambda t, d: d == "127.0.0.1",
     "ddprun gives the store's host as the other nodes reached it (the rendezvous endpoint); "
     "torchrun 2.6 gives node 0's socket.getfqdn(), which in a pod is not always resolvable from "
     "the others. The same with --local-addr (case static)"),
    ("c10d", r".*: MASTER_PORT", lambda t, d: d == "<port>" and t is not None and t.isdigit(),
     "round 0's workers share the agents' store at the rendezvous endpoint; torchrun 2.6 starts "
     "one for them on a free port of node 0. Either way they connect as clients "
     "(TORCHELASTIC_USE_AGENT_STORE=True, alike)"),
    ("run-path", r".*: (COLUMNS|LINES)", lambda t, d: d is None and t is not None,
     "torchrun --run-path runs the script inside a Python process of its own making, whose "
     "environment carries the terminal size; ddprun accepts the flag and execs the script as "
     "always"),
]
# ddprun's own log lines, which may quote a failed worker's last lines.
DDPRUN_LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\.\d{3}\] \[ddprun\]")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(launcher, ddprun, case, port, logdir):
    name, flags, _, mode = case
    flags = [logdir if f == "LOGDIR" else f.replace("PORT", str(port)) for f in flags]
    if mode == "module":
        target = ["parity_worker"]
    elif mode == "no-python":
        target = ["/usr/bin/python3", WORKER]
    else:
        target = [WORKER]
    head = [TORCH2_PYTHON, "-m", "torch.distributed.run"] if launcher == "torchrun" else [ddprun]
    return head + flags + target + ["--an-argument", "its value"]


def run_case(launcher, ddprun, case, work):
    """(exit code, console lines of the workers, {dump name: env added}, {log file: text},
    the whole output)."""
    name, _, fail, _ = case
    out = os.path.join(work, f"{name}-{launcher}")
    logdir = os.path.join(out, "logs")
    os.makedirs(os.path.join(out, "dumps"))
    port = free_port()
    env = dict(os.environ, PARITY_OUT=os.path.join(out, "dumps"), PYTHONPATH=HERE,
               GLOO_SOCKET_IFNAME="lo", DDP_TORCH2_BIND=f"{HERE}:{os.path.dirname(ddprun)}",
               PYTHON_EXEC=TORCH2_PYTHON)
    if launcher == "torchrun":
        del env["PYTHON_EXEC"]  # torchrun reads it too: its workers run its own python3
    # PWD as it really is: the chroot wrapper's bash sets it so, and a worker started without it
    # (--no-python under ddprun) must not look different for that.
    env["PWD"] = os.getcwd()
    env.pop("OMP_NUM_THREADS", None)
    env.pop("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", None)
    if fail:
        env["PARITY_FAIL"] = fail
    run = subprocess.Popen(command(launcher, ddprun, case, port, logdir), env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        output, _ = run.communicate(timeout=RUN_SECONDS)
    except subprocess.TimeoutExpired:
        output = f"{launcher} did not finish in {RUN_SECONDS} s"
    finally:
        try:
            os.killpg(run.pid, signal.SIGKILL)  # the launcher's group: workers left behind too
        except ProcessLookupError:
            pass
        run.wait()
    if output.endswith(f"did not finish in {RUN_SECONDS} s"):
        return None, [], {}, {}, output
    console = sorted(l for l in output.splitlines()
                     if "parity " in l and not DDPRUN_LOG_LINE.match(l))
    dumps = {}
    for file in sorted(os.listdir(os.path.join(out, "dumps"))):
        record = json.load(open(os.path.join(out, "dumps", file)))
        dumps[file] = added_env(record, env, port, "--standalone" in case[1], logdir)
    logs = {}
    if os.path.isdir(logdir):
        for folder, _, files in os.walk(logdir):
            for f in files:
                path = os.path.join(folder, f)
                logs[normalize_path(path, logdir)] = open(path, errors="replace").read()
    return run.returncode, console, dumps, logs, output


def normalize_path(value, logdir):
    """A path under --log-dir, relative, with torchrun's random run-folder suffix taken out."""
    rel = os.path.relpath(value, logdir)
    return re.sub(r"^([^/]+?)_[a-z0-9_]{8}(/|$)", r"\1\2", rel)


def added_env(record, given, port, standalone, logdir):
    """The variables the launcher set or changed, with run-specific values replaced (with
    --standalone, each launcher picks its own port and run id)."""
    env = record["env"]
    added = {k: v for k, v in env.items() if given.get(k) != v}
    # Set by the chroot wrapper (tests/interop/torch2-python) around every torch2 python, not by
    # either launcher; DDP_TORCH2_* are removed by it.
    added.pop("USE_LIBUV", None)
    for k, v in added.items():
        v = v.replace(str(port), "<port>")
        if standalone and k in ("MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            v = "<picked>"
        if k == "TORCHELASTIC_ERROR_FILE":
            v = normalize_path(v, logdir) if v.startswith(logdir) else "<temporary>/" + \
                "/".join(v.split("/")[-3:])
        added[k] = v
    added["argv"] = " ".join(record["argv"])
    return added


def differences(t, d):
    """[(what, torchrun's, ddprun's)] between two results of run_case."""
    found = []
    if t[0] != d[0]:
        found.append(("exit code", t[0], d[0]))
    if t[1] != d[1]:
        found.append(("console lines", t[1], d[1]))
    if sorted(t[2]) != sorted(d[2]):
        found.append(("workers (dump files)", sorted(t[2]), sorted(d[2])))
    for dump in sorted(set(t[2]) & set(d[2])):
        te, de = t[2][dump], d[2][dump]
        for k in sorted(set(te) | set(de)):
            if te.get(k) != de.get(k):
                found.append((f"{dump}: {k}", te.get(k), de.get(k)))
    if sorted(t[3]) != sorted(d[3]):
        found.append(("files under --log-dir", sorted(t[3]), sorted(d[3])))
    for f in sorted(set(t[3]) & set(d[3])):
        if t[3][f] != d[3][f]:
            found.append((f"content of {f}", t[3][f][:300], d[3][f][:300]))
    return found


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ddprun")
    p.add_argument("--case", action="append")
    args = p.parse_args()
    unknown = set(args.case or []) - {c[0] for c in CASES}
    if unknown:
        p.error(f"no such case: {', '.join(sorted(unknown))}")
    # CTest's timeout sends SIGTERM: leave through the finally clauses, which stop the launcher
    # running then (its process group) and remove the work folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.geteuid() != 0:
        print("SKIP: needs root: torchrun 2.6 runs in a chroot (tests/interop/torch2-python)")
        return SKIP
    check = subprocess.run([TORCH2_PYTHON, "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, env=dict(os.environ,
                                                                     DDP_TORCH2_BIND=HERE))
    if check.returncode != 0:
        print(f"SKIP: no PyTorch 2.x root ({check.stderr.strip()[-300:]})")
        return SKIP
    print(f"torchrun of torch {check.stdout.strip()} beside {args.ddprun}")
    work = tempfile.mkdtemp(prefix="ddprun-parity-")
    failed = 0
    table = []
    try:
        for case in CASES:
            if args.case and case[0] not in args.case:
                continue
            t = run_case("torchrun", args.ddprun, case, work)
            d = run_case("ddprun", args.ddprun, case, work)
            unexplained, explained = [], {}
            for who, result in (("torchrun", t), ("ddprun", d)):
                if result[0] is None:
                    unexplained.append(("finished", "in time", result[-1]))
                elif who == "torchrun" and result[0] != EXPECTED_EXIT.get(case[0], 0):
                    unexplained.append(("torchrun's exit code", EXPECTED_EXIT.get(case[0], 0),
                                        result[0]))
                if case[0] not in NO_WORKERS and not result[2]:
                    unexplained.append((f"{who}'s worker records", "at least one", "none"))
            for what, tv, dv in differences(t, d):
                rule = next((i for i, (c, w, allowed, _) in enumerate(BY_DESIGN)
                             if (c == "*" or case[0] in c.split("|")) and re.fullmatch(w, what)
                             and allowed(tv, dv)), None)
                if rule is None:
                    unexplained.append((what, tv, dv))
                else:
                    explained.setdefault(rule, (what, tv, dv, []))[3].append(what)
            for rule, (what, tv, dv, all_of_them) in sorted(explained.items()):
                print(f"  {case[0]}: by design, {len(all_of_them)} like {what}: torchrun {tv!r}, "
                      f"ddprun {dv!r}: {BY_DESIGN[rule][3]}")
            for what, tv, dv in unexplained:
                print(f"FAIL {case[0]}: {what}:\n    torchrun {tv!r}\n    ddprun   {dv!r}")
            if unexplained:
                failed += 1
                print(f"---- torchrun's output:\n{t[-1][-2000:]}\n---- ddprun's:\n{d[-1][-2000:]}")
            flags = " ".join(f for f in case[1] if f.startswith("-"))
            verdict = "DIFFERS" if unexplained else "alike" + (
                f" but for {sum(len(e[3]) for e in explained.values())} differences by design"
                if explained else "")
            table.append((case[0], flags, t[0], d[0], verdict))
            print(f"{'ok  ' if not unexplained else 'FAIL'} {case[0]}: torchrun exit {t[0]}, "
                  f"ddprun exit {d[0]}, {len(t[2])} worker records")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| case | flags | torchrun 2.6 exit | ddprun exit | workers' environment, console, files |")
    print("|---|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(f"`{c}`" if i == 1 else str(c) for i, c in enumerate(row)) + " |")
    print(f"{failed} of {len(table)} cases differ" if failed else f"all {len(table)} cases alike")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
