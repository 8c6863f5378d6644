#!/usr/bin/python3
"""ddprun --metrics-port scraped by a real Prometheus server (Debian's `prometheus`).

A 2-rank train_mnist run under ddprun serves its metrics; Prometheus scrapes them every second;
the test then asks Prometheus's HTTP API for the series and checks them against the run's
metrics JSONL: every (step, loss, lr, epoch, images/s, step time) Prometheus stored for rank 0 is
one record of the JSONL, both ranks have their counters, the workers were seen running and the
restart counter is 0. A second run checks the endpoint directly: a restart counted, and a taken
port refused in one line with exit code 64.

  prometheus_test.py DDPRUN TRAIN_MNIST      exit 0 pass, 1 fail, 77 skip (says why)
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

DDPRUN, TRAIN_MNIST = sys.argv[1], sys.argv[2]
PROMETHEUS = shutil.which("prometheus", path="/usr/bin:/usr/sbin:/usr/local/bin")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def kill_group(proc):
    if proc and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def wait_until(predicate, seconds, what):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except OSError:
            pass
        time.sleep(0.2)
    print(f"timed out after {seconds} s waiting for {what}")
    return False


def api_result(api, endpoint, **params):
    """The `result` of a Prometheus HTTP API query (/api/v1/<endpoint>)."""
    reply = json.loads(http_get(f"{api}/api/v1/{endpoint}?" + urllib.parse.urlencode(params)))
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


def query_range(api, query, start, end):
    result = api_result(api, "query_range", query=query, start=f"{start:.3f}", end=f"{end:.3f}",
                        step="0.5")
    return {frozenset(r["metric"].items()): [(float(t), float(v)) for t, v in r["values"]]
            for r in result}


def instant_values(api, query):
    return [float(r["value"][1]) for r in api_result(api, "query", query=query)]


def series_of(result, **labels):
    want = set(labels.items())
    return [v for k, v in result.items() if want <= set(k)]


def prometheus_run(work):
    metrics_port, prom_port = free_port(), free_port()
    config = os.path.join(work, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: ddprun\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{metrics_port}']\n")
    api = f"http://127.0.0.1:{prom_port}"
    prom = train = None
    try:
        prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={work}/tsdb",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=open(os.path.join(work, "prometheus.log"), "w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        if not wait_until(lambda: http_get(f"{api}/-/ready").strip() != "", 60,
                          "Prometheus to be ready"):
            check(False, "Prometheus started (see prometheus.log)")
            print(open(os.path.join(work, "prometheus.log")).read()[-3000:])
            return
        jsonl = os.path.join(work, "metrics.jsonl")
        start = time.time()
        train = subprocess.Popen(
            [DDPRUN, "--standalone", "--nproc-per-node", "2", "--metrics-port", str(metrics_port),
             TRAIN_MNIST, "--epochs", "2", "--train-subset", "16000", "--test-subset", "500",
             "--threads", "1", "--log-every", "5", "--metrics", jsonl, "--no-resume"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env=dict(os.environ, DDP_STRAGGLER_WINDOW="20"))
        out, _ = train.communicate(timeout=240)
        end = time.time()
        check(train.returncode == 0, f"training exited 0 (got {train.returncode})")
        if train.returncode != 0:
            print(out[-4000:])
            return
        check("metrics: Prometheus endpoint on port" in out, "ddprun announced its endpoint")
        records = [json.loads(line) for line in open(jsonl)]
        steps = {r["step"]: r for r in records if r["event"] == "step"}
        world = next(r["world_size"] for r in records if r["event"] == "start")
        last_step = max(steps)

        # Prometheus goes on scraping after ddprun has exited. Its first failed scrape writes a
        # staleness marker into every series, and a series queried after that marker has no value
        # from the marker's time on, while one queried just before it still has. So wait for that
        # scrape (`up` 0) before the first query, and end the range at the training's end: every
        # query below then reads the same, final data.
        check(wait_until(lambda: instant_values(api, 'up{job="ddprun"}') == [0.0], 30,
                         "Prometheus to see ddprun gone"), "Prometheus saw ddprun gone")

        def q(name):
            return query_range(api, name, start - 1, end)

        loss, step, lr = q("ddp_loss"), q("ddp_step"), q("ddp_learning_rate")
        epoch, ips, st = q("ddp_epoch"), q("ddp_images_per_second"), q("ddp_step_time_seconds")
        r0 = dict(rank="0", node="0", local_rank="0", job="ddprun")
        step0 = dict(series_of(step, **r0)[0]) if series_of(step, **r0) else {}
        check(len(set(step0.values())) >= 3,
              f"Prometheus holds at least 3 distinct steps of rank 0 (got {sorted(set(step0.values()))})")
        mismatched = []
        compared = 0
        columns = [(loss, "loss", 1), (lr, "lr", 1), (epoch, "epoch", 1),
                   (ips, "images_per_second", world), (st, "step_seconds", 1)]
        for result, field, scale in columns:
            points = dict(series_of(result, **r0)[0]) if series_of(result, **r0) else {}
            for t, s in step0.items():
                record = steps.get(int(s))
                if record is None:
                    mismatched.append(f"step {s} is not in the JSONL")
                    continue
                if t not in points:
                    mismatched.append(f"no {field} at t={t}")
                    continue
                compared += 1
                want, got = record[field], points[t] * scale
                if abs(got - want) > 1e-9 * max(1.0, abs(want)):
                    mismatched.append(f"step {s} {field}: Prometheus {got!r}, JSONL {want!r}")
        if mismatched:
            for result, field, _ in [(step, "step", 1)] + columns:
                found = series_of(result, **r0)
                print(f"  {field}: {len(found)} series for rank 0; " + "; ".join(
                    f"{len(v)} points {v[0][0]:.3f}..{v[-1][0]:.3f}" for v in found))
            print(f"  range {start - 1:.3f}..{end:.3f}")
        check(compared > 0 and not mismatched,
              f"rank 0's {compared} scraped values equal the JSONL's records" +
              (": " + "; ".join(mismatched[:5]) if mismatched else ""))
        # Every rank: counters that only grow, no further than the run went.
        for rank in ("0", "1"):
            s_total = series_of(q("ddp_steps_total"), rank=rank)
            b_total = series_of(q("ddp_allreduce_bytes_total"), rank=rank)
            check(bool(s_total) and bool(b_total), f"rank {rank} has ddp_steps_total and bytes")
            if not (s_total and b_total):
                continue
            values = [v for _, v in s_total[0]]
            check(values == sorted(values) and 0 < values[-1] <= last_step,
                  f"rank {rank}'s ddp_steps_total grows to at most {last_step} (last {values[-1]})")
            per_step = {round(b / s) for (_, b), (_, s) in zip(b_total[0], s_total[0]) if s > 0}
            check(len(per_step) == 1 and per_step.pop() > 1_000_000,
                  f"rank {rank} allreduces the same > 1 MB of gradients every step")
        straggler = series_of(q("ddp_straggler_ratio"), rank="1")
        check(bool(straggler) and all(0.2 < v < 5 for _, v in straggler[0]),
              "rank 1's straggler ratio is exported (window 20 steps)")
        running = series_of(q('ddprun_worker_state{state="running"}'), rank="1")
        check(bool(running) and any(v == 1 for _, v in running[0]),
              "Prometheus saw rank 1's worker running")
        restarts = series_of(q("ddprun_restarts_total"), node="0")
        check(bool(restarts) and all(v == 0 for _, v in restarts[0]), "no restarts counted")
        up = series_of(q("up"), job="ddprun")
        check(bool(up) and any(v == 1 for _, v in up[0]), "the scrape target was up")
    finally:
        kill_group(train)
        kill_group(prom)


def direct_run(work):
    """A restart counted; a taken port refused."""
    port = free_port()
    marker = os.path.join(work, "failed-once")
    script = (f"if [ ! -e {marker} ]; then touch {marker}; exit 3; fi; sleep 4")
    agent = subprocess.Popen(
        [DDPRUN, "--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
         "--metrics-port", str(port), "--no-python", "/bin/sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        seen = wait_until(lambda: 'ddprun_restarts_total{node="0"} 1' in http_get(url), 30,
                          "the restart to show")
        check(seen, "a restart shows as ddprun_restarts_total 1")
        if seen:
            text = http_get(url)
            check('state="running"} 1' in text and "ddp_steps_total" not in text,
                  "a worker not built on the trainer: its state, and no training series")
        taken = subprocess.run(
            [DDPRUN, "--standalone", "--nproc-per-node", "1", "--metrics-port", str(port),
             "--no-python", "/bin/true"], capture_output=True, text=True, timeout=30)
        lines = [l for l in taken.stderr.splitlines() if "metrics-port" in l]
        check(taken.returncode == 64 and len(lines) == 1 and "in use" in lines[0],
              f"a taken port: exit 64 and one line ({taken.returncode}: {lines})")
        out, _ = agent.communicate(timeout=60)
        check(agent.returncode == 0, f"the restarted run finished (exit {agent.returncode})")
    finally:
        kill_group(agent)


def main():
    if PROMETHEUS is None:
        print("SKIP: no prometheus binary (Debian package prometheus; scripts/install-deps "
              "installs it)")
        return 77
    work = tempfile.mkdtemp(prefix="ddprun-prometheus-")
    try:
        prometheus_run(work)
        direct_run(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
