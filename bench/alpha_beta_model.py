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

With --graviton it adds (or, without results, prints alone) a prediction for the k8s job's
training (train_mnist, 64 images per rank per step) on AWS Graviton nodes (c7g, c7gn, hpc7g,
c8g .16xlarge) from published figures and stated assumptions, each cited where it is set below:
a model, not a measurement.

usage: bench/alpha_beta_model.py RESULTS.txt [RESULTS.txt ...] [--graviton] [--out table.txt]
       bench/alpha_beta_model.py --graviton [--out table.txt]
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


# ---------------------------------------------------------------------------------------------
# Graviton (--graviton): the k8s job's training (train_mnist's MNIST CNN, and ResNet-20 for the
# second gradient size) on AWS Graviton nodes. Every figure below is either published, with its source (title and
# address) beside it, or an assumption that says so. A model, not a measurement: it becomes one
# the day a Graviton host is reachable (bench/README.md, "Graviton: a prediction", names the runs
# that replace each assumption).

SOURCES = [  # printed at the end of the report; the comments below cite the same titles
    ("AWS Graviton3 CPU with 64 Cores and DDR5 Memory Available with Three Sockets Per "
     "Motherboard (TechPowerUp, 2022-05-24)",
     "https://techpowerup.com/295203/aws-graviton3-cpu-with-64-cores-and-ddr5-memory-available"
     "-with-three-sockets-per-motherboard"),
    ("AWS Graviton3 (WikiChip)", "https://en.wikichip.org/wiki/AWS_Graviton3"),
    ("ServerNews, on the Graviton3E instances (in Russian): Neon 4x128 bit and SVE 2x256 bit",
     "https://servernews.ru/1078086"),
    ("Amazon introduces the most powerful ARM CPU ever: 64 cores with 55 billion transistors "
     "(c7g: 64 vCPUs, 128 GB DDR5, 30 Gbps)",
     "https://scimyst.com/amazon-introduces-the-most-powerful-arm-cpu-ever-64-cores-with-55-"
     "billion-transistors-120791"),
    ("Amazon EC2 C7g instances (C7g, C7gd, C7gn)",
     "https://aws.amazon.com/ec2/instance-types/c7g/"),
    ("Amazon EC2 Hpc7g instances", "https://aws.amazon.com/ec2/instance-types/hpc7g/"),
    ("Amazon EC2 C8g instances", "https://aws.amazon.com/ec2/instance-types/c8g/"),
    ("Amazon EC2 instance network bandwidth (single flow: 5 Gbps, 10 Gbps in a cluster placement "
     "group, 25 Gbps with ENA Express)",
     "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html"),
    ("Abnormal in-node latency with EFA enabled (aws-parallelcluster: osu_latency through "
     "the EFA device, c5n.18xlarge, 14.8 us at 0 bytes)",
     "https://github.com/aws/aws-parallelcluster/issues/1143"),
    ("Questions about benchmark on AWS-EFA (libfabric: fi_rdm_tagged_bw, one endpoint pair "
     "between two c5n.18xlarge, 6.9 GB/s)", "https://github.com/ofiwg/libfabric/issues/5694"),
    ("Shalev et al., A Cloud-Optimized Transport Protocol for Elastic and Scalable HPC, IEEE "
     "Micro 40(6), 2020 (SRD, the transport under EFA)", "https://doi.org/10.1109/MM.2020.3016891"),
    ("Amazon Unveils Graviton4: A 96-Core ARM CPU with 536.7 GBps Memory Bandwidth (AnandTech, "
     "2023-11-29: 30 % higher compute performance than Graviton3 on average)",
     "https://www.anandtech.com/show/21172/amazon-unveils-graviton4-a-96core-cpu-with-5367-gbs-"
     "memory-bandwidth"),
    ("AWS Pushes Bang For The Buck With Graviton 4 Instances (The Next Platform, 2024-07-09: "
     "Neoverse V2 at 2.8 GHz)",
     "https://www.nextplatform.com/2024/07/09/aws-charges-a-hefty-premium-for-graviton-4-"
     "instances/"),
    ("Graviton4 は 1 vCPU だと Graviton3 より遅い? "
     "STREAM ベンチマークでメモリ帯域幅を調べていたときの話 "
     "(DevelopersIO, in Japanese, 2026-02-21: at 64 vCPUs Graviton4 80-100 % faster in every "
     "STREAM operation)",
     "https://dev.classmethod.jp/articles/graviton3-vs-graviton4-stream-memory-bandwidth-"
     "comparison"),
    ("AWS EKS node system and kubelet resource reservation (kubelet CPU: 6 % of the first core, "
     "1 % of the second, 0.5 % of the third and fourth, 0.25 % of the rest)",
     "https://wcarlsen.github.io/2026-06-16-aws-eks-node-resource-reservation/"),
    ("AWS Graviton (Wikipedia: static clock rates, no simultaneous multithreading)",
     "https://en.wikipedia.org/wiki/AWS_Graviton"),
]

