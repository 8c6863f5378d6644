#!/usr/bin/python3
"""scripts/plot-metrics: two runs' metrics JSONL in the trainer's format become one PNG of the
promised size with both runs' lines on it; the series it plotted equal the JSONL's; bad input
fails in one line with exit code 65 (64 for bad usage).

  plot_metrics_test.py SCRIPT    exit 0 pass, 1 fail
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SCRIPT = sys.argv[1]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(*args):
    return subprocess.run(["/usr/bin/python3", SCRIPT, *args], capture_output=True, text=True,
                          timeout=120)


def write_run(path, world, steps, accuracy, t0, resumed=False):
    """A run as the trainer writes it (start, first_step, step every 5, epoch, end)."""
    records = [{"event": "start", "time": t0, "world_size": world, "model": "mnist_cnn"},
               {"event": "first_step", "time": t0 + 0.1, "seconds_in_fit": 0.1}]
    for i, step in enumerate(range(5, steps + 1, 5)):
        records.append({"event": "step", "time": t0 + 0.2 + 0.35 * i, "step": step, "epoch": 0,
                        "loss": 2.3 / (1 + 0.05 * step) + 0.001 * (i % 3), "lr": 0.05,
                        "images_per_second": 1800.0 + 10 * (i % 7), "step_seconds": 0.07})
        if resumed and step == steps // 2:
            records.append({"event": "start", "time": t0 + 0.3 + 0.35 * i, "world_size": world})
    for e, acc in enumerate(accuracy, 1):
        records.append({"event": "epoch", "time": t0 + 10 * e, "epoch": e, "step": e * steps // 2,
                        "test_accuracy": acc, "images_per_second": 1850.0})
    records.append({"event": "epoch", "time": t0 + 30, "epoch": 9, "step": steps,
                    "test_accuracy": -1.0})  # not evaluated: no point
    records.append({"event": "end", "time": t0 + 31, "status": "completed", "step": steps})
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return records


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def main():
    work = tempfile.mkdtemp(prefix="ddp-plot-metrics-")
    try:
        a, b = os.path.join(work, "a.jsonl"), os.path.join(work, "b.jsonl")
        ra = write_run(a, 2, 300, [0.82, 0.87], 1000.0)
        rb = write_run(b, 4, 200, [0.80, 0.86], 5000.0, resumed=True)
        png, dump = os.path.join(work, "curves.png"), os.path.join(work, "series.json")
        r = run(a, b, "--label", "2 ranks", "--label", "4 ranks", "--out", png, "--dump-json", dump)
        check(r.returncode == 0 and r.stdout.strip() == png,
              f"two runs plotted, the PNG's path printed (exit {r.returncode}, {r.stderr.strip()})")
        check(png_size(png) == (1500, 800), f"a 1500 x 800 PNG (got {png_size(png)})")

        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.image
        pixels = (matplotlib.image.imread(png)[:, :, :3] * 255).round().astype(int)
        colours = {tuple(p) for p in pixels.reshape(-1, 3)[::7]}
        check(len(colours) > 50, f"not blank: {len(colours)} distinct colours")
        # matplotlib's first two line colours, C0 and C1: each run's line is drawn.
        for name, rgb in (("2 ranks (C0)", (31, 119, 180)), ("4 ranks (C1)", (255, 127, 14))):
            count = int((abs(pixels - rgb).sum(axis=2) <= 6).sum())
            check(count > 500, f"{name}'s line is drawn ({count} pixels of its colour)")

        series = json.load(open(dump))
        for label, records in (("2 ranks", ra), ("4 ranks", rb)):
            steps = [x for x in records if x["event"] == "step"]
            evals = [x for x in records if x["event"] == "epoch" and x["test_accuracy"] >= 0]
            s = series.get(label, {})
            check(s.get("step") == [x["step"] for x in steps] and
                  s.get("loss") == [x["loss"] for x in steps] and
                  s.get("images_per_second") == [x["images_per_second"] for x in steps],
                  f"{label}: the plotted steps, loss and images/s are the JSONL's")
            check(s.get("seconds") == [x["time"] - records[0]["time"] for x in steps],
                  f"{label}: wall time counts from the run's first record (resumes included)")
            check(s.get("test_accuracy") == [100.0 * x["test_accuracy"] for x in evals] and
                  s.get("accuracy_step") == [x["step"] for x in evals],
                  f"{label}: test accuracy at each evaluated epoch, none where not evaluated")

        default = run(a)
        check(default.returncode == 0 and
              default.stdout.strip() == os.path.join(work, "training-curves.png") and
              png_size(default.stdout.strip()) == (1500, 800),
              "without --out: training-curves.png beside the first file")

        # Two files of one name (each run's metrics.jsonl): labelled by path, both kept; the
        # PNG's folder is created.
        same = []
        for run_dir in ("r1", "r2"):
            os.makedirs(os.path.join(work, run_dir))
            same.append(os.path.join(work, run_dir, "metrics.jsonl"))
            shutil.copy(a, same[-1])
        nested = os.path.join(work, "new", "folder", "c.png")
        r = run(*same, "--out", nested, "--dump-json", dump)
        check(r.returncode == 0 and png_size(nested) == (1500, 800) and
              sorted(json.load(open(dump))) == sorted(same),
              f"same-named files: both runs, labelled by path; the folder made (exit "
              f"{r.returncode}, {r.stderr.strip()})")

        bad = os.path.join(work, "bad.jsonl")
        with open(bad, "w") as f:
            f.write(json.dumps({"event": "start", "time": 1}) + "\n{not json\n")
        nosteps = os.path.join(work, "nosteps.jsonl")
        with open(nosteps, "w") as f:
            f.write(json.dumps({"event": "start", "time": 1}) + "\n")
        binary = os.path.join(work, "model.pt")
        with open(binary, "wb") as f:
            f.write(b"PK\x03\x04\x8d\xff\xfe" * 50)
        noloss = os.path.join(work, "noloss.jsonl")
        with open(noloss, "w") as f:
            f.write(json.dumps({"event": "step", "time": 1, "step": 5}) + "\n")
        for args, code, text in (([os.path.join(work, "missing.jsonl")], 65, "missing.jsonl"),
                                 ([binary], 65, "model.pt: not text"),
                                 ([noloss], 65, "noloss.jsonl:1: a step record without 'loss'"),
                                 ([bad], 65, "bad.jsonl:2: not JSON"),
                                 ([nosteps], 65, "no step records; run with --log-every"),
                                 ([a, "--label", "x", "--label", "y"], 64, "2 labels for 1 files")):
            r = run(*args)
            lines = r.stderr.strip().splitlines()
            check(r.returncode == code and len(lines) == 1 and text in lines[0],
                  f"{text}: exit {code} and one line (got {r.returncode}: {lines})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
