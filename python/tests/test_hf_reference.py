"""Hugging Face folders checked by an independent float64 PyTorch forward of the published
GPT-2, Llama, Qwen2 and Qwen3 equations (heads of any width, biases wherever the folder has
them, RoPE's linear and llama3 rescaling) that reads a folder by its Hugging Face tensor names
alone (config.json, model.safetensors or its shards, in f32, bf16 or f16):

- a folder `meshtensor checkpoint export --format hf` wrote scores what `meshtensor generate`
  produced from the checkpoint (and from the folder itself, with the same bits) to 1e-5;
- a folder written here, outside meshtensor, in the published shapes of Qwen3-0.6B, Qwen2.5,
  Llama 3.2, SmolLM2 and TinyLlama (smaller), generates with `generate --checkpoint hf:DIR` the
  tokens of the reference's own greedy decode over 40 tokens, their log-probabilities within
  1e-4 relative;
- export -> import -> export gives the same bytes; a folder with a missing tensor, a wrong shape
  or an unknown architecture is refused by name."""

import json
import math
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch

torch.set_default_dtype(torch.float64)

FORTUNES = "/usr/share/games/fortunes"
DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}


def read_safetensors(path):
    """{name: float64 tensor} of one safetensors file."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        first, last = entry["data_offsets"]
        raw = np.frombuffer(data[first:last], dtype=DTYPES[entry["dtype"]][0])
        if entry["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = torch.from_numpy(raw.astype(np.float64).reshape(entry["shape"]))
    return out


def read_folder(directory):
    """config.json and every tensor of a Hugging Face folder, by name."""
    config = json.load(open(os.path.join(directory, "config.json")))
    index = os.path.join(directory, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["model.safetensors"])
    weights = {}
    for file in files:
        weights.update(read_safetensors(os.path.join(directory, file)))
    return config, weights


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def causal_attention(q, k, v):
    """q [heads, T, hd], k and v [heads, T, hd] -> [T, heads * hd]."""
    t = q.shape[1]
    scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(t, -1)


def gpt2_logits(c, w, tokens):
    """GPT2LMHeadModel: Conv1D weights are [in, out]; the head is the token table."""
    d, heads, eps = c["n_embd"], c["n_head"], c["layer_norm_epsilon"]
    t = len(tokens)
    h = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][:t]
    for i in range(c["n_layer"]):
        p = f"transformer.h.{i}."
        x = layer_norm(h, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = x @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (part.reshape(t, heads, -1).transpose(0, 1) for part in qkv.split(d, dim=-1))
        h = h + causal_attention(q, k, v) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        x = layer_norm(h, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        x = x @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        x = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        h = h + x @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    h = layer_norm(h, w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return h @ w["transformer.wte.weight"].T


def rope_frequencies(c, hd):
    """inv_freq of transformers' rope_init_functions: default, linear and llama3."""
    inverse = 1.0 / c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2) / hd)
    scaling = c.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return inverse / scaling["factor"]
    if kind == "llama3":
        factor, low, high = (scaling[k] for k in ("factor", "low_freq_factor", "high_freq_factor"))
        old = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inverse
        scaled = torch.where(wavelength > old / low, inverse / factor, inverse)
        smooth = (old / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelength < old / high) & ~(wavelength > old / low)
        return torch.where(medium, smoothed, scaled)
    assert kind == "default", kind
    return inverse


def rope(x, inverse):
    """Rotary embedding of [heads, T, hd] by Hugging Face's rotate_half."""
    hd = x.shape[-1]
    angles = torch.outer(torch.arange(x.shape[-2]), inverse)
    angles = torch.cat((angles, angles), dim=-1)
    rotated = torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), dim=-1)
    return x * angles.cos() + rotated * angles.sin()


def linear(x, w, name):
    """torch.nn.Linear of the tensors `name`.weight ([out, in]) and `name`.bias when it exists."""
    y = x @ w[name + ".weight"].T
    return y + w[name + ".bias"] if name + ".bias" in w else y