# The compute side. FLOPs of one training image from the layer shapes (2 FLOPs per multiply-add;
# backward computes the weight gradient and the input gradient, each as many multiply-adds as
# forward, and no input gradient for the first layer), then one core's achieved rate.


def conv(cin, cout, k, out_hw, bias=True):
    """(parameters, forward multiply-adds per image) of a k x k convolution."""
    return cout * cin * k * k + (cout if bias else 0), cout * out_hw * out_hw * cin * k * k


def linear(fin, fout):
    return fin * fout + fout, fin * fout


def batch_norm(c):
    return 2 * c, 0  # memory-bound; left out of the FLOP count (the efficiency absorbs it)


def mnist_cnn_layers():  # lib/src/models/mnist_cnn.cpp, 28 x 28 x 1 images
    return [conv(1, 32, 3, 26), conv(32, 64, 3, 24), linear(64 * 12 * 12, 128), linear(128, 10)]


def resnet20_layers():  # lib/src/models/resnet.cpp, depth 20, 32 x 32 x 3 images
    layers = [conv(3, 16, 3, 32, bias=False), batch_norm(16)]
    cin, hw = 16, 32
    for stage in range(3):
        cout = 16 << stage
        for block in range(3):
            stride = 2 if stage and not block else 1
            hw //= stride
            layers += [conv(cin, cout, 3, hw, bias=False), batch_norm(cout),
                       conv(cout, cout, 3, hw, bias=False), batch_norm(cout)]
            if stride != 1 or cin != cout:
                layers += [conv(cin, cout, 1, hw, bias=False), batch_norm(cout)]
            cin = cout
    return layers + [linear(64, 10)]


GRAVITON_MODELS = {"MNIST CNN (4.8 MB)": mnist_cnn_layers, "ResNet-20 (1.1 MB)": resnet20_layers}
BATCH = 64  # --batch-size's default (examples/training_flags.cpp): images per rank per step


def training_flops(layers):
    fwd = [2 * macs for _, macs in layers]
    return sum(fwd) + sum(fwd) + sum(fwd[1:])  # forward, weight gradients, input gradients


def buckets(layers, first_cap=1 << 20, cap=25 << 20):
    """[(bytes, ready)]: DDP's gradient buckets (lib/src/parallel/bucket_assignment.h: reverse
    registration order, the first closed from 1 MiB, the others from 25 MiB), each with the share
    of the step's compute done when its last gradient is ready (forward, then backward layer by
    layer from the last; a layer's backward costs its weight and input gradients)."""
    fwd = [2 * macs for _, macs in layers]
    total = training_flops(layers)
    done, out, size = sum(fwd), [], 0
    for i in reversed(range(len(layers))):
        done += fwd[i] * (2 if i else 1)
        size += 4 * layers[i][0]
        if size >= (first_cap if not out else cap) or i == 0:
            out.append((size, done / total))
            size = 0
    return out


