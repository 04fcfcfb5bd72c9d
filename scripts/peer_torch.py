"""PyTorch side of scripts/bench-peer.sh: trains the model `meshtensor train` trains by default
(784-1024-1024-10 MLP, ReLU, AdamW with a cosine schedule, global batch 256, pixels / 255) on
Fashion-MNIST, in one process or as DDP over gloo, and prints one JSON object with the training
throughput (evaluation excluded) and the test accuracy.

Usage: python3 peer_torch.py single|ddp --data DIR --epochs N --ranks R [--batch 256] [--lr 1e-3]
"""
import argparse
import gzip
import json
import math
import os
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    _, dtype, dims = struct.unpack(">HBB", data[:4])
    shape = struct.unpack(">" + "I" * dims, data[4 : 4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def find(directory, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise SystemExit(f"{directory}: no {stem}[.gz]")


def load(directory):
    def images(stem):
        raw = read_idx(find(directory, stem))
        return torch.from_numpy(raw.reshape(raw.shape[0], -1).astype(np.float32) / 255.0)

    def labels(stem):
        return torch.from_numpy(read_idx(find(directory, stem)).astype(np.int64))

    return (images("train-images-idx3-ubyte"), labels("train-labels-idx1-ubyte"),
            images("t10k-images-idx3-ubyte"), labels("t10k-labels-idx1-ubyte"))


def model():
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def chunk(length, parts, index):
    """The slice of `length` items that part `index` of `parts` takes (first ones one longer)."""
    base, extra = divmod(length, parts)
    start = index * base + min(index, extra)
    return start, base + (1 if index < extra else 0)


def train(rank, ranks, args, queue):
    torch.manual_seed(args.seed)
    distributed = args.setup == "ddp"
    if distributed:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=ranks)
        torch.set_num_threads(1)
    else:
        torch.set_num_threads(ranks)
    x_train, y_train, x_test, y_test = load(args.data)
    net = model()
    if distributed:
        net = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.0)
    samples = x_train.shape[0]
    steps_per_epoch = math.ceil(samples / args.batch)
    total_steps = args.epochs * steps_per_epoch
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / total_steps))))
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(args.seed)
    seconds = 0.0
    for _ in range(args.epochs):
        order = torch.randperm(samples, generator=generator)
        start_time = time.perf_counter()
        for step in range(steps_per_epoch):
            batch = order[step * args.batch : (step + 1) * args.batch]
            offset, size = chunk(len(batch), ranks if distributed else 1, rank)
            mine = batch[offset : offset + size]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(net(x_train[mine]), y_train[mine])
            loss.backward()
            optimizer.step()
            schedule.step()
        seconds += time.perf_counter() - start_time
    with torch.no_grad():
        correct = (net(x_test).argmax(dim=1) == y_test).sum().item()
    if rank == 0:
        queue.put({"setup": args.setup, "ranks": ranks, "epochs": args.epochs,
                   "samples_per_second": args.epochs * samples / seconds, "seconds": seconds,
                   "test_accuracy": correct / x_test.shape[0], "torch": torch.__version__})
    if distributed:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("setup", choices=["single", "ddp"])
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=29571)
    args = parser.parse_args()
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    if args.setup == "single":
        train(0, args.ranks, args, queue)
    else:
        mp.spawn(train, args=(args.ranks, args, queue), nprocs=args.ranks, join=True)
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    main()