def llama_logits(c, w, tokens):
    """LlamaForCausalLM, Qwen2ForCausalLM (biases on q, k, v) and Qwen3ForCausalLM (RMSNorm of
    each query and key head first); heads as wide as q_proj says; biases wherever the folder has
    them (attention_bias, mlp_bias); RoPE rescaled as rope_scaling says."""
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    eps = c["rms_norm_eps"]
    qwen3 = c["architectures"] == ["Qwen3ForCausalLM"]
    t = len(tokens)
    h = w["model.embed_tokens.weight"][tokens]
    inverse = rope_frequencies(c, w["model.layers.0.self_attn.q_proj.weight"].shape[0] // heads)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = linear(x, w, p + "self_attn.q_proj").reshape(t, heads, -1).transpose(0, 1)
        k = linear(x, w, p + "self_attn.k_proj").reshape(t, kv, -1).transpose(0, 1)
        v = linear(x, w, p + "self_attn.v_proj").reshape(t, kv, -1).transpose(0, 1)
        if qwen3:
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, inverse), rope(k, inverse)
        k, v = k.repeat_interleave(heads // kv, dim=0), v.repeat_interleave(heads // kv, dim=0)
        h = h + linear(causal_attention(q, k, v), w, p + "self_attn.o_proj")
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        gate = linear(x, w, p + "mlp.gate_proj")
        up = linear(x, w, p + "mlp.up_proj")
        h = h + linear(torch.nn.functional.silu(gate) * up, w, p + "mlp.down_proj")
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return rms_norm(h, w["model.norm.weight"], eps) @ head.T


def log_probabilities(directory, tokens):
    config, weights = read_folder(directory)
    forward = gpt2_logits if config["architectures"] == ["GPT2LMHeadModel"] else llama_logits
    return torch.log_softmax(forward(config, weights, tokens), dim=-1)


def generate(cli, checkpoint, prompt, tokens, temperature):
    return json.loads(cli("generate", "--checkpoint", checkpoint, "--prompt", prompt, "--json",
                          "--mode", "exact", "--max-new-tokens", tokens, "--temperature",
                          temperature, "--seed", 5))


def encode(cli, tokenizer, text):
    done = subprocess.run([cli.binary, "tokenizer", "encode", "--tokenizer", tokenizer, "--json"],
                          input=text.encode(), capture_output=True, check=True)
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def tokenizer(cli, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")
    cli("tokenizer", "train", "--vocab", 384, "--out", path)
    return path


MODELS = [
    ("gpt:layers=2,heads=2,dim=32,context=48,tie=1", []),
    ("llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,context=48", ["--dtype", "f32",
                                                                    "--shard-size", "20KB"]),
    ("llama:layers=2,heads=4,kv_heads=1,dim=32,ffn=64,context=48,qk_norm=1,tie=1,"
     "rope_theta=500000", []),
    # Published shapes: Qwen2's biases with an MLP of 2 blocks; Llama 3.2's rescaled RoPE with
    # heads wider than dim / heads; a Llama's attention_bias and mlp_bias with linear scaling.
    ("llama:layers=2,heads=6,kv_heads=2,dim=48,ffn=44,context=48,qkv_bias=1", []),
    ("llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,context=48,head_dim=16,tie=1,"
     "rope_theta=500000,rope_scaling=llama3:4:1:4:512", []),
    ("llama:layers=2,heads=4,kv_heads=4,dim=32,ffn=48,context=48,qkv_bias=1,out_bias=1,"
     "mlp_bias=1,rope_scaling=linear:2", []),
]


@pytest.mark.parametrize("model,options", MODELS)
def test_an_exported_folder_scores_what_generate_made(cli, tokenizer, tmp_path, model, options):
    save, folder = str(tmp_path / "ckpt"), str(tmp_path / "hf")
    cli("train", "--model", model, "--tokenizer", tokenizer, "--steps", 30, "--batch", 8,
        "--lr", 0.01, "--ranks", 2, "--mesh", 2, "--names", "fsdp", "--save", save,
        "--eval-every", 0)
    cli("checkpoint", "export", "--format", "hf", save, folder, *options)
    if "--shard-size" in options:
        assert os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
    prompt = "Time is"
    made = generate(cli, save, prompt, 30, 1.0)
    assert generate(cli, "hf:" + folder, prompt, 30, 1.0) == made  # the same bits from the folder
    tokens = encode(cli, tokenizer, prompt) + made["tokens"]
    reference = log_probabilities(folder, tokens[:-1])
    first = len(tokens) - len(made["tokens"]) - 1
    expected = [reference[first + i, token].item() for i, token in enumerate(made["tokens"])]
    got = np.array(made["logprobs"])
    assert np.std(got) > 0.3, "the trained model's log-probabilities should vary"
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=0)
    again = str(tmp_path / "again")
    cli("checkpoint", "export", "--format", "hf", "hf:" + folder, again, *options)
    for file in os.listdir(folder):
        assert open(os.path.join(folder, file), "rb").read() == \
            open(os.path.join(again, file), "rb").read(), file


def bf16(values):
    """float64 values rounded to bfloat16 (to nearest even), as uint16 bits."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, dtype):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, values in sorted(tensors.items()):
        raw = bf16(values) if dtype == "BF16" else values.astype(DTYPES[dtype][0])
        blob = raw.tobytes()
        header[name] = {"dtype": dtype, "shape": list(values.shape),
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def outside_llama(vocab, rng):
    """A Qwen3-style config and random weights, as another tool would write them."""
    d, heads, kv, ffn, layers = 32, 4, 2, 48, 2
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab,
              "hidden_size": d, "intermediate_size": ffn, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d // heads,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
              "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
              "torch_dtype": "bfloat16"}
    w = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, d)),
         "model.norm.weight": 1 + rng.normal(0, 0.1, d), "lm_head.weight": rng.normal(0, 0.3, (vocab, d))}
    hd = d // heads
    for i in range(layers):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + rng.normal(0, 0.1, d),
                  p + "post_attention_layernorm.weight": 1 + rng.normal(0, 0.1, d),
                  p + "self_attn.q_proj.weight": rng.normal(0, 0.3, (heads * hd, d)),
                  p + "self_attn.k_proj.weight": rng.normal(0, 0.3, (kv * hd, d)),
                  p + "self_attn.v_proj.weight": rng.normal(0, 0.3, (kv * hd, d)),
                  p + "self_attn.o_proj.weight": rng.normal(0, 0.3, (d, heads * hd)),
                  p + "self_attn.q_norm.weight": 1 + rng.normal(0, 0.1, hd),
                  p + "self_attn.k_norm.weight": 1 + rng.normal(0, 0.1, hd),
                  p + "mlp.gate_proj.weight": rng.normal(0, 0.3, (ffn, d)),
                  p + "mlp.up_proj.weight": rng.normal(0, 0.3, (ffn, d)),
                  p + "mlp.down_proj.weight": rng.normal(0, 0.3, (d, ffn))})
    return config, w


def outside_gpt2(vocab, rng):
    d, heads, layers = 32, 4, 2
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
              "n_embd": d, "n_head": heads, "n_layer": layers, "n_positions": 64,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    w = {"transformer.wte.weight": rng.normal(0, 0.5, (vocab, d)),
         "transformer.wpe.weight": rng.normal(0, 0.3, (64, d)),
         "transformer.ln_f.weight": 1 + rng.normal(0, 0.1, d),
         "transformer.ln_f.bias": rng.normal(0, 0.1, d)}
    for i in range(layers):
        p = f"transformer.h.{i}."
        for name, shape in (("ln_1.weight", d), ("ln_1.bias", d), ("ln_2.weight", d),
                            ("ln_2.bias", d), ("attn.c_attn.weight", (d, 3 * d)),
                            ("attn.c_attn.bias", 3 * d), ("attn.c_proj.weight", (d, d)),
                            ("attn.c_proj.bias", d), ("mlp.c_fc.weight", (d, 4 * d)),
                            ("mlp.c_fc.bias", 4 * d), ("mlp.c_proj.weight", (4 * d, d)),
                            ("mlp.c_proj.bias", d)):
            w[p + name] = (1 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight")
                           else 0) + rng.normal(0, 0.3, shape)
    return config, w


def outside_family(vocab, rng, architecture, d=32, heads=4, kv=2, hd=None, ffn=48, layers=2,
                   qkv_bias=False, o_bias=False, mlp_bias=False, tie=False, pad=0, **keys):
    """A Llama-family config of `architecture` and random weights of its published layout, as
    another tool would write them; `pad` rows past the tokenizer (Qwen's padded embedding)."""
    hd = hd or d // heads
    vocab += pad
    config = {"architectures": [architecture], "vocab_size": vocab, "hidden_size": d,
              "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv, "head_dim": hd, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "hidden_act": "silu",
              "tie_word_embeddings": tie, "torch_dtype": "bfloat16", **keys}
    if mlp_bias:
        config["mlp_bias"] = True
    w = {"model.embed_tokens.weight": rng.normal(0, 1, (vocab, d)),
         "model.norm.weight": 1 + rng.normal(0, 0.1, d)}
    if not tie:
        w["lm_head.weight"] = rng.normal(0, 0.3, (vocab, d))
    for i in range(layers):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + rng.normal(0, 0.1, d),
                  p + "post_attention_layernorm.weight": 1 + rng.normal(0, 0.1, d),
                  p + "self_attn.q_proj.weight": rng.normal(0, 0.3, (heads * hd, d)),
                  p + "self_attn.k_proj.weight": rng.normal(0, 0.3, (kv * hd, d)),
                  p + "self_attn.v_proj.weight": rng.normal(0, 0.3, (kv * hd, d)),
                  p + "self_attn.o_proj.weight": rng.normal(0, 0.3, (d, heads * hd)),
                  p + "mlp.gate_proj.weight": rng.normal(0, 0.3, (ffn, d)),
                  p + "mlp.up_proj.weight": rng.normal(0, 0.3, (ffn, d)),
                  p + "mlp.down_proj.weight": rng.normal(0, 0.3, (d, ffn))})
        if architecture == "Qwen3ForCausalLM":
            w[p + "self_attn.q_norm.weight"] = 1 + rng.normal(0, 0.1, hd)
            w[p + "self_attn.k_norm.weight"] = 1 + rng.normal(0, 0.1, hd)
        biases = {"q_proj": heads * hd, "k_proj": kv * hd, "v_proj": kv * hd} if qkv_bias else {}
        biases.update({"o_proj": d} if o_bias else {})
        for name, size in biases.items():
            w[p + f"self_attn.{name}.bias"] = rng.normal(0, 0.3, size)
        if mlp_bias:
            w.update({p + "mlp.gate_proj.bias": rng.normal(0, 0.3, ffn),
                      p + "mlp.up_proj.bias": rng.normal(0, 0.3, ffn),
                      p + "mlp.down_proj.bias": rng.normal(0, 0.3, d)})
    return config, w