# Measured on x86 (bench/results/2026-11-22-training-evening.md: `ours`, fp32, 2 ranks of one
# thread on a 2-vCPU VM, batch 64 per rank): 85.8 ms per step, allreduce included. Only a
# cross-check of the assumption below: that run did not record the CPU model.
X86_STEP_S = 85.8e-3

# One Graviton3 core (Neoverse V1) at 2.6 GHz, a fixed clock with every core busy:
#   "Graviton3's 64 cores run at 2.6 GHz clock speed, 300 GB/sec maximum memory bandwidth" --
#   AWS Graviton3 CPU with 64 Cores and DDR5 Memory Available with Three Sockets Per Motherboard,
#   https://techpowerup.com/295203/ (TechPowerUp); AWS Graviton (Wikipedia: static clock rates),
#   https://en.wikipedia.org/wiki/AWS_Graviton.
# 32 FP32 FLOPs per cycle: four 128-bit Neon (or two 256-bit SVE) FMA pipes, 4 lanes x 2 FLOPs
#   x 4 pipes -- ServerNews on the Graviton3E instances, https://servernews.ru/1078086.
# Assumption: libtorch's fp32 training step (convolutions, activations, optimizer, data) reaches
#   40 % of that peak on one core; nothing published measures it.
G3_CLOCK_HZ = 2.6e9
G3_FLOP_PER_CYCLE = 32
G3_EFFICIENCY = 0.40
G3_RATE = G3_CLOCK_HZ * G3_FLOP_PER_CYCLE * G3_EFFICIENCY  # 33.3 GFLOP/s
# Graviton4 (Neoverse V2, 2.8 GHz -- The Next Platform, AWS Pushes Bang For The Buck With
# Graviton 4 Instances, https://www.nextplatform.com/2024/07/09/aws-charges-a-hefty-premium-for-
# graviton-4-instances/): "on average 30% higher compute performance compared to Graviton3"
# (AnandTech, Amazon Unveils Graviton4, https://www.anandtech.com/show/21172/); assumption: the
# 30 % holds per core for this job. Graviton3E (c7gn, hpc7g): assumption, a Graviton3 core.
G4_SPEEDUP = 1.30

# Memory: Graviton3's eight DDR5-4800 channels, 307.2 GB/s -- AWS Graviton3 (WikiChip),
# https://en.wikichip.org/wiki/AWS_Graviton3 ("300 GB/sec maximum" in TechPowerUp's article).
# Assumption: 80 % of it sustained by copies (what STREAM on a c7g.16xlarge would measure).
# Graviton4's 16xlarge: 1.8x, the low end of "80-100 % faster in every STREAM operation at 64
# vCPUs" -- DevelopersIO, Graviton3 vs Graviton4 STREAM,
# https://dev.classmethod.jp/articles/graviton3-vs-graviton4-stream-memory-bandwidth-comparison.
G3_MEMORY_BW = 0.8 * 307.2e9
G4_MEMORY_BW = 1.8 * G3_MEMORY_BW
# The shared-memory level (libfabric shm: cross-memory-attach copies) of every rank on a node runs
# at once, so the node's memory bandwidth caps it. Assumption: 2.5 bytes of DRAM traffic per byte
# a rank receives (reduce-scatter reads the peer's chunk, reads and writes its own; allgather
# reads and writes), 2 us per step and at most 10 GB/s per rank as in NODE_SHM above.
SHM_DRAM_BYTES = 2.5

