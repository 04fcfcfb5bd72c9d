"""The PyTorch peer of `meshtensor train --init hf:DIR` on a Hugging Face folder of the Llama
family: the published equations of bench/peer_hf_decode.py in float32 eager PyTorch, trained
with AdamW on random windows of `batch` x `seq_len` tokens in `micro_batches` accumulated
backwards (the same work a step of meshtensor does), `threads` threads; prints training tokens/s (after `warmup` steps) and peak resident
memory as one JSON line.
Usage: peer_hf_train.py <folder> [--batch 8] [--seq-len 64] [--micro-batches 1] [--steps 3]
       [--warmup 1] [--threads 2]"""

import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_hf_decode import Peer, read_folder  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config, weights = read_folder(args.folder)
    for tensor in weights.values():
        tensor.requires_grad_(True)
    peer = Peer(config, weights)
    optimizer = torch.optim.AdamW(list(weights.values()), lr=1e-4, weight_decay=0.0)
    vocabulary = peer.head.shape[0]
    generator = torch.Generator().manual_seed(0)
    seconds = 0.0
    for step in range(args.warmup + args.steps):
        begin = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        for _ in range(args.micro_batches):
            rows = args.batch // args.micro_batches
            tokens = torch.randint(0, vocabulary, (rows, args.seq_len + 1), generator=generator)
            hidden = peer.hidden(tokens[:, :-1], 0, [None] * config["num_hidden_layers"])
            logits = hidden @ peer.head.T
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocabulary),
                                                     tokens[:, 1:].reshape(-1), reduction="sum")
            (loss / (args.batch * args.seq_len)).backward()
            del hidden, logits, loss
        optimizer.step()
        if step >= args.warmup:
            seconds += time.perf_counter() - begin
    tokens_per_second = args.steps * args.batch * args.seq_len / seconds
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peer": "pytorch " + torch.__version__, "threads": args.threads,
                      "training_tokens_per_second": tokens_per_second,
                      "peak_resident_bytes": peak}))


if __name__ == "__main__":
    main()
