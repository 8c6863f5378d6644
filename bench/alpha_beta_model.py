#!/usr/bin/python3
"""An alpha-beta model of ddprun's allreduce, flat against hierarchical, fitted from
bench/simulated_pods results and used to predict jobs this machine cannot run.

Each path has a latency alpha (seconds per message step) and an inverse bandwidth beta (seconds
per byte): the network between pods (a pod's link, shared by every flow that leaves the pod)
and shared memory inside a pod (libfabric's shm, cross-memory attach copies). With N pods of L
ranks (P = N*L) and S bytes, a scheme takes
    T = steps_n a_n + max(0, link_bytes - burst) b_n + steps_s a_s + shm_bytes b_s
where link_bytes is what one pod sends through its link per op:
                       steps_n      link_bytes         steps_s   shm_bytes
  flat ring            2(P-1)       2(P-1)/P S         -         -      (one flow per pod pair)
  flat doubling        log2 P       L log2(N) S        -         -
  hierarchical slices  2(N-1)       2(N-1)/N S         2(L-1)    2(L-1)/L S   (L flows)
  hierarchical whole   log2 N       L log2(N) S        log2 L    log2(L) S
and each scheme takes the cheaper of its two forms, as the backends' size switches do. `burst`
is the shaped link's token bucket (bench/simulated_pods: 0.25 ms at the rate), which lets an op
that sends less pass at memory speed; a real NIC has none (burst = 0 in the predictions).

Fitting, for 2 ranks (T = 2a + S b): b from the payloads of 1 MiB and more (the median of
T / S), then a from those of 16 KiB and less (the median of (T - S b) / 2). The network path per
backend from its flat run on 2 pods x 1 rank; shared memory from fabric's flat run on 1 pod x 2
ranks. The model is then checked against every 2- and 4-pod point measured (the goal: within
25 %) and used to predict N = 2..128 pods x L = 1..64 ranks on EFA and on TCP, with the
parameters given below.

usage: bench/alpha_beta_model.py RESULTS.txt [RESULTS.txt ...] [--out table.txt]
"""
import argparse
import math
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shaped_link import bucket_bytes  # noqa: E402


def parse(paths):
    """{(pods, per_pod, rate): {variant: {size: seconds}}}"""
    runs = defaultdict(lambda: defaultdict(dict))
    for path in paths:
        key = None
        for line in open(path):
            m = re.match(r"## (\d+) pods x (\d+) ranks, links (\w+)", line)
            if m:
                key = (int(m.group(1)), int(m.group(2)), m.group(3))
                continue
            parts = line.split()
            if key and len(parts) >= 6 and parts[0].isdigit() and not parts[1].endswith("x,"):
                try:
                    runs[key][parts[1]][int(parts[0])] = float(parts[2]) * 1e-6
                except ValueError:
                    pass
    return runs


