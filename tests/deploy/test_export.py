#!/usr/bin/python3
"""docker/ddp-export-model against a real S3-compatible server (s3rver, pinned in
tests/deploy/package-lock.json) with the real awscli: a checkpoint trained by ddprun +
train_mnist is exported, downloaded again and compared byte for byte, its manifest checked
against what evaluate prints, and the download read back by evaluate. A damaged newer checkpoint
is passed over for the valid one; the wrapper mode (-- COMMAND) passes a failed training's exit
code through, exports only on pod 0 and forwards SIGTERM. Failures (no checkpoint, no
credentials, no such bucket, the server down) exit non-zero with one line naming cause and fix.

  test_export.py --tools DIR --path DIR...
--tools: tests/deploy's tools directory (node_modules/.bin/s3rver); --path: directories holding
ddprun, train_mnist and evaluate. Exits 77 (skipped) without awscli or s3rver."""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXPORT = os.path.join(HERE, "..", "..", "docker", "ddp-export-model")
BUCKET = "models"
SKIP = 77

results = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)
    return ok


def run(cmd, env, timeout, **kw):
    """Runs cmd with a hard deadline; a timeout is a failed run (rc None), not an exception."""
    started = time.monotonic()
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, **kw)
        r.elapsed = time.monotonic() - started
        return r
    except subprocess.TimeoutExpired as e:
        r = subprocess.CompletedProcess(cmd, None, e.stdout or "", e.stderr or "")
        if isinstance(r.stdout, bytes):
            r.stdout, r.stderr = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
        r.elapsed = time.monotonic() - started
        return r


def show(r):
    return f"exit {r.returncode} after {r.elapsed:.1f} s; stdout {r.stdout[-600:]!r}; stderr {r.stderr[-600:]!r}"


