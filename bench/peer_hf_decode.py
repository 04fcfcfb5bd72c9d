"""The PyTorch peer of `meshtensor bench generate` on a Hugging Face folder of the Llama family
(Llama, Qwen2, Qwen3): the published equations in float32 eager PyTorch with a key/value cache,
one thread, greedy decoding of `new` tokens after prompts of `prompt` tokens at each batch size;
prints decode tokens/s (prefill excluded) as one JSON line.
Usage: peer_hf_decode.py <folder> [--batches 1,8] [--prompt 16] [--new 16] [--threads 1]"""

import argparse
import json
import math
import os
import struct
import time

import numpy as np
import torch


def read_folder(folder):
    config = json.load(open(os.path.join(folder, "config.json")))
    with open(os.path.join(folder, "model.safetensors"), "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    weights = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        first, last = entry["data_offsets"]
        if entry["dtype"] == "BF16":
            raw = np.frombuffer(data[first:last], np.uint16).astype(np.uint32) << 16
            values = raw.view(np.float32)
        else:
            values = np.frombuffer(data[first:last], np.float32)
        weights[name] = torch.from_numpy(values.reshape(entry["shape"]).copy())
    return config, weights


class Peer:
    def __init__(self, c, w):
        self.c, self.w = c, w
        self.heads, self.kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = w["model.layers.0.self_attn.q_proj.weight"].shape[0] // self.heads
        self.eps = c["rms_norm_eps"]
        self.qwen3 = c["architectures"] == ["Qwen3ForCausalLM"]
        inverse = 1.0 / c.get("rope_theta", 10000.0) ** (
            torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd)
        self.inverse = inverse
        self.head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") \
            else w["lm_head.weight"]

    def norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def rope(self, x, positions):
        angles = positions[:, None].float() * self.inverse[None, :]
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        half = self.hd // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * cos + rotated * sin

    def linear(self, x, name):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if name + ".bias" in self.w else y

    @torch.inference_mode()
    def forward(self, tokens, start, cache):
        """tokens [B, T] at positions start.. ; cache: per layer [k, v] of [B, kv, P, hd]."""
        return self.hidden(tokens, start, cache)[:, -1] @ self.head.T

    def hidden(self, tokens, start, cache):
        """The final norm's output [B, T, dim] (gradients flow when the weights ask for them)."""
        b, t = tokens.shape
        positions = torch.arange(start, start + t)
        h = self.w["model.embed_tokens.weight"][tokens]
        for i in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = self.norm(h, self.w[p + "input_layernorm.weight"])
            q = self.linear(x, p + "self_attn.q_proj").view(b, t, self.heads, self.hd).transpose(1, 2)
            k = self.linear(x, p + "self_attn.k_proj").view(b, t, self.kv, self.hd).transpose(1, 2)
            v = self.linear(x, p + "self_attn.v_proj").view(b, t, self.kv, self.hd).transpose(1, 2)
            if self.qwen3:
                q = self.norm(q, self.w[p + "self_attn.q_norm.weight"])
                k = self.norm(k, self.w[p + "self_attn.k_norm.weight"])
            q, k = self.rope(q, positions), self.rope(k, positions)
            if cache[i] is not None:
                k, v = torch.cat((cache[i][0], k), 2), torch.cat((cache[i][1], v), 2)
            cache[i] = (k, v)
            group = self.heads // self.kv
            keys, values = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = q @ keys.transpose(2, 3) / math.sqrt(self.hd)
            total = keys.shape[2]
            mask = torch.ones(t, total, dtype=torch.bool).tril(total - t)
            scores = scores.masked_fill(~mask, float("-inf"))
            attended = (torch.softmax(scores, -1) @ values).transpose(1, 2).reshape(b, t, -1)
            h = h + self.linear(attended, p + "self_attn.o_proj")
            x = self.norm(h, self.w[p + "post_attention_layernorm.weight"])
            gate = self.linear(x, p + "mlp.gate_proj")
            h = h + self.linear(torch.nn.functional.silu(gate) * self.linear(x, p + "mlp.up_proj"),
                                p + "mlp.down_proj")
        return self.norm(h, self.w["model.norm.weight"])


def decode_rate(peer, batch, prompt, new):
    tokens = torch.randint(0, 1000, (batch, prompt))
    cache = [None] * peer.c["num_hidden_layers"]
    logits = peer.forward(tokens, 0, cache)
    begin = time.perf_counter()
    for step in range(new - 1):
        next_tokens = logits.argmax(-1, keepdim=True)
        logits = peer.forward(next_tokens, prompt + step, cache)
    return batch * (new - 1) / (time.perf_counter() - begin)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    peer = Peer(*read_folder(args.folder))
    rates = {b: decode_rate(peer, int(b), args.prompt, args.new) for b in args.batches.split(",")}
    print(json.dumps({"peer": "pytorch " + torch.__version__, "threads": args.threads,
                      "decode_tokens_per_second": rates}))


if __name__ == "__main__":
    main()