def published(architecture, **shape):
    return lambda vocab, rng: outside_family(vocab, rng, architecture, **shape)


OUTSIDE = [
    (outside_llama, "BF16"),
    (outside_gpt2, "F16"),
    # Qwen3-0.6B's shape: heads of 128 over a width of 1024 (here 16 over 32), tied.
    (published("Qwen3ForCausalLM", hd=16, tie=True, attention_bias=False), "BF16"),
    # Qwen2.5-0.5B's: biases on q, k, v, 14 heads of 2 groups, an MLP of gcd(4864, 14) = 2
    # blocks, the embedding padded past the tokenizer.
    (published("Qwen2ForCausalLM", d=56, heads=14, kv=2, ffn=44, qkv_bias=True, tie=True, pad=24,
               use_sliding_window=False, sliding_window=32768, max_window_layers=21), "BF16"),
    # Llama 3.2's: llama3-rescaled RoPE whose three frequency bands all occur, tied.
    (published("LlamaForCausalLM", d=64, heads=4, kv=2, ffn=96, tie=True, rope_theta=500000.0,
               rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 64, "rope_type": "llama3"}),
     "BF16"),
    # SmolLM2-135M's: 9 heads of 3 groups, tied; TinyLlama's with a Llama's biases and
    # linear scaling.
    (published("LlamaForCausalLM", d=36, heads=9, kv=3, ffn=48, tie=True), "F32"),
    (published("LlamaForCausalLM", kv=4, qkv_bias=True, o_bias=True, mlp_bias=True,
               attention_bias=True, rope_scaling={"rope_type": "linear", "factor": 2.0}),
     "F32"),
]


