"""Store protocol conformance with PyTorch's own TCPStore, for any PyTorch (1.13 or 2.x).

  store_conformance.py client HOST PORT   exercises a store server through torch's client
  store_conformance.py serve              hosts torch's TCPStore server on a free port, prints
                                          "port N", and serves until killed

Prints "ok <check>" per check and "all ok" at the end; exits non-zero at the first mismatch.
"""
import datetime
import sys
import threading
import time

import torch
import torch.distributed as dist


def store(host, port, master):
    kwargs = dict(is_master=master, timeout=datetime.timedelta(seconds=20), wait_for_workers=False)
    # Debian's 2.x build has no libuv, yet defaults to it.
    if "use_libuv" in (dist.TCPStore.__init__.__doc__ or ""):
        kwargs["use_libuv"] = False
    return dist.TCPStore(host, port, **kwargs)


def check(name, got, want):
    if got != want:
        print(f"FAIL {name}: got {got!r}, want {want!r}", flush=True)
        sys.exit(1)
    print(f"ok {name}", flush=True)


def client(host, port):
    # Keys of this run only: one server may serve several runs.
    run = f"run{time.time_ns()}"
    s = dist.PrefixStore(run, store(host, port, False))
    other = dist.PrefixStore(run, store(host, port, False))
    v = torch.__version__
    base = s.num_keys()
    s.set("k", "v1")
    check("set/get", s.get("k"), b"v1")
    check("num_keys", s.num_keys(), base + 1)
    check("add new", s.add("ctr", 5), 5)
    check("add existing", other.add("ctr", -2), 3)
    check("get counter", s.get("ctr"), b"3")
    check("compare_set missing, expected empty", s.compare_set("cs", "", "a"), b"a")
    check("compare_set missing, expected set", s.compare_set("cs2", "x", "b"), b"x")
    check("compare_set match", s.compare_set("cs", "a", "b"), b"b")
    check("compare_set mismatch", s.compare_set("cs", "zzz", "c"), b"b")
    if hasattr(s, "check"):  # 2.x binds it
        check("check present", s.check(["k", "ctr"]), True)
        check("check missing", s.check(["k", "nope"]), False)
    s.wait(["k"], datetime.timedelta(seconds=1))
    check("wait present", True, True)
    start = time.monotonic()
    try:
        s.wait(["never"], datetime.timedelta(milliseconds=300))
        check("wait timeout raises", False, True)
    except Exception as e:  # DistStoreError (2.x) or RuntimeError (1.13)
        took = time.monotonic() - start
        check("wait timeout raises", "timeout" in str(e).lower() or "timed out" in str(e).lower(),
              True)
        check("wait timeout bounded", 0.25 < took < 5, True)
    # A wait that another client satisfies. After a timed-out wait a 1.13 client's connection
    # may still hold the old wait, so use a fresh one.
    waiter = dist.PrefixStore(run, store(host, port, False))
    timer = threading.Timer(0.3, lambda: other.set("later", "x"))
    timer.start()
    waiter.wait(["later"], datetime.timedelta(seconds=10))
    timer.join()
    check("wait woken by another client", waiter.get("later"), b"x")
    check("delete existing", s.delete_key("k"), True)
    check("delete missing", s.delete_key("k"), False)
    if hasattr(s, "check"):
        check("check deleted", s.check(["k"]), False)
    if hasattr(s, "append"):
        s.append("ap", "x")
        s.append("ap", "yz")
        check("append", s.get("ap"), b"xyz")
    if hasattr(s, "multi_set"):
        s.multi_set(["m1", "m2"], ["1", "2"])
        check("multi_get", s.multi_get(["m1", "m2"]), [b"1", b"2"])
    if hasattr(s, "queue_push"):
        s.queue_push("q", "a")
        s.queue_push("q", "b")
        check("queue_len", s.queue_len("q"), 2)
        check("queue_pop", s.queue_pop("q"), b"a")
    print(f"all ok (torch {v})", flush=True)


def serve():
    s = store("127.0.0.1", 0, True)
    print(f"port {s.port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "serve":
        serve()
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