# Networks.
#   ENA, TCP: one flow at most 10 Gbps in a cluster placement group -- Amazon EC2 instance network
#     bandwidth, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-
#     bandwidth.html; 40 us per message step (assumption, the TCP cluster's above); the default
#     gloo backend's choices.
#   EFA: 20 us per message step (assumption, the EFA cluster's above; the one published figure
#     found, 14.8 us one way for 0 bytes through the EFA device of a c5n.18xlarge, is in Abnormal
#     in-node latency with EFA enabled, https://github.com/aws/aws-parallelcluster/issues/1143);
#     one endpoint pair at most 55 Gbps (6.9 GB/s measured between two c5n.18xlarge, one
#     endpoint each, 100 Gbps with two -- Questions about benchmark on AWS-EFA,
#     https://github.com/ofiwg/libfabric/issues/5694; assumption: the same on Graviton3E); the
#     fabric backend's EFA choices (k8s/overlays/efa).
#   Assumption: one EFA device per c7gn.16xlarge or hpc7g.16xlarge (one network card), so the EFA
#     device plugin gives it to one pod; with more pods per node the job runs over TCP. Check with
#     `aws ec2 describe-instance-types --query 'InstanceTypes[].NetworkInfo.EfaInfo'`.
#   Pods on one node share its NIC; traffic between two pods of one node is counted on it too
#     (assumption, pessimistic: the kernel carries it, not the NIC).
TCP = dict(a_n=40e-6, flow=10e9, choices=GLOO, name="TCP (gloo)")
EFA = dict(a_n=20e-6, flow=55e9, choices=FABRIC_EFA, name="EFA (fabric)")

# Instance types. c7g.16xlarge: 64 vCPUs (one core each), 128 GiB, 30 Gbps -- Amazon EC2 C7g
# instances, https://aws.amazon.com/ec2/instance-types/c7g/, and "128 GB of DDR5 RAM with a
# network bandwidth of 30 Gbps" (Amazon introduces the most powerful ARM CPU ever,
# https://scimyst.com/amazon-introduces-the-most-powerful-arm-cpu-ever-64-cores-with-55-billion-
# transistors-120791). c7gn.16xlarge: 64 vCPUs, 128 GiB, 200 Gbps, EFA (the C7g page's C7gn
# table); hpc7g.16xlarge: 64 Graviton3E cores, 128 GiB, 200 Gbps EFA (Amazon EC2 Hpc7g
# instances, https://aws.amazon.com/ec2/instance-types/hpc7g/); c8g.16xlarge: 64 Graviton4 vCPUs,
# 128 GiB, 30 Gbps (Amazon EC2 C8g instances, https://aws.amazon.com/ec2/instance-types/c8g/;
# r8g.16xlarge, 512 GiB, is the same to this model). The c7gn, hpc7g and c8g rows were not
# checked against the pages' text: verify them with `aws ec2 describe-instance-types`.
INSTANCES = {
    "c7g.16xlarge": dict(cpu="Graviton3", cores=64, nic=30e9, net=TCP, rate=G3_RATE,
                         memory_bw=G3_MEMORY_BW),
    "c7gn.16xlarge": dict(cpu="Graviton3E", cores=64, nic=200e9, net=EFA, rate=G3_RATE,
                          memory_bw=G3_MEMORY_BW),
    "hpc7g.16xlarge": dict(cpu="Graviton3E", cores=64, nic=200e9, net=EFA, rate=G3_RATE,
                           memory_bw=G3_MEMORY_BW),
    "c8g.16xlarge": dict(cpu="Graviton4", cores=64, nic=30e9, net=TCP, rate=G3_RATE * G4_SPEEDUP,
                         memory_bw=G4_MEMORY_BW),
}

# Layouts of one node: pods x ranks per pod. On EKS a Guaranteed pod asks for whole CPUs, and the
# kubelet keeps 6 % of the first core, 1 % of the second, 0.5 % of the third and fourth and 0.25 %
# of the others (0.23 CPU of 64) -- AWS EKS node system and kubelet resource reservation,
# https://wcarlsen.github.io/2026-06-16-aws-eks-node-resource-reservation/; with the DaemonSets'
# requests (assumption: under 0.77 CPU) 63 CPUs fit on a 64-vCPU node, 64 do not.
LAYOUTS = [(1, 64), (4, 16), (1, 63), (1, 60), (2, 30), (4, 15)]
SCHEDULABLE_CPUS = 63
# Assumption: the collectives' threads need cores of their own for the allreduce to overlap
# backward. With a rank on every core the model overlaps nothing (allreduce after backward, in
# full); with a core in 16 left free (60 ranks of 64) each bucket starts when its gradients are
# ready. Both are printed; the layout named best uses this rule.
OVERLAP_FREE_CORES = 4
NODE_COUNTS = (2, 4, 8, 16)