def one_line_error(r, code, text):
    """Exit `code`, and stderr one line of ddp-export-model's naming `text`."""
    lines = r.stderr.strip().splitlines()
    return (r.returncode == code and len(lines) == 1 and lines[0].startswith("ddp-export-model: error: ")
            and text in lines[0])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_s3rver(s3rver, directory, port):
    proc = subprocess.Popen([s3rver, "--directory", directory, "--address", "127.0.0.1", "--port", str(port),
                             "--configure-bucket", BUCKET, "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"s3rver exited {proc.returncode}: {proc.stderr.read().decode()[-500:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"s3rver did not listen on 127.0.0.1:{port} within 30 s")


def stop(proc):
    if proc and proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def parse_evaluate(out):
    """(checkpoint path, model, epoch, step, correct, total, accuracy %) from evaluate's stdout."""
    head = re.search(r"^checkpoint (\S+) \(([^,]+), epoch (\d+), step (\d+)\)$", out, re.M)
    overall = re.search(r"^overall\s+(\d+)\s+(\d+)\s+([\d.]+)%$", out, re.M)
    if not head or not overall:
        return None
    return (head[1], head[2], int(head[3]), int(head[4]), int(overall[1]), int(overall[2]), float(overall[3]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", required=True)
    parser.add_argument("--path", action="append", default=[])
    args = parser.parse_args()

    # /usr/bin first: a pyenv shim named aws may come earlier on PATH and not run.
    aws = next((p for p in ["/usr/bin/aws", shutil.which("aws")] if p and os.access(p, os.X_OK)), None)
    s3rver = os.path.join(os.path.abspath(args.tools), "node_modules", ".bin", "s3rver")
    if not aws:
        print("SKIP: awscli (aws) is not installed; scripts/install-deps installs it")
        return SKIP
    if not os.access(s3rver, os.X_OK) or not shutil.which("node"):
        print(f"SKIP: {s3rver} (or node) is missing; tests/deploy/install-tools installs it from package-lock.json")
        return SKIP
    search = os.pathsep.join([os.path.abspath(p) for p in args.path] + [os.path.dirname(aws)] +
                             os.environ.get("PATH", "").split(os.pathsep))
    for program in ("ddprun", "train_mnist", "evaluate"):
        if not shutil.which(program, path=search):
            print(f"FAIL: {program} is not in --path {args.path}")
            return 1

    work = tempfile.mkdtemp(prefix="ddp-export-test-")
    server = None
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(PATH=search, OMP_NUM_THREADS="1", HOME=work, TMPDIR=work,
                   AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER", AWS_DEFAULT_REGION="us-east-1",
                   AWS_MAX_ATTEMPTS="1", AWS_EC2_METADATA_DISABLED="true",
                   AWS_CONFIG_FILE=os.path.join(work, "no-aws-config"),
                   AWS_SHARED_CREDENTIALS_FILE=os.path.join(work, "no-aws-credentials"))
        env.pop("DDP_EXPORT_S3_URI", None)
        env.pop("JOB_COMPLETION_INDEX", None)

        ckpt = os.path.join(work, "ckpt")
        r = run(["ddprun", "--standalone", "--nproc-per-node", "1", "train_mnist", "--epochs", "1",
                 "--train-subset", "2000", "--test-subset", "500", "--threads", "1",
                 "--checkpoint-dir", ckpt, "--no-resume"], env, 180)
        if not check("ddprun + train_mnist write a checkpoint", r.returncode == 0 and os.listdir(ckpt), show(r)):
            return 1
        r = run(["evaluate", "--checkpoint", ckpt, "--threads", "1"], env, 120)
        expected = parse_evaluate(r.stdout)
        if not check("evaluate reads the checkpoint and prints its accuracy", r.returncode == 0 and expected, show(r)):
            return 1
        source, model, epoch, step, correct, total, percent = expected

        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        server = start_s3rver(s3rver, os.path.join(work, "s3"), port)
        s3 = [aws, "--endpoint-url", endpoint, "--cli-connect-timeout", "5"]
        export = [EXPORT, "--endpoint-url", endpoint, "--connect-timeout", "5"]

        # ---- the export, downloaded again ----------------------------------------------------
        r = run(export + ["--checkpoint-dir", ckpt, "--to", f"s3://{BUCKET}/fashion-mnist/run-1",
                          "--version", "test-1"], env, 180)
        check("the export succeeds and says where it went",
              r.returncode == 0 and f"s3://{BUCKET}/fashion-mnist/run-1/" in r.stdout and not r.stderr.strip(), show(r))
        down = os.path.join(work, "download")
        r = run(s3 + ["s3", "cp", "--recursive", "--only-show-errors", f"s3://{BUCKET}/fashion-mnist/run-1/", down],
                env, 120)
        name = os.path.basename(source)
        got = sorted(os.listdir(down)) if os.path.isdir(down) else []
        check("S3 holds the checkpoint and manifest.json under the prefix",
              r.returncode == 0 and got == sorted([name, "manifest.json"]), f"{got}; {show(r)}")
        with open(source, "rb") as f:
            original = f.read()
        copy = os.path.join(down, name)
        same = os.path.exists(copy) and open(copy, "rb").read() == original
        check("the downloaded checkpoint is byte-identical to the newest valid one", same)
        try:
            manifest = json.load(open(os.path.join(down, "manifest.json")))
        except (OSError, ValueError) as e:
            manifest = {}
            check("manifest.json is JSON", False, str(e))
        acc = manifest.get("accuracy")
        check("the manifest names the model, epoch, step and checkpoint evaluate reports",
              (manifest.get("model"), manifest.get("epoch"), manifest.get("step"), manifest.get("checkpoint"))
              == (model, epoch, step, name), json.dumps(manifest))
        check("the manifest's accuracy is a number agreeing with evaluate's",
              isinstance(acc, (int, float)) and not isinstance(acc, bool) and abs(acc * 100 - percent) <= 0.005
              and (manifest.get("test_correct"), manifest.get("test_images")) == (correct, total),
              f"manifest {acc}, evaluate {percent}% ({correct}/{total})")
        check("the manifest records the version, size and sha256",
              manifest.get("version") == "test-1" and manifest.get("bytes") == len(original)
              and manifest.get("sha256") == hashlib.sha256(original).hexdigest(), json.dumps(manifest))
        r = run(["evaluate", "--checkpoint", down, "--threads", "1"], env, 120)
        back = parse_evaluate(r.stdout)
        check("evaluate reads the downloaded directory: the same model and accuracy",
              r.returncode == 0 and back and back[0] == copy and back[1:] == expected[1:], show(r))

        # ---- a damaged newer checkpoint is passed over ---------------------------------------
        damaged = os.path.join(work, "damaged")
        os.makedirs(damaged)
        shutil.copy(source, damaged)
        with open(os.path.join(damaged, "checkpoint-0000099999-0badc0de.pt"), "wb") as f:
            f.write(original[: len(original) // 2])
        r = run(export + ["--checkpoint-dir", damaged, "--to", f"s3://{BUCKET}/run-2"], env, 180)
        r2 = run(s3 + ["s3", "cp", f"s3://{BUCKET}/run-2/manifest.json", "-"], env, 60)
        try:
            exported = json.loads(r2.stdout).get("checkpoint")
        except ValueError:
            exported = None
        check("a damaged newer checkpoint is skipped: the valid one is exported",
              r.returncode == 0 and exported == name, f"exported {exported}; {show(r)}")

        # ---- the wrapper: training first, export on pod 0 only -------------------------------
        r = run(export + ["--checkpoint-dir", ckpt, "--to", f"s3://{BUCKET}/run-3", "--", "sh", "-c", "exit 75"],
                env, 60)
        check("wrapper: a failed training's exit code passes through, nothing exported",
              r.returncode == 75 and "exporting" not in r.stdout, show(r))
        r = run(export + ["--checkpoint-dir", ckpt, "--to", f"s3://{BUCKET}/run-3", "--", "true"],
                dict(env, JOB_COMPLETION_INDEX="1"), 60)
        check("wrapper: pod 1 leaves the export to pod 0", r.returncode == 0 and "pod 0" in r.stdout, show(r))
        listed = run(s3 + ["s3", "ls", f"s3://{BUCKET}/run-3/"], env, 60)
        check("wrapper: nothing under the prefix after those two", listed.stdout.strip() == "", show(listed))
        r = run(export + ["--checkpoint-dir", ckpt, "--to", f"s3://{BUCKET}/run-3", "--", "true"],
                dict(env, JOB_COMPLETION_INDEX="0"), 180)
        check("wrapper: pod 0 exports after the training succeeds",
              r.returncode == 0 and f"s3://{BUCKET}/run-3/" in r.stdout, show(r))
        proc = subprocess.Popen([*export, "--checkpoint-dir", ckpt, "--to", f"s3://{BUCKET}/run-4", "--",
                                 "sh", "-c", "trap 'kill $!; exit 75' TERM; sleep 60 >/dev/null 2>&1 & echo started; wait"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()  # the command is running and has its trap
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            code = None
        check("wrapper: SIGTERM reaches the training, whose exit code (75) passes through",
              first.strip() == "started" and code == 75, f"exit {code}; {out!r} {err!r}")
        # A SIGTERM at the wrapper's start, perhaps before it knows the training's PID, must not
        # be lost (the training would then run on): tried a few times to meet that moment.
        lost = []
        for attempt in range(5):
            proc = subprocess.Popen([*export, "--checkpoint-dir", ckpt, "--to", f"s3://{BUCKET}/run-5", "--",
                                     "sleep", "60"], env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            time.sleep(0.02 * attempt)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                lost.append(attempt)
        check("wrapper: a SIGTERM as it starts is passed on, not lost", not lost,
              f"the training ran on after attempts {lost}")

        # ---- failures: one line, cause and fix, non-zero, quickly ----------------------------
        empty = os.path.join(work, "empty")
        os.makedirs(empty)
        r = run(export + ["--checkpoint-dir", empty, "--to", f"s3://{BUCKET}/x"], env, 60)
        check("no checkpoint: exit 65, one line", one_line_error(r, 65, "no checkpoint in"), show(r))
        r = run(export + ["--checkpoint-dir", ckpt], env, 60)
        check("no S3 destination: exit 64, one line naming DDP_EXPORT_S3_URI",
              one_line_error(r, 64, "DDP_EXPORT_S3_URI"), show(r))
        nocreds = {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        r = run(export + ["--checkpoint-dir", ckpt, "--to", f"s3://{BUCKET}/x"], nocreds, 60)
        check("no credentials: exit 64, one line naming IRSA", one_line_error(r, 64, "no AWS credentials")
              and "eks.amazonaws.com/role-arn" in r.stderr, show(r))
        r = run(export + ["--checkpoint-dir", ckpt, "--to", "s3://no-such-bucket/x"], env, 60)
        check("no such bucket: exit 64, one line", one_line_error(r, 64, "bucket no-such-bucket does not exist"), show(r))
        stop(server)
        server = None
        r = run(export + ["--checkpoint-dir", ckpt, "--to", f"s3://{BUCKET}/x"], env, 60)
        check("server down: exit 69, one line, within 30 s",
              one_line_error(r, 69, f"cannot reach {endpoint}") and r.elapsed < 30, show(r))
        r = run(export + ["--checkpoint-dir", ckpt, "--to", f"s3://{BUCKET}/x", "--", "true"], env, 60)
        check("server down after the training (wrapper): exit 64, which fails the Job instead of retrying pod 0",
              one_line_error(r, 64, f"cannot reach {endpoint}"), show(r))
    except RuntimeError as e:
        check("s3rver starts", False, str(e))
    finally:
        stop(server)
        shutil.rmtree(work, ignore_errors=True)

    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