def fit(points, small_steps=1):
    """a, b of T = k a + S b for 2 ranks; points: {S: T}. b from 1 MiB and more, where the
    bucket is negligible; a from 16 KiB and less, which pass within the bucket and take
    `small_steps` steps (1: gloo's round and libfabric's doubling between two ranks; 2: the
    ring inside a pod)."""
    large = sorted(t / s for s, t in points.items() if s >= (1 << 20))
    small = sorted(t / small_steps for s, t in points.items() if s <= (16 << 10))
    return small[len(small) // 2], large[len(large) // 2]


def log2(x):
    return math.ceil(math.log2(x)) if x > 1 else 0


def cost(steps_n, link_bytes, steps_s, shm_bytes, a_n, b_n, a_s, b_s, burst=0.0):
    return steps_n * a_n + max(0.0, link_bytes - burst) * b_n + steps_s * a_s + shm_bytes * b_s


# Each backend's choices between pods, as its defaults make them (lib/src/comm/README.md):
#   gloo    one round (every rank sends its payload to every other) while payload x peers stays
#           below 1 MiB, then the ring, or between two ranks on two pods one exchange of the
#           whole buffer; the hierarchical allreduce runs in pieces of (N-1) MiB, at most 64;
#   fabric  recursive doubling below ring_threshold (512 KiB over TCP, 64 KiB on EFA), then the
#           ring; one piece.
GLOO = dict(direct_bytes=1 << 20, ring_threshold=0, pair_exchange=True, piece_bytes=1 << 20,
            max_pieces=64)
FABRIC_TCP = dict(ring_threshold=512 << 10)
FABRIC_EFA = dict(ring_threshold=64 << 10)


def network(n, l, payload, direct_bytes=0, ring_threshold=0, pair_exchange=False, **p):
    """One allreduce of `payload` among n ranks on n pods, L such groups at once on a pod's
    link; the algorithm the backend's settings pick."""
    if payload * (n - 1) < direct_bytes:  # one round: each rank sends its payload n-1 times
        return cost(1, l * (n - 1) * payload, 0, 0, **p)
    doubling = cost(log2(n), l * log2(n) * payload, 0, 0, **p)
    if payload < ring_threshold or (n == 2 and pair_exchange):
        return doubling
    return cost(2 * (n - 1), 2 * (n - 1) / n * l * payload, 0, 0, **p)


def flat(n, l, s, direct_bytes=0, ring_threshold=0, pair_exchange=False, piece_bytes=0,
         max_pieces=1, **p):
    pp = n * l
    if n == 1:  # every hop is shared memory
        return min(cost(0, 0, 2 * (pp - 1), 2 * (pp - 1) / pp * s, **p),
                   cost(0, 0, log2(pp), log2(pp) * s, **p))
    if s * (pp - 1) < direct_bytes:  # one round: each pod sends L x (P - L) payloads
        return cost(1, l * (pp - l) * s, 0, 0, **p)
    doubling = cost(log2(pp), l * log2(n) * s, 0, 0, **p)
    if s < ring_threshold or (pp == 2 and pair_exchange):
        return doubling
    return cost(2 * (pp - 1), 2 * (pp - 1) / pp * s, 0, 0, **p)


def hierarchical(n, l, s, direct_bytes=0, ring_threshold=0, pair_exchange=False, piece_bytes=0,
                 max_pieces=1, **p):
    choices = dict(direct_bytes=direct_bytes, ring_threshold=ring_threshold,
                   pair_exchange=pair_exchange)
    if n == 1 or l == 1:
        return flat(n, l, s, **choices, **p)

    def across(payload):  # the level between pods: n ranks, L groups at once on the link
        return network(n, l, payload, **choices, **p)

    def inside(payload):  # reduce-scatter and allgather in the pod: 2(L-1) steps
        return cost(0, 0, 2 * (l - 1), 2 * (l - 1) / l * payload, **p)

    whole = cost(0, 0, log2(l), log2(l) * s, **p) + across(s)
    pieces = 1
    if piece_bytes and s >= 2 * piece_bytes * (n - 1):
        pieces = min(max_pieces, s // (piece_bytes * (n - 1)))
    piece = s / pieces
    # Piece k crosses while the pod reduce-scatters k+1 and allgathers k-1: the slower of the
    # two paths sets the pace, the first reduce-scatter and the last allgather do not overlap.
    net, shm = across(piece / l), inside(piece)
    slices = (pieces - 1) * max(net, shm) + net + shm
    return min(slices, whole)


# Predictions for clusters this machine cannot run, from assumptions stated here and in
# bench/README.md. Shared memory: 2 us per step and 10 GB/s per rank (one core's copy on a
# current 64-vCPU node; this VM's fitted figure, printed first, is 2-3 times slower). The network:
#   EFA  200 Gb/s per node (c7gn.16xlarge, hpc7g), 20 us per message step (libfabric RDM over
#        SRD, a few round trips of a small message);
#   TCP  one flow capped at 10 Gb/s (EC2, placement group), 40 us per step; the flat ring runs
#        one flow per pod pair, the hierarchical scheme L, capped by a 100 Gb/s NIC.
CLUSTERS = {
    "EFA 200 Gb/s": dict(a_n=20e-6, link=200e9, flow=200e9, choices=FABRIC_EFA),
    "TCP 10 Gb/s/flow": dict(a_n=40e-6, link=100e9, flow=10e9, choices=GLOO),
}
MODELS = {"MNIST CNN (4.8 MB)": 4.8e6, "ResNet-20 (1.1 MB)": 1.09e6}


NODE_SHM = dict(a_s=2e-6, b_s=1 / 10e9)


def cluster_params(cluster, l, shm=NODE_SHM):
    c = CLUSTERS[cluster]
    flat_b = 8 / min(c["flow"], c["link"])              # one flow per pod pair
    hier_b = 8 / min(c["flow"] * l, c["link"])          # L flows per pod pair
    return (dict(a_n=c["a_n"], b_n=flat_b, **shm, **c["choices"]),
            dict(a_n=c["a_n"], b_n=hier_b, **shm, **c["choices"]))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="+")
    parser.add_argument("--out")
    parser.add_argument("--backward-ms", type=float, default=None,
                        help="backward time per step, to say how much of the allreduce overlap "
                             "can hide")
    args = parser.parse_args()
    runs = parse(args.results)
    out = []

    def emit(text=""):
        print(text)
        out.append(text)

    shm_runs = [v for (n, l, _), v in runs.items() if n == 1 and l == 2]
    if not shm_runs or "fabric-flat" not in shm_runs[0]:
        sys.exit("alpha_beta_model: needs a 1 pod x 2 ranks run with fabric-flat (shm)")
    a_s, b_s = fit(shm_runs[0]["fabric-flat"], small_steps=2)
    emit(f"shm inside a pod: alpha {a_s * 1e6:.1f} us, beta {b_s * 1e9:.3f} ns/B "
         f"({8 / b_s / 1e9:.1f} Gb/s)")
    params = {}
    for (n, l, rate), variants in sorted(runs.items()):
        if n != 2 or l != 1:
            continue
        for backend in ("gloo", "fabric"):
            data = variants.get(f"{backend}-flat")
            if data:
                a_n, b_n = fit(data)
                burst = bucket_bytes(rate)
                params[(backend, rate)] = dict(a_n=a_n, b_n=b_n, a_s=a_s, b_s=b_s, burst=burst,
                                               **(GLOO if backend == "gloo" else FABRIC_TCP))
                emit(f"{backend} between pods, {rate}: alpha {a_n * 1e6:.1f} us, beta "
                     f"{b_n * 1e9:.3f} ns/B ({8 / b_n / 1e9:.2f} Gb/s)")
    emit()
    emit("check against the measured 2- and 4-pod points (model / measured):")
    errors = []
    for (n, l, rate), variants in sorted(runs.items()):
        if n < 2 or (n == 2 and l == 1):
            continue
        for variant, data in sorted(variants.items()):
            if variant == "c10d" or ":" in variant:
                continue
            backend, mode = variant.split("-")
            p = params.get((backend, rate))
            if not p:
                continue
            model = hierarchical if mode == "hier" else flat
            cells = []
            for size, measured in sorted(data.items()):
                predicted = model(n, l, size, **p)
                ratio = predicted / measured
                errors.append((abs(ratio - 1), n, l, rate, variant, size, ratio))
                cells.append(f"{size >> 10}K {ratio:.2f}")
            emit(f"  {n}x{l} {rate} {variant:>12}: " + ", ".join(cells))
    if errors:
        within = sum(1 for e in errors if e[0] <= 0.25)
        emit(f"  {within} of {len(errors)} points within 25 %; worst: " + ", ".join(
            f"{e[1]}x{e[2]} {e[4]} {e[5] >> 10}K {e[6]:.2f}" for e in sorted(errors)[-3:]))
        # From 1 MiB the link bounds an op; below it the latency of ranks that outnumber the
        # cores, which a per-step alpha fitted on 2 ranks does not describe.
        for name, keep in (("from 1 MiB", lambda e: e[5] >= 1 << 20),
                           ("below 1 MiB", lambda e: e[5] < 1 << 20)):
            part = [e for e in errors if keep(e)]
            ok = sum(1 for e in part if e[0] <= 0.25)
            ratios = sorted(e[6] for e in part)
            emit(f"  {name}: {ok} of {len(part)} within 25 % (model / measured "
                 f"{ratios[0]:.2f}-{ratios[-1]:.2f})")
    emit()
    emit("predicted allreduce time per step (ms), flat / hierarchical, L = 8 ranks per pod"
         + (f"; (the share of each that {args.backward_ms:g} ms of backward can hide)"
            if args.backward_ms else ""))
    emit(f"{'cluster':>18} {'model':>20} " + " ".join(f"{n:>24}" for n in (16, 64, 128)))
    for cluster in CLUSTERS:
        flat_p, hier_p = cluster_params(cluster, 8)
        for name, size in MODELS.items():
            cells = []
            for n in (16, 64, 128):
                f = flat(n, 8, size, **flat_p) * 1e3
                h = hierarchical(n, 8, size, **hier_p) * 1e3
                hidden = ""
                if args.backward_ms:
                    hidden = (f" ({min(1.0, args.backward_ms / f):.0%}/"
                              f"{min(1.0, args.backward_ms / h):.0%})")
                cells.append(f"{f:.2f}/{h:.2f}{hidden}")
            emit(f"{cluster:>18} {name:>20} " + " ".join(f"{c:>24}" for c in cells))
    emit()
    emit("hierarchical speed-up over flat, MNIST CNN gradients (4.8 MB), by pods N and ranks L")
    for cluster in CLUSTERS:
        emit(f"  {cluster}")
        ls = (1, 2, 8, 32, 64)
        emit("    " + f"{'N':>5} " + " ".join(f"L={l:<5}" for l in ls))
        for n in (2, 4, 16, 64, 128):
            cells = []
            for l in ls:
                flat_p, hier_p = cluster_params(cluster, l)
                cells.append(f"{flat(n, l, 4.8e6, **flat_p) / hierarchical(n, l, 4.8e6, **hier_p):6.2f}")
            emit("    " + f"{n:>5} " + " ".join(cells))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