def layout_network(inst, pods):
    """The network between pods of this layout: EFA only where one pod holds the node's device."""
    net = inst["net"]
    return TCP if net is EFA and pods > 1 else net


def graviton_allreduce(inst, nodes, pods, ranks, size):
    """(hierarchical, flat) seconds for one allreduce of `size` bytes over `nodes` instances of
    `pods` pods of `ranks` ranks; the library's automatic choice is the hierarchical one."""
    net = layout_network(inst, pods)
    link = inst["nic"] / pods  # the pods of a node share its NIC
    b_s = max(NODE_SHM["b_s"], SHM_DRAM_BYTES * pods * ranks / inst["memory_bw"])
    shm = dict(a_s=NODE_SHM["a_s"], b_s=b_s)
    n = nodes * pods
    hier = hierarchical(n, ranks, size, a_n=net["a_n"], b_n=8 / min(net["flow"] * ranks, link),
                        **shm, **net["choices"])
    flat_t = flat(n, ranks, size, a_n=net["a_n"], b_n=8 / min(net["flow"], link), **shm,
                  **net["choices"])
    return hier, flat_t


def graviton_step(inst, nodes, pods, ranks, layers):
    """(compute, serial step, overlapped step, allreduce total) in seconds for one rank's step."""
    compute = BATCH * training_flops(layers) / inst["rate"]
    times = [(graviton_allreduce(inst, nodes, pods, ranks, size)[0], ready)
             for size, ready in buckets(layers)]
    serial = compute + sum(t for t, _ in times)
    clock = 0.0
    for t, ready in times:  # one communicator: bucket after bucket, each once its gradients are
        clock = max(clock, ready * compute) + t
    return compute, serial, max(compute, clock), sum(t for t, _ in times)


def best_first(layouts):
    """(nodes, images/s, layout, step, share, allreduce) tuples, the most images/s first; within
    0.2 % of the most (ties, at this model's precision) the shortest allreduce first."""
    top = max(b[1] for b in layouts)
    return sorted(layouts, key=lambda b: (b[1] < 0.998 * top, b[5] if b[1] >= 0.998 * top
                                          else -b[1]))


