"""PyTorch side of scripts/bench-peer-gpt.sh: trains the model `meshtensor train --model ...`
trains (a GPT here, a Llama-family decoder from peer_llama.py), on the same batches, with the same initialisation scheme, optimizer and schedule, in one
process, and prints one JSON object: training tokens/s (evaluation excluded) and the validation
loss after each evaluation.

The batches come from meshtensor itself (Text.windows), so both trainers see the same windows of
the same text in the same order; the validation loss is the mean cross-entropy over the same
validation windows (consecutive windows of the validation text, at most 64).

Usage: python3 peer_gpt.py --data PATH --architecture TEXT --batch B --steps S --lr LR
                           --warmup W --eval-every E --seed N --threads K [--dtype f32|bf16]
                           [--ddp PROCESSES]
(TEXT: a checkpoint's architecture metadata, "gpt layers=4 heads=4 ..." or "llama ...")
"""
import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn as nn

import meshtensor as mt

VOCABULARY = 256
MAX_EVAL_WINDOWS = 64


class Block(nn.Module):
    def __init__(self, dim, heads, context):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.gelu = nn.GELU(approximate="tanh")
        self.fc_proj = nn.Linear(4 * dim, dim)
        # A plain attribute, not a buffer: Gloo cannot broadcast bool tensors (DDP syncs buffers).
        self.mask = torch.tril(torch.ones(context, context, dtype=torch.bool))

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        scores = scores.masked_fill(~self.mask[:t, :t], float("-inf"))
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(attended)
        return x + self.fc_proj(self.gelu(self.fc(self.norm2(x))))


class Gpt(nn.Module):
    def __init__(self, layers, heads, dim, context):
        super().__init__()
        self.token = nn.Embedding(VOCABULARY, dim)
        self.position = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, context) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCABULARY)
        # meshtensor's initialisation: N(0, 0.02) weights and embeddings, N(0, 0.02/sqrt(2L)) for
        # the projections into the residual stream, zero biases, LayerNorm (1, 0).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif "norm" not in name:
                nn.init.zeros_(p)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1])
        x = self.token(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lr_at(step, base, total, warmup):
    return mt.lr_at(step, base, total, warmup, "cosine")


def validation_windows(text, context):
    data = np.frombuffer(text.validation, dtype=np.uint8).astype(np.int64)
    count = min(MAX_EVAL_WINDOWS, max(0, (len(data) - 1) // context))
    starts = np.arange(count) * context
    tokens = np.stack([data[s:s + context] for s in starts])
    targets = np.stack([data[s + 1:s + context + 1] for s in starts])
    return torch.from_numpy(tokens), torch.from_numpy(targets)


def architecture(text):
    """(family, {key: number}) of a checkpoint's architecture metadata."""
    family, *words = text.split()
    keys = {}
    for word in words:
        key, value = word.split("=")
        if key != "tokenizer":
            keys[key] = float(value) if "." in value or "e" in value else int(value)
    return family, keys


def make_model(text):
    family, keys = architecture(text)
    if family == "llama":
        from peer_llama import Llama
        return Llama(**{k: v for k, v in keys.items() if k != "vocabulary"})
    return Gpt(keys["layers"], keys["heads"], keys["dim"], keys["context"])


def parse_args():
    parser = argparse.ArgumentParser()
    for name, kind in [("data", str), ("architecture", str), ("batch", int), ("steps", int),
                       ("lr", float), ("warmup", int), ("eval_every", int), ("seed", int),
                       ("threads", int)]:
        parser.add_argument("--" + name.replace("_", "-"), type=kind, required=True)
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                        help="bf16: forward and loss under torch.autocast (CPU, bfloat16), "
                             "the weights and optimizer in f32")
    parser.add_argument("--ddp", type=int, default=1,
                        help="processes: above 1, DistributedDataParallel over Gloo, each process "
                             "taking its torch.chunk share of every global batch")
    parser.add_argument("--timed-from", type=int, default=0,
                        help="steps before this one do not count in tokens_per_second")
    return parser.parse_args()


def train(rank, args):
    """One process's training; rank 0 prints the JSON object."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # the same initial weights in every process
    text = mt.load_text(args.data)
    model = make_model(args.architecture)
    if args.ddp > 1:
        torch.distributed.init_process_group("gloo", init_method=args.rendezvous, rank=rank,
                                             world_size=args.ddp)
        trained = nn.parallel.DistributedDataParallel(model)
    else:
        trained = model
    args.context = architecture(args.architecture)[1]["context"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0)
    val_tokens, val_targets = validation_windows(text, args.context)
    samples = text.samples(args.context)
    steps_per_epoch = (samples + args.batch - 1) // args.batch
    train_seconds, tokens_done, evaluations = 0.0, 0, []
    for step in range(args.steps):
        epoch, s = divmod(step, steps_per_epoch)
        count = min(args.batch, samples - s * args.batch)
        tokens, targets = text.windows(args.context, args.seed, epoch, s * args.batch, count)
        tokens, targets = torch.from_numpy(tokens), torch.from_numpy(targets)
        if args.ddp > 1:  # this process's rows; DDP averages the gradients of equal shares
            tokens = torch.chunk(tokens, args.ddp)[rank]
            targets = torch.chunk(targets, args.ddp)[rank]
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.lr, args.steps, args.warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            logits = trained(tokens)
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY).float(),
                                               targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.ddp > 1:
            torch.distributed.barrier()  # the step ends when every process's does
        if step >= args.timed_from:
            train_seconds += time.perf_counter() - start
            tokens_done += count * args.context
        if rank == 0 and ((step + 1) % args.eval_every == 0 or step + 1 == args.steps):
            with torch.no_grad():
                logits = model(val_tokens)
                validation = nn.functional.cross_entropy(logits.reshape(-1, VOCABULARY),
                                                         val_targets.reshape(-1)).item()
            evaluations.append({"steps": step + 1, "validation_loss": validation})
    if rank == 0:
        print(json.dumps({"tokens_per_second": tokens_done / train_seconds,
                          "validation_loss": evaluations[-1]["validation_loss"],
                          "evaluations": evaluations, "threads": args.threads,
                          "processes": args.ddp, "dtype": args.dtype}), flush=True)
    if args.ddp > 1:
        torch.distributed.destroy_process_group()


def main():
    args = parse_args()
    if args.ddp > 1:
        import socket
        with socket.socket() as probe:  # a free port for the rendezvous
            probe.bind(("127.0.0.1", 0))
            args.rendezvous = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
        torch.multiprocessing.spawn(train, args=(args,), nprocs=args.ddp)
    else:
        train(0, args)


if __name__ == "__main__":
    main()
