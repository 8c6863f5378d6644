"""One rank of the "ddprun" backend's conformance run (ddprun_torch_test.py).

Under ddprun, every rank opens a gloo group and a "ddprun" group over the same ranks, runs each
collective on both with the same inputs, and compares: integers exactly, floats within what a
different summation order allows (|ddprun - gloo| <= (world + 1) * eps * sum_r |x_r|, eps of the
dtype, plus eps of the dtype times the result for a final rounding). Prints one line per case and
"CONFORMANCE rank=R passed=N failed=0" at the end; exits 1 on any failure.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

import ddprun_torch

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
failures = []
passed = 0


def inputs(dtype, n, seed, contiguous=True):
    g = torch.Generator().manual_seed(seed * 1000 + RANK)
    if dtype.is_floating_point:
        x = (torch.rand(n, 3, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    else:
        x = torch.randint(-50, 50, (n, 3), generator=g, dtype=dtype)
    return x if contiguous else x.t()  # a transposed view: not contiguous


def reference_sum_abs(x, gloo):
    total = x.abs().to(torch.float64).contiguous()
    dist.all_reduce(total, group=gloo)
    return total


def check(name, got, want, bound=None):
    global passed
    if got.dtype.is_floating_point:
        diff = (got.to(torch.float64) - want.to(torch.float64)).abs()
        ok = bool((diff <= bound).all()) if bound is not None else torch.equal(got, want)
    else:
        ok = torch.equal(got, want)
    if ok:
        passed += 1
    else:
        failures.append(name)
        print(f"FAIL {name}: ddprun {got.flatten()[:6].tolist()} gloo {want.flatten()[:6].tolist()}",
              flush=True)


def float_bound(dtype, scale, result):
    if not dtype.is_floating_point:
        return None
    eps = torch.finfo(dtype).eps
    return (WORLD + 1) * eps * scale + eps * result.to(torch.float64).abs()


def allreduce_cases(ours, gloo, seed):
    for dtype in DTYPES:
        for op_name, op in OPS.items():
            if op_name == "avg":
                continue  # gloo has no AVG; see avg_cases
            for contiguous in (True, False):
                a = inputs(dtype, 5, seed, contiguous)
                if op_name == "product":
                    a = (a.abs() % 3 + 1).to(dtype) if not dtype.is_floating_point else a
                b = a.clone()
                dist.all_reduce(a, op=op, group=ours)
                dist.all_reduce(b, op=op, group=gloo)
                scale = reference_sum_abs(inputs(dtype, 5, seed, contiguous), gloo)
                bound = None  # min and max: exact
                if op_name == "sum":
                    bound = float_bound(dtype, scale, b)
                elif op_name == "product" and dtype.is_floating_point:
                    bound = (WORLD + 1) * torch.finfo(dtype).eps * b.abs().to(torch.float64)
                check(f"allreduce {op_name} {dtype} contiguous={contiguous}", a, b, bound)


def avg_cases(ours, gloo, seed):
    for dtype in [torch.float32, torch.float64, torch.bfloat16, torch.float16]:
        a = inputs(dtype, 7, seed)
        b = a.clone()
        dist.all_reduce(a, op=dist.ReduceOp.AVG, group=ours)
        dist.all_reduce(b, op=dist.ReduceOp.SUM, group=gloo)
        b = (b.to(torch.float64) / WORLD).to(dtype)
        scale = reference_sum_abs(inputs(dtype, 7, seed), gloo) / WORLD
        check(f"allreduce avg {dtype}", a, b, float_bound(dtype, scale, b) * 2)


def other_cases(ours, gloo, seed):
    for dtype in DTYPES:
        for contiguous in (True, False):
            tag = f"{dtype} contiguous={contiguous}"
            root = WORLD - 1
            a = inputs(dtype, 4, seed, contiguous)
            b = a.clone()
            dist.broadcast(a, src=root, group=ours)
            dist.broadcast(b, src=root, group=gloo)
            check(f"broadcast {tag}", a, b)

            x = inputs(dtype, 4, seed, contiguous)
            got = [torch.empty(x.shape, dtype=dtype) for _ in range(WORLD)]
            want = [torch.empty(x.shape, dtype=dtype) for _ in range(WORLD)]
            dist.all_gather(got, x, group=ours)
            dist.all_gather(want, x.contiguous(), group=gloo)
            check(f"all_gather {tag}", torch.stack(got), torch.stack(want))

            base = x.contiguous()
            out = torch.empty(WORLD * base.numel(), dtype=dtype)
            dist.all_gather_into_tensor(out, base, group=ours)
            check(f"all_gather_into_tensor {dtype}", out,
                  torch.cat([w.reshape(-1) for w in want]))

        chunks = [inputs(dtype, 2, seed + r) for r in range(WORLD)]
        flat = torch.cat([c.reshape(-1) for c in chunks])
        # gloo has no reduce_scatter: the reference is gloo's allreduce of the whole input.
        full = flat.clone()
        dist.all_reduce(full, group=gloo)
        mine = full.view(WORLD, -1)[RANK]
        scale = reference_sum_abs(flat, gloo).view(WORLD, -1)[RANK]
        out = torch.empty(chunks[0].numel(), dtype=dtype)
        dist.reduce_scatter_tensor(out, flat, group=ours)
        check(f"reduce_scatter_tensor {dtype}", out, mine, float_bound(dtype, scale, mine))
        out_list = torch.empty_like(chunks[0])
        dist.reduce_scatter(out_list, [c.clone() for c in chunks], group=ours)
        check(f"reduce_scatter {dtype}", out_list.reshape(-1), mine,
              float_bound(dtype, scale, mine))

        tensors = [inputs(dtype, 3, seed), inputs(dtype, 2, seed + 7)]
        ref = [t.clone() for t in tensors]
        scales = [reference_sum_abs(t, gloo) for t in tensors]
        ours.allreduce_coalesced(tensors, dist.AllreduceCoalescedOptions()).wait()
        for i, r in enumerate(ref):
            dist.all_reduce(r, group=gloo)
            check(f"allreduce_coalesced[{i}] {dtype}", tensors[i], r,
                  float_bound(dtype, scales[i], r))


def coalesced_cases(ours, seed):
    """The coalesced forms, each into a strided (non-contiguous) output: the Work returned for
    the batch must cover every collective in it, copies back included."""
    n = 3
    ins = [torch.full((n,), float(RANK + 1)), torch.full((n,), float(10 * (RANK + 1)))]
    outs = [torch.zeros(2 * WORLD * n)[::2] for _ in ins]
    ours.allgather_into_tensor_coalesced(outs, ins, torch._C._distributed_c10d.AllgatherOptions()).wait()
    for i, out in enumerate(outs):
        want = torch.cat([torch.full((n,), float((10 ** i) * (r + 1))) for r in range(WORLD)])
        check(f"allgather_into_tensor_coalesced[{i}]", out, want)
    ins = [torch.arange(WORLD * n, dtype=torch.int64) + RANK,
           torch.arange(WORLD * n, dtype=torch.int64) * (RANK + 1)]
    outs = [torch.zeros(2 * n, dtype=torch.int64)[::2] for _ in ins]
    ours.reduce_scatter_tensor_coalesced(outs, ins, dist.ReduceScatterOptions()).wait()
    base = torch.arange(WORLD * n, dtype=torch.int64)[RANK * n:(RANK + 1) * n]
    check("reduce_scatter_tensor_coalesced[0]", outs[0], base * WORLD + sum(range(WORLD)))
    check("reduce_scatter_tensor_coalesced[1]", outs[1], base * sum(range(1, WORLD + 1)))


def rooted_cases(ours, gloo, seed):
    root = WORLD // 2
    x = inputs(torch.int64, 3, seed)
    a, b = x.clone(), x.clone()
    dist.reduce(a, dst=root, group=ours)
    dist.reduce(b, dst=root, group=gloo)
    if RANK == root:
        check("reduce int64", a, b)
    gathered = [torch.empty_like(x) for _ in range(WORLD)] if RANK == root else None
    dist.gather(x, gathered, dst=root, group=ours)
    if RANK == root:
        check("gather int64", torch.stack(gathered),
              torch.stack([_peer_input(r, seed) for r in range(WORLD)]))
    out = torch.empty(3, 3, dtype=torch.int64)
    pieces = [torch.full((3, 3), r + 10, dtype=torch.int64) for r in range(WORLD)]
    dist.scatter(out, pieces if RANK == root else None, src=root, group=ours)
    check("scatter int64", out, torch.full((3, 3), RANK + 10, dtype=torch.int64))
    dist.barrier(group=ours)


def async_cases(ours):
    """Works that are not waited on right away (ddprun_torch completes an op in the thread that
    waits on it, or in its completer once a Future was asked for): results land, in issue order,
    however the caller learns of them."""
    want = float(sum(range(1, WORLD + 1)))
    # Not contiguous (results are copied back on completion); only the last one is waited on.
    xs = [torch.full((4, 3), float(RANK + 1)).t() for _ in range(3)]
    works = [dist.all_reduce(x, group=ours, async_op=True) for x in xs]
    works[-1].wait()
    for i, (x, w) in enumerate(zip(xs, works)):  # the values first: is_completed() completes
        check(f"async: #{i} of 3, not waited on, completed by a later wait", x,
              torch.full((3, 4), want))
        if not w.is_completed():
            failures.append(f"async: #{i} of 3, not waited on: is_completed() False after a "
                            f"later wait")
    # Polled with is_completed() alone, never waited on.
    x = torch.full((3, 5), float(RANK + 1)).t()
    w = dist.all_reduce(x, group=ours, async_op=True)
    _until(w.is_completed, "async: is_completed() polling")
    check("async: completed by is_completed() polling", x, torch.full((5, 3), want))
    # More ops than are ever left unclaimed, none waited on; then only the last one's Future.
    xs = [torch.full((2, 2), float(RANK + i)).t() for i in range(150)]
    works = [dist.all_reduce(x, group=ours, async_op=True) for x in xs]
    works[-1].get_future().wait()
    for i in (0, 75, 149):
        check(f"async: #{i} of 150 unwaited", xs[i],
              torch.full((2, 2), want - WORLD + WORLD * i))
    # A Future's callback runs without anybody waiting (the completer completes it).
    x = torch.full((3,), float(RANK + 1))
    seen = []
    dist.all_reduce(x, group=ours, async_op=True).get_future().then(lambda f: seen.append(1))
    _until(lambda: seen, "async: a Future's callback with no waiter")
    check("async: a Future's callback with no waiter", x, torch.full((3,), want))
    dist.barrier(group=ours)


def _until(condition, name, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            failures.append(f"{name}: still false after {seconds} s")
            return
        time.sleep(0.001)


def _peer_input(rank, seed):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randint(-50, 50, (3, 3), generator=g, dtype=torch.int64)


def refusals(ours):
    global passed
    t = torch.zeros(2)
    calls = [("all_to_all_single", lambda: dist.all_to_all_single(
                 torch.zeros(WORLD), torch.zeros(WORLD), group=ours)),
             ("uint8", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.uint8), group=ours))]
    if WORLD > 1:  # torch itself refuses a send to oneself
        calls.append(("send", lambda: dist.send(t, (RANK + 1) % WORLD, group=ours)))
    for name, call in calls:
        try:
            call()
            failures.append(f"refusal {name}")
        except RuntimeError as e:
            if "ddprun" in str(e):
                passed += 1
            else:
                failures.append(f"refusal {name}: {e}")


def main():
    dist.init_process_group("gloo")
    gloo = dist.group.WORLD
    ours = dist.new_group(backend=ddprun_torch.BACKEND)
    transport, hierarchical = ours.transport() if hasattr(ours, "transport") else ("?", False)
    print(f"rank={RANK} world={WORLD} torch {torch.__version__} transport={transport} "
          f"hierarchical={hierarchical}", flush=True)
    for seed in (1, 2):
        allreduce_cases(ours, gloo, seed)
        avg_cases(ours, gloo, seed)
        other_cases(ours, gloo, seed)
    coalesced_cases(ours, 4)
    rooted_cases(ours, gloo, 3)
    async_cases(ours)
    refusals(ours)
    print(f"CONFORMANCE rank={RANK} passed={passed} failed={len(failures)}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


main()
