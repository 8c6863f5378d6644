"""One rank of the DDP equality run (ddprun_torch_test.py): the shape of kubeflow's
mnist.py (a CNN, DistributedDataParallel, a DistributedSampler) on a Fashion-MNIST subset.

    ddp_worker.py BACKEND MODE     BACKEND: gloo or ddprun; MODE: plain, no_sync, bf16_hook,
                                   fp16_hook or join

join: uneven inputs, the last rank stops JOIN_SHORT steps early, inside DDP's join() context
(the others' allreduces meet its shadow ones, and the final model is broadcast).

Prints "STEP <n> loss=<x>" per step on rank 0 and "ACCURACY <x>" at the end, for the driver to
compare between backends (same seed, same data, same order).
"""

import contextlib
import gzip
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

DATA = "/usr/share/datasets/fashion-mnist"
SAMPLES = 1024
BATCH = 32
JOIN_SHORT = 3


def read_idx(name, offset):
    with gzip.open(os.path.join(DATA, name)) as f:
        return torch.frombuffer(bytearray(f.read()[offset:]), dtype=torch.uint8)


def load(prefix, n):
    images = read_idx(f"{prefix}-images-idx3-ubyte.gz", 16).view(-1, 1, 28, 28)[:n]
    labels = read_idx(f"{prefix}-labels-idx1-ubyte.gz", 8)[:n].long()
    return images.float().div(255).sub(0.2860).div(0.3530), labels


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 5)
        self.conv2 = nn.Conv2d(8, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def train(model, optimizer, loader, steps, mode, rank):
    for step, (x, y) in enumerate(loader):
        if step >= steps:
            break
        if mode == "no_sync" and step % 2 == 0:
            with model.no_sync():
                F.cross_entropy(model(x), y).backward()
            continue
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"STEP {step} loss={loss.item():.8f}", flush=True)


def main():
    backend, mode = sys.argv[1], sys.argv[2]
    if backend == "ddprun":
        import ddprun_torch  # noqa: F401 -- registers the backend
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = DDP(Net())
    if mode.endswith("_hook"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        compress = {"bf16_hook": default_hooks.bf16_compress_hook,
                    "fp16_hook": default_hooks.fp16_compress_hook}[mode]

        # DDP refuses bf16_compress_hook by its name unless torch was built with CUDA 11+ and
        # NCCL 2.10+; the same function under another name runs on CPU.
        def compressed(state, bucket):
            return compress(state, bucket)

        model.register_comm_hook(None, compressed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images, labels = load("train", SAMPLES)
    dataset = torch.utils.data.TensorDataset(images, labels)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, world, rank, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    steps = len(loader) - (JOIN_SHORT if mode == "join" and rank == world - 1 else 0)
    with model.join() if mode == "join" else contextlib.nullcontext():
        train(model, optimizer, loader, steps, mode, rank)
    test_x, test_y = load("t10k", 512)
    with torch.no_grad():
        correct = (model(test_x).argmax(1) == test_y).sum().item()
    if rank == 0:
        print(f"ACCURACY {correct / len(test_y):.6f}", flush=True)
    dist.destroy_process_group()


main()
