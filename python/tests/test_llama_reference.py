"""An independent float64 PyTorch forward of the Llama family (Llama 3; Qwen3 with QK-norm; a
head tied to the token table), written from the published equations, reads a checkpoint that
meshtensor trained and scores what mt.generate produced: every position's log-probability
agrees to 1e-5 relative.

The reference knows the checkpoint format (index.json blocks in safetensors files) and how the
fused projections lay out their columns; everything else is the paper's equations."""

import json
import math
import os
import struct

import numpy as np
import pytest
import torch

import meshtensor as mt

torch.set_default_dtype(torch.float64)

FORTUNES = "/usr/share/games/fortunes"


def resolve(root):
    """The newest checkpoint under a root (its LATEST file names it)."""
    return os.path.join(root, open(os.path.join(root, "LATEST")).read().strip())


def read_checkpoint(directory):
    """{name: float64 tensor} of the checkpoint's "model.*" tensors, assembled from their blocks."""
    index = json.load(open(os.path.join(directory, "index.json")))
    data_start = {}
    tensors = {}
    for name, entry in index["tensors"].items():
        if not name.startswith("model.") or entry["dtype"] != "F32":
            continue
        whole = np.zeros(entry["shape"], dtype=np.float32)
        for block in entry["blocks"]:
            path = os.path.join(directory, block["file"])
            if path not in data_start:
                with open(path, "rb") as f:
                    data_start[path] = 8 + struct.unpack("<Q", f.read(8))[0]
            first, last = block["data_offsets"]
            with open(path, "rb") as f:
                f.seek(data_start[path] + first)
                values = np.frombuffer(f.read(last - first), dtype="<f4").reshape(block["shape"])
            where = tuple(slice(o, o + s) for o, s in zip(block["offset"], block["shape"]))
            whole[where] = values
        tensors[name[len("model."):]] = torch.from_numpy(whole.astype(np.float64))
    return tensors


def rms_norm(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, theta):
    """Rotary embedding of [heads, T, head_dim] at positions 0..T-1 (the Hugging Face Llama
    convention: pairs (i, i + head_dim/2))."""
    head_dim = x.shape[-1]
    inverse = 1.0 / theta ** (torch.arange(0, head_dim, 2) / head_dim)
    angles = torch.outer(torch.arange(x.shape[-2]), inverse)
    angles = torch.cat((angles, angles), dim=-1)
    return x * angles.cos() + rotate_half(x) * angles.sin()


def attention(x, w, prefix, c):
    """Grouped-query causal self-attention of x [T, dim]."""
    heads, groups = c["heads"], c["kv_heads"]
    hd, per = c["dim"] // heads, heads // groups
    fused = x @ w[prefix + "qkv.weight"]  # columns group by group: its queries, its key, its value
    t = x.shape[0]
    fused = fused.reshape(t, groups, per + 2, hd)
    q = fused[:, :, :per].reshape(t, heads, hd).transpose(0, 1)
    k = fused[:, :, per].transpose(0, 1)
    v = fused[:, :, per + 1].transpose(0, 1)
    if c["qk_norm"]:
        q = rms_norm(q, w[prefix + "q_norm.weight"], c["norm_eps"])
        k = rms_norm(k, w[prefix + "k_norm.weight"], c["norm_eps"])
    q, k = rope(q, c["rope_theta"]), rope(k, c["rope_theta"])
    k = k.repeat_interleave(per, dim=0)  # query head h reads key/value head h // per
    v = v.repeat_interleave(per, dim=0)
    scores = q @ k.transpose(1, 2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(0, 1).reshape(t, heads * hd) @ w[prefix + "proj.weight"]


def swiglu_mlp(x, w, prefix, c):
    """down(silu(gate x) * up x), gate and up fused in `heads` blocks of [gate | up] columns."""
    fused = (x @ w[prefix + "gate_up.weight"]).reshape(x.shape[0], c["heads"], 2, -1)
    gate = fused[:, :, 0].reshape(x.shape[0], -1)
    up = fused[:, :, 1].reshape(x.shape[0], -1)
    return (torch.nn.functional.silu(gate) * up) @ w[prefix + "down.weight"]


def log_probabilities(w, c, tokens):
    h = w["embed.token.weight"][torch.tensor(tokens)]
    for b in range(c["layers"]):
        p = f"blocks.{b}."
        h = h + attention(rms_norm(h, w[p + "norm1.weight"], c["norm_eps"]), w, p + "attn.", c)
        h = h + swiglu_mlp(rms_norm(h, w[p + "norm2.weight"], c["norm_eps"]), w, p + "mlp.", c)
    # A tied head is the token table itself (Hugging Face's tie_word_embeddings).
    head = w["embed.token.weight"].T if c["tie"] else w["head.output.weight"]
    logits = rms_norm(h, w["head.norm.weight"], c["norm_eps"]) @ head
    return torch.log_softmax(logits, dim=-1)


def architecture(directory):
    text = json.load(open(os.path.join(directory, "index.json")))["metadata"]["architecture"]
    words = dict(word.split("=") for word in text.split()[1:])
    config = {key: int(words[key]) for key in ("layers", "heads", "kv_heads", "dim", "context")}
    config.update(rope_theta=float(words["rope_theta"]), norm_eps=float(words["norm_eps"]),
                  qk_norm=words["qk_norm"] == "1", tie=words["tie"] == "1")
    return config


@pytest.mark.parametrize("model", [
    "llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,context=40",
    "llama:layers=2,heads=4,kv_heads=1,dim=32,ffn=64,context=40,qk_norm=1,rope_theta=500000",
    "llama:layers=1,heads=2,kv_heads=2,dim=16,ffn=32,context=40,norm_eps=1e-6",
    "llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,context=40,qk_norm=1,tie=1",
])
def test_generate_agrees_with_a_float64_reference(tmp_path, model):
    save = str(tmp_path / "ckpt")
    corpus = mt.load_text(FORTUNES)
    mt.run_threads(2, lambda world: mt.train(corpus, model=model, steps=30, batch=8, lr=1e-2,
                                             warmup=1, seed=1, eval_every=0, mesh=(2,),
                                             names=("fsdp",), save=save))
    config = architecture(resolve(save))
    weights = read_checkpoint(resolve(save))
    prompt = "Time "
    made = mt.run_threads(1, lambda world: mt.generate(
        save, [prompt], max_new_tokens=config["context"] - len(prompt), temperature=1.0,
        seed=7))[0][0]
    tokens = list(prompt.encode()) + made["tokens"]
    assert len(tokens) == config["context"]  # positions up to the whole context
    reference = log_probabilities(weights, config, tokens[:-1])
    expected = [reference[len(prompt) - 1 + i, token].item()
                for i, token in enumerate(made["tokens"])]
    got = np.array(made["logprobs"])
    assert np.std(got) > 0.3, "the trained model's log-probabilities should vary"
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=0)
