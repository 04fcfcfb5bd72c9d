"""Writes Hugging Face folders of published models' configs (their config.json as published,
random weights of their shapes, bf16 unless the model publishes f32) for tests and benchmarks
run where no download is possible.
Usage: published_folders.py <out dir> <tokenizer.json> <model>...
  model: qwen3-0.6b, qwen2.5-0.5b, llama-3.2-1b, smollm2-135m, tinyllama-1.1b, gpt2, or any of
  them with ":layers=N" (fewer layers, the same widths) for a quicker run.
The tokenizer is copied in; a vocab_size above its tokens pads the embedding (as Qwen's does),
and a bos or eos id it lacks is written as null."""

import json
import os
import shutil
import struct
import sys

import numpy as np

CONFIGS = {
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936},
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
        "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
        "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
        "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936},
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256},
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
        "initializer_range": 0.041666666666666664, "intermediate_size": 1536,
        "is_llama_config": True, "max_position_embeddings": 8192, "model_type": "llama",
        "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False,
        "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.42.3", "use_cache": True,
        "vocab_size": 49152},
    "tinyllama-1.1b": {
        "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000},
    "gpt2": {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257},
}


def llama_tensors(c):
    """Name -> shape of a Llama-family folder, as transformers saves it."""
    d, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim", d // heads)
    ffn, vocab = c["intermediate_size"], c["vocab_size"]
    qwen2 = c["architectures"] == ["Qwen2ForCausalLM"]
    qwen3 = c["architectures"] == ["Qwen3ForCausalLM"]
    shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (d,),
                       p + "post_attention_layernorm.weight": (d,),
                       p + "self_attn.q_proj.weight": (heads * hd, d),
                       p + "self_attn.k_proj.weight": (kv * hd, d),
                       p + "self_attn.v_proj.weight": (kv * hd, d),
                       p + "self_attn.o_proj.weight": (d, heads * hd),
                       p + "mlp.gate_proj.weight": (ffn, d),
                       p + "mlp.up_proj.weight": (ffn, d),
                       p + "mlp.down_proj.weight": (d, ffn)})
        if qwen2:
            shapes.update({p + "self_attn.q_proj.bias": (heads * hd,),
                           p + "self_attn.k_proj.bias": (kv * hd,),
                           p + "self_attn.v_proj.bias": (kv * hd,)})
        if qwen3:
            shapes.update({p + "self_attn.q_norm.weight": (hd,),
                           p + "self_attn.k_norm.weight": (hd,)})
    return shapes


def gpt2_tensors(c):
    """GPT-2's own model.safetensors: GPT2Model's names (no "transformer."), with the causal
    mask buffers ("h.N.attn.bias") it was saved with."""
    d, vocab, positions = c["n_embd"], c["vocab_size"], c["n_positions"]
    shapes = {"wte.weight": (vocab, d), "wpe.weight": (positions, d), "ln_f.weight": (d,),
              "ln_f.bias": (d,)}
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        shapes.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "ln_2.weight": (d,),
                       p + "ln_2.bias": (d,), p + "attn.c_attn.weight": (d, 3 * d),
                       p + "attn.c_attn.bias": (3 * d,), p + "attn.c_proj.weight": (d, d),
                       p + "attn.c_proj.bias": (d,), p + "mlp.c_fc.weight": (d, 4 * d),
                       p + "mlp.c_fc.bias": (4 * d,), p + "mlp.c_proj.weight": (4 * d, d),
                       p + "mlp.c_proj.bias": (d,), p + "attn.bias": (1, 1, positions, positions)})
    return shapes


def values(name, shape, rng):
    """Norm weights near 1, the mask buffer lower-triangular, the rest N(0, 0.02)."""
    if name.endswith("attn.bias") and len(shape) == 4:
        return np.tril(np.ones(shape[-2:], np.float32)).reshape(shape)
    if "norm" in name or "ln_" in name:
        if name.endswith(".bias"):
            return rng.normal(0, 0.02, shape).astype(np.float32)
        return (1 + rng.normal(0, 0.05, shape)).astype(np.float32)
    return rng.normal(0, 0.02, shape).astype(np.float32)


def write_safetensors(path, shapes, dtype, rng):
    """Writes the tensors one at a time (a 1B model never whole in memory)."""
    header, at = {"__metadata__": {"format": "pt"}}, 0
    size = 2 if dtype == "BF16" else 4
    for name in sorted(shapes):
        count = int(np.prod(shapes[name]))
        header[name] = {"dtype": dtype, "shape": list(shapes[name]),
                        "data_offsets": [at, at + count * size]}
        at += count * size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name in sorted(shapes):
            v = values(name, shapes[name], rng)
            if dtype == "BF16":
                bits = v.view(np.uint32).astype(np.uint64)
                v = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            f.write(v.tobytes())


def main():
    out, tokenizer, models = sys.argv[1], sys.argv[2], sys.argv[3:]
    for spec in models:
        model, _, option = spec.partition(":")
        config = dict(CONFIGS[model])
        if option:
            key, value = option.split("=")
            assert key == "layers", spec
            config["n_layer" if model == "gpt2" else "num_hidden_layers"] = int(value)
        vocabulary = json.load(open(tokenizer))
        size = len(vocabulary["model"]["vocab"]) + len(vocabulary.get("added_tokens", []))
        for key in ("bos_token_id", "eos_token_id"):  # ids the tokenizer given may lack
            if config[key] >= size:
                config[key] = None
        folder = os.path.join(out, spec.replace(":", "-").replace("=", ""))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        shutil.copy(tokenizer, os.path.join(folder, "tokenizer.json"))
        gpt2 = model == "gpt2"
        shapes = gpt2_tensors(config) if gpt2 else llama_tensors(config)
        write_safetensors(os.path.join(folder, "model.safetensors"), shapes,
                          "F32" if gpt2 else "BF16", np.random.default_rng(0))
        print(folder)


if __name__ == "__main__":
    main()