def graviton_report(emit):
    emit("GRAVITON: model, not a measurement; becomes a measurement the day a Graviton host is "
         "reachable.")
    emit("Every figure is published (sources at the end) or an assumption "
         "(bench/alpha_beta_model.py says which, beside it).")
    emit()
    emit("compute: FLOPs of one training image from the layer shapes (2 per multiply-add; forward,"
         " weight gradients, input gradients but the first layer's)")
    g3 = G3_CLOCK_HZ * G3_FLOP_PER_CYCLE
    for name, make in GRAVITON_MODELS.items():
        layers = make()
        fwd = sum(2 * m for _, m in layers)
        emit(f"  {name:<20} {sum(p for p, _ in layers):>9,} parameters, forward {fwd / 1e6:6.2f} "
             f"MFLOP, training {training_flops(layers) / 1e6:6.2f} MFLOP per image; buckets "
             + ", ".join(f"{s / 1e6:.3f} MB ready at {r:.0%} of the step" for s, r in
                         buckets(layers)))
    mnist = training_flops(mnist_cnn_layers())
    x86_per_image = X86_STEP_S / BATCH
    emit(f"  Graviton3 core: {G3_CLOCK_HZ / 1e9:.1f} GHz x {G3_FLOP_PER_CYCLE} FP32 FLOP/cycle = "
         f"{g3 / 1e9:.1f} GFLOP/s peak; x {G3_EFFICIENCY:.0%} achieved (assumption) = "
         f"{G3_RATE / 1e9:.1f} GFLOP/s")
    emit(f"  MNIST CNN on one Graviton3 core: {mnist / 1e6:.2f} MFLOP / {G3_RATE / 1e9:.1f} GFLOP/s"
         f" = {mnist / G3_RATE * 1e3:.2f} ms per image, {BATCH * mnist / G3_RATE * 1e3:.0f} ms per "
         f"step of {BATCH}; Graviton4 / {G4_SPEEDUP:.2f} = "
         f"{mnist / G3_RATE / G4_SPEEDUP * 1e3:.2f} ms per image")
    emit("  the step scales with that assumption: at " + ", ".join(
        f"{e:.0%} of peak {BATCH * mnist / (g3 * e) * 1e3:.0f} ms" for e in (0.25, 0.40, 0.60))
        + " per step of 64 (the allreduce does not: its share scales the other way)")
    emit(f"  cross-check, measured x86 rank (2026-11-22, 2 ranks on 2 vCPUs, CPU not recorded): "
         f"{X86_STEP_S * 1e3:.1f} ms per step = {x86_per_image * 1e3:.2f} ms per image = "
         f"{mnist / x86_per_image / 1e9:.1f} GFLOP/s achieved; the Graviton3 core is assumed "
         f"{mnist / G3_RATE / x86_per_image:.2f}x slower")
    emit(f"  memory: a node's shm level at most {G3_MEMORY_BW / 1e9:.0f} GB/s (Graviton3, 80 % of "
         f"307.2) or {G4_MEMORY_BW / 1e9:.0f} GB/s (Graviton4 16xlarge), {SHM_DRAM_BYTES} bytes of "
         f"DRAM per byte received: with 64 ranks copying at once "
         f"{G3_MEMORY_BW / SHM_DRAM_BYTES / 64 / 1e9:.2f} GB/s per rank on Graviton3 (10 GB/s "
         f"alone)")
    emit()
    emit("network: TCP 40 us per step, one flow <= 10 Gb/s, the NIC shared by the node's pods; "
         "EFA 20 us per step, one endpoint <= 55 Gb/s, one device per node (more pods per node: "
         "TCP)")
    emit(f"layouts: pods x ranks per node; '*' does not fit a 64-vCPU EKS node ({SCHEDULABLE_CPUS} "
         f"CPUs schedulable); the allreduce overlaps backward only with {OVERLAP_FREE_CORES} cores "
         f"free (1x60, 2x30, 4x15), else follows it in full (assumption)")
    for inst_name in ("c7g.16xlarge", "c7gn.16xlarge"):
        inst = INSTANCES[inst_name]
        for model_name, make in GRAVITON_MODELS.items():
            layers = make()
            size = 4 * sum(p for p, _ in layers)
            names = [f"{p}x{r}{'*' if p * r > SCHEDULABLE_CPUS else ''}" for p, r in LAYOUTS]
            emit()
            emit(f"{inst_name} ({inst['cpu']}, {inst['nic'] / 1e9:.0f} Gb/s, "
                 f"{inst['net']['name']}), {model_name}, {BATCH} images per rank per step")
            emit("  allreduce ms, hierarchical / flat")
            emit(f"  {'nodes':>5} " + "".join(f"{n:>14}" for n in names))
            for nodes in NODE_COUNTS:
                cells = [graviton_allreduce(inst, nodes, p, r, size) for p, r in LAYOUTS]
                emit(f"  {nodes:>5} " + "".join(f"{f'{h * 1e3:.1f}/{f * 1e3:.1f}':>14}"
                                                for h, f in cells))
            l = 60
            shm_part = cost(0, 0, 2 * (l - 1), 2 * (l - 1) / l * size, 0, 0, NODE_SHM["a_s"],
                            max(NODE_SHM["b_s"], SHM_DRAM_BYTES * l / inst["memory_bw"]))
            emit(f"  of which the shared-memory level (reduce-scatter and allgather in the pod), "
                 f"1x60: {shm_part * 1e3:.1f} ms at any node count")
            emit("  step ms (the share of it the allreduce adds, not hidden by backward) and "
                 "thousands of images/s per node; '*': does not fit")
            emit(f"  {'nodes':>5} " + "".join(f"{n:>20}" for n in names))
            best = []
            for nodes in NODE_COUNTS:
                cells = []
                for pods, ranks in LAYOUTS:
                    used = pods * ranks
                    compute, serial, overlapped, total = graviton_step(inst, nodes, pods, ranks,
                                                                      layers)
                    step = overlapped if inst["cores"] - used >= OVERLAP_FREE_CORES else serial
                    rate = used * BATCH / step
                    share = (step - compute) / step
                    cells.append(f"{step * 1e3:.1f} ({share:.1%}) {rate / 1e3:.1f}")
                    if used <= SCHEDULABLE_CPUS:
                        best.append((nodes, rate, f"{pods}x{ranks}", step, share, total))
                emit(f"  {nodes:>5} " + "".join(f"{c:>20}" for c in cells))
            picks = []
            for n in NODE_COUNTS:
                fits = best_first([b for b in best if b[0] == n])
                near = [b[2] for b in fits[1:] if b[1] >= 0.99 * fits[0][1]]
                picks.append(f"    {n:>2} nodes: {fits[0][2]}, {fits[0][3] * 1e3:.1f} ms per step, "
                             f"allreduce {fits[0][5] * 1e3:.1f} ms, {fits[0][4]:.1%} of the "
                             f"step not hidden" +
                             (f"; within 1 %: {', '.join(near)}" if near else ""))
            emit("  best layout that fits, by images/s per node:")
            for line in picks:
                emit(line)
            compute, serial, overlapped, _ = graviton_step(inst, NODE_COUNTS[-1], 1, 64, layers)
            emit(f"  1x64 at {NODE_COUNTS[-1]} nodes if overlap worked with every core a rank: "
                 f"{overlapped * 1e3:.1f} ms instead of {serial * 1e3:.1f}")
    emit()
    emit("the other Graviton nodes, MNIST CNN, best layout that fits (step, the allreduce's "
         "share):")
    for inst_name in ("hpc7g.16xlarge", "c8g.16xlarge"):
        inst = INSTANCES[inst_name]
        cells = []
        for nodes in NODE_COUNTS:
            choices = []
            for pods, ranks in LAYOUTS:
                used = pods * ranks
                if used > SCHEDULABLE_CPUS:
                    continue
                compute, serial, overlapped, total = graviton_step(inst, nodes, pods, ranks,
                                                                  mnist_cnn_layers())
                step = overlapped if inst["cores"] - used >= OVERLAP_FREE_CORES else serial
                choices.append((nodes, used * BATCH / step, f"{pods}x{ranks}", step,
                                (step - compute) / step, total))
            _, rate, layout, step, share, _ = best_first(choices)[0]
            cells.append(f"{nodes} nodes {layout} {step * 1e3:.1f} ms ({share:.1%})")
        emit(f"  {inst_name} ({inst['cpu']}): " + ", ".join(cells))
    emit()
    emit("sources:")
    for i, (title, url) in enumerate(SOURCES, 1):
        emit(f"  [{i}] {title}")
        emit(f"      {url}")


def fitted_report(args, emit):
    """The fit on this machine's simulated pods, its check and the predictions above."""
    runs = parse(args.results)
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="*")
    parser.add_argument("--out")
    parser.add_argument("--backward-ms", type=float, default=None,
                        help="backward time per step, to say how much of the allreduce overlap "
                             "can hide")
    parser.add_argument("--graviton", action="store_true",
                        help="train_mnist on AWS Graviton nodes, from published figures and "
                             "stated assumptions (no results needed)")
    args = parser.parse_args()
    if not args.results and not args.graviton:
        parser.error("give simulated_pods results to fit, --graviton, or both")
    out = []

    def emit(text=""):
        print(text)
        out.append(text)

    if args.results:
        fitted_report(args, emit)
    if args.graviton:
        if args.results:
            emit()
        graviton_report(emit)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
