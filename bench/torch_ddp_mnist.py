#!/usr/bin/python3
"""PyTorch DDP reference for bench/train_side_by_side: the same job as examples/train_mnist.

Same model (PyTorch's MNIST example CNN), data (Fashion-MNIST from Debian's package, uint8 in
memory, normalised per batch), sampler (DistributedSampler, seed 0), batch size per rank,
optimiser (SGD momentum 0.9), cosine learning-rate schedule per step, and epochs. Written as a
competent PyTorch user would: DataLoader over a TensorDataset, rank 0 evaluates the test set
after each epoch while the other ranks wait. Writes the same JSONL events as ddp's trainer.

Run under torchrun (python3-torch 1.13 needs the Std fix that train_side_by_side applies).
DDP_BENCH_TORCH_BACKEND=ddprun trains on the library's torch.distributed backend (ddprun_torch,
PyTorch 2.x, found on PYTHONPATH) instead of gloo; bench/simulated_pods --train-python runs both
across simulated pods. Rank 0 prints each epoch as examples/train_mnist does ("epoch 1/2: train
loss 0.51, 1834 img/s; test accuracy 84.10%").
"""
import argparse
import gzip
import json
import math
import os
import resource
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def normalise(images, channels_last):
    x = images.unsqueeze(1).float().div_(255).sub_(MEAN).div_(STD)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def seconds_since_process_start():
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--train-subset", type=int, default=0)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--metrics", default=os.devnull)
    args = p.parse_args()

    backend = os.environ.get("DDP_BENCH_TORCH_BACKEND", "gloo")
    if backend == "ddprun":
        import ddprun_torch  # noqa: F401 -- registers the backend
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    metrics = open(args.metrics, "a") if rank == 0 else None

    def log(event, **fields):
        if metrics:
            metrics.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
            metrics.flush()

    train_x = read_idx(f"{args.data}/train-images-idx3-ubyte.gz")
    train_y = read_idx(f"{args.data}/train-labels-idx1-ubyte.gz").long()
    test_x = read_idx(f"{args.data}/t10k-images-idx3-ubyte.gz")
    test_y = read_idx(f"{args.data}/t10k-labels-idx1-ubyte.gz").long()
    if args.train_subset:
        train_x, train_y = train_x[:args.train_subset], train_y[:args.train_subset]

    model = Net()
    if args.bf16:
        model = model.to(memory_format=torch.channels_last)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    sampler = DistributedSampler(TensorDataset(train_x, train_y), seed=0)
    loader = DataLoader(TensorDataset(train_x, train_y), batch_size=args.batch_size,
                        sampler=sampler)
    steps_per_epoch = len(loader)
    total = args.epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s / total, 1.0))))
    log("start", world_size=world, batch_size_per_rank=args.batch_size,
        steps_per_epoch=steps_per_epoch, seconds_since_process_start=seconds_since_process_start())

    step = 0
    fit_start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        epoch_start = window_start = time.perf_counter()
        window = 0
        for images, labels in loader:
            x = normalise(images, args.bf16)
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                out = ddp(x)
            loss = F.nll_loss(out.float(), labels)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            window += 1
            if step == 1:
                log("first_step", seconds_since_process_start=seconds_since_process_start())
            if args.log_every and step % args.log_every == 0:
                now = time.perf_counter()
                log("step", step=step, loss=loss.item(),
                    images_per_second=window * args.batch_size * world / (now - window_start),
                    step_seconds=(now - window_start) / window)
                window_start, window = now, 0
        train_seconds = time.perf_counter() - epoch_start
        eval_start = time.perf_counter()
        if rank == 0:
            model.eval()
            correct = 0
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                for i in range(0, len(test_x), 1000):
                    pred = model(normalise(test_x[i:i + 1000], args.bf16)).argmax(1)
                    correct += (pred == test_y[i:i + 1000]).sum().item()
            accuracy = correct / len(test_x)
        dist.barrier()
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: train loss {loss.item():.4f}, "
                  f"{steps_per_epoch * args.batch_size * world / train_seconds:.0f} img/s; "
                  f"test accuracy {100 * accuracy:.2f}%", flush=True)
            log("epoch", epoch=epoch + 1, step=step, train_seconds=train_seconds,
                images_per_second=steps_per_epoch * args.batch_size * world / train_seconds,
                eval_seconds=time.perf_counter() - eval_start, test_accuracy=accuracy,
                elapsed_seconds=time.perf_counter() - fit_start)
    peaks = [None] * world
    dist.all_gather_object(peaks, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    log("end", status="completed", step=step, peak_rss_mib_per_rank=peaks)
    dist.barrier()
    leave()  # not destroy_process_group: torch 2.6's gloo teardown can deadlock (c10d_exit.py)


if __name__ == "__main__":
    main()
