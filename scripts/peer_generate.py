"""PyTorch side of scripts/bench-peer-generate.sh: an incremental GPT decoder with a key/value
cache, the same model as `meshtensor generate`, its weights read from a meshtensor checkpoint
(index.json and safetensors files). Greedy decoding of the same prompts as `meshtensor bench
generate`; prints one JSON object: decode tokens/s per batch size (a run of NEW tokens less a run
of one, so prefill is excluded) and the tokens generated.

Usage: python3 peer_generate.py --checkpoint DIR --prompts-json FILE --new-tokens N --threads K
       (FILE: {"batch": [[token, ...], ...], ...} as the bench writes it)
"""
import argparse
import json
import math
import os
import struct
import time

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def load_checkpoint(path):
    """Every "model.*" tensor of a meshtensor checkpoint, whole, as float32 arrays."""
    if not os.path.exists(os.path.join(path, "index.json")):
        path = os.path.join(path, open(os.path.join(path, "LATEST")).read().strip())
    index = json.load(open(os.path.join(path, "index.json")))
    headers = {}
    tensors = {}
    for name, entry in index["tensors"].items():
        if not name.startswith("model."):
            continue
        whole = np.zeros(entry["shape"], dtype=DTYPES[entry["dtype"]])
        for block in entry["blocks"]:
            file = os.path.join(path, block["file"])
            if file not in headers:
                with open(file, "rb") as f:
                    headers[file] = 8 + struct.unpack("<Q", f.read(8))[0]
            start, end = block["data_offsets"]
            with open(file, "rb") as f:
                f.seek(headers[file] + start)
                data = np.frombuffer(f.read(end - start), dtype=whole.dtype)
            region = tuple(slice(o, o + s) for o, s in zip(block["offset"], block["shape"]))
            whole[region] = data.reshape(block["shape"])
        tensors[name[len("model."):]] = torch.from_numpy(whole)
    return index["metadata"], tensors


class Decoder:
    """The GPT of meshtensor's nn::Gpt, forward only, with a key/value cache per layer."""

    def __init__(self, config, w):
        self.layers, self.heads, self.dim = config["layers"], config["heads"], config["dim"]
        self.w = w

    def norm(self, x, prefix):
        return torch.nn.functional.layer_norm(x, (self.dim,), self.w[prefix + ".weight"],
                                              self.w[prefix + ".bias"], 1e-5)

    def linear(self, x, prefix):  # meshtensor's weights are [in, out]
        return x @ self.w[prefix + ".weight"] + self.w[prefix + ".bias"]

    def step(self, tokens, start, cache):
        """Logits of tokens [batch, t] at positions start.. with `cache` (lists per layer)."""
        b, t = tokens.shape
        h, d = self.heads, self.dim
        hd = d // h
        positions = torch.arange(start, start + t)
        x = self.w["embed.token.weight"][tokens] + self.w["embed.position.weight"][positions]
        for i in range(self.layers):
            p = f"blocks.{i}"
            # qkv columns are head after head: each head's query, key and value side by side.
            qkv = self.linear(self.norm(x, p + ".norm1"), p + ".attn.qkv").view(b, t, h, 3, hd)
            q, k, v = (qkv[:, :, :, j].transpose(1, 2) for j in range(3))
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], dim=2)
                v = torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            total = k.shape[2]
            mask = torch.arange(total)[None, :] <= (start + torch.arange(t))[:, None]
            scores = scores.masked_fill(~mask, float("-inf"))
            attended = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
            x = x + self.linear(attended, p + ".attn.proj")
            hidden = torch.nn.functional.gelu(self.linear(self.norm(x, p + ".norm2"), p + ".mlp.fc"),
                                              approximate="tanh")
            x = x + self.linear(hidden, p + ".mlp.proj")
        return self.linear(self.norm(x, "head.norm"), "head.output")

    @torch.no_grad()
    def generate(self, prompts, new_tokens):
        tokens = torch.tensor(prompts, dtype=torch.long)
        cache = [None] * self.layers
        logits = self.step(tokens, 0, cache)[:, -1]
        out = []
        position = tokens.shape[1]
        for _ in range(new_tokens):
            nxt = logits.argmax(dim=-1)
            out.append(nxt)
            if len(out) == new_tokens:
                break
            logits = self.step(nxt[:, None], position, cache)[:, -1]
            position += 1
        return torch.stack(out, dim=1).tolist()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--prompts-json", required=True)
    parser.add_argument("--new-tokens", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    metadata, weights = load_checkpoint(args.checkpoint)
    fields = dict(word.split("=") for word in metadata["architecture"].split()[1:])
    config = {k: int(fields[k]) for k in ("layers", "heads", "dim")}
    decoder = Decoder(config, weights)
    batches = json.load(open(args.prompts_json))
    result = {"torch": torch.__version__, "threads": args.threads, "batches": {}}
    for batch, prompts in batches.items():
        def timed(n):
            start = time.perf_counter()
            tokens = decoder.generate(prompts, n)
            return time.perf_counter() - start, tokens
        runs = []
        for _ in range(args.rounds):
            full, tokens = timed(args.new_tokens)
            one, _ = timed(1)
            runs.append(max(full - one, 1e-9))
        runs.sort()
        decode = runs[len(runs) // 2]
        result["batches"][batch] = {
            "decode_tokens_s": len(prompts) * (args.new_tokens - 1) / decode,
            "tokens": tokens,
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