@pytest.mark.parametrize("make,dtype", OUTSIDE)
def test_an_outside_folder_generates_the_references_greedy_tokens(cli, tokenizer, tmp_path,
                                                                 make, dtype):
    vocab = json.load(open(tokenizer))
    size = len(vocab["model"]["vocab"]) + len(vocab["added_tokens"])
    config, weights = make(size, np.random.default_rng(3))
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(tokenizer, folder / "tokenizer.json")
    write_safetensors(str(folder / "model.safetensors"), weights, dtype)
    prompt = "A fortune"
    new = 40
    made = generate(cli, "hf:" + str(folder), prompt, new, 0)
    tokens = encode(cli, tokenizer, prompt)
    first = len(tokens)
    logprobs = log_probabilities(str(folder), tokens + made["tokens"][:-1])
    for _ in range(new):  # the reference's own greedy decode
        tokens.append(int(log_probabilities(str(folder), tokens)[-1].argmax()))
    assert made["tokens"] == tokens[-new:]
    expected = [logprobs[first - 1 + i, t].item() for i, t in enumerate(made["tokens"])]
    np.testing.assert_allclose(made["logprobs"], expected, rtol=1e-4, atol=0)


def test_broken_folders_are_refused_by_name(cli, tokenizer, tmp_path):
    save, folder = str(tmp_path / "ckpt"), tmp_path / "hf"
    cli("train", "--model", "llama:layers=1,heads=2,kv_heads=1,dim=16,ffn=32,context=16",
        "--tokenizer", tokenizer, "--steps", 1, "--ranks", 1, "--save", save)
    cli("checkpoint", "export", "--format", "hf", save, str(folder))

    def refused(pattern):
        done = subprocess.run([cli.binary, "generate", "--checkpoint", f"hf:{folder}", "--prompt",
                               "a"], capture_output=True, text=True)
        assert done.returncode == 2 and pattern in done.stderr, done.stderr

    config = json.loads((folder / "config.json").read_text())
    weights = read_safetensors(str(folder / "model.safetensors"))
    write = {name: values.numpy() for name, values in weights.items()}
    missing = dict(write)
    del missing["model.layers.0.mlp.up_proj.weight"]
    write_safetensors(str(folder / "model.safetensors"), missing, "F32")
    refused("tensor 'model.layers.0.mlp.up_proj.weight' is missing")
    wrong = dict(write)
    wrong["model.layers.0.self_attn.k_proj.weight"] = np.zeros((16, 16))
    write_safetensors(str(folder / "model.safetensors"), wrong, "F32")
    refused("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 16], the config "
            "needs [8, 16]")
    write_safetensors(str(folder / "model.safetensors"), write, "F32")
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["MambaForCausalLM"]}))
    refused("architecture 'MambaForCausalLM' is not one of GPT2LMHeadModel")
    (folder / "config.json").write_text(json.dumps({**config, "rope_scaling": {"type": "yarn", "factor": 4.0}}))
    refused('"rope_scaling" has rope_type \'yarn\'')
    (folder / "config.json").write_text(json.dumps(config))
    blob = bytearray((folder / "model.safetensors").read_bytes())
    size = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + size])
    name = "model.norm.weight"
    header[name]["data_offsets"][1] += 4  # lies about where its bytes end
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text +
                                               bytes(blob[8 + size:]))
    refused("is not a valid safetensors file")


def test_python_trains_on_bpe_tokens_and_from_a_folder(cli, tokenizer, tmp_path):
    import meshtensor as mt

    model = "gpt:layers=1,heads=2,dim=16,context=16,tie=1"
    save, folder = str(tmp_path / "ckpt"), str(tmp_path / "hf")
    text = mt.load_text(FORTUNES)
    ours = mt.run_threads(1, lambda world: mt.train(text, model=model, tokenizer=tokenizer,
                                                    steps=3, mode="exact", save=save))[0]
    line = cli("train", "--model", model, "--tokenizer", tokenizer, "--steps", 3, "--mode",
               "exact", "--ranks", 1, "--json").strip().splitlines()[-1]
    assert ours["digest"] == json.loads(line)["digest"]
    assert ours["validation_bits_per_byte"] == json.loads(line)["validation_bits_per_byte"]
    cli("checkpoint", "export", "--format", "hf", save, folder)
    tp = mt.run_threads(2, lambda world: mt.train(text, init="hf:" + folder, steps=3, mode="exact",
                                                  mesh=(2,), names=("tp",)))[0]
    line = cli("train", "--init", "hf:" + folder, "--steps", 3, "--mode", "exact", "--ranks", 1,
               "--json").strip().splitlines()[-1]
    assert tp["digest"] == json.loads(line)["digest"]
    with pytest.raises(mt.InvalidArgument, match="brings its own model and tokenizer"):
        mt.run_threads(1, lambda world: mt.train(text, init=save, model=model, steps=1))
