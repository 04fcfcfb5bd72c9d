#!/usr/bin/env bash
# Hugging Face folders that differ from meshtensor's own exports, as published folders do.
# Usage: hf_folders.sh <meshtensor> <case>
#   variants  folders that must load as the same model: RoPE spelled as transformers 5 spells it
#             (rope_parameters, no rope_theta), a GPT2Model-style save without the
#             "transformer." prefix or as GPT2Model, keys a class treats as inert, F64 weights;
#             each generates the export's own tokens
#   refused   folders that would load as the wrong model, each refused by name with exit 2:
#             disagreeing RoPE spellings, a rope_type it does not compute or without its
#             factors, scale_attn_weights false, a Qwen3 without head_dim (its class's 128,
#             which its tensors do not have), a Qwen3 sliding window shorter than the
#             context, model_type naming another model, NaN and infinite weights (f32 and
#             bf16; checkpoint verify reports them too), a tensor under both names, a
#             truncated shard, and a folder too large for the memory (before it is read)
#   paths     a folder that is a loop of links, exports onto a dangling link and under /proc exit
#             2; an export onto a link to an empty folder fills that folder and keeps the link
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
case_name=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$bin" tokenizer train --vocab 300 --out "$dir/tok.json" >/dev/null
# A tied GPT and a Qwen3 (Llama with QK-norm) trained a few steps, exported in f32.
"$bin" train --tokenizer "$dir/tok.json" --model gpt:layers=2,heads=2,dim=32,context=32,tie=1 \
  --steps 2 --batch 4 --ranks 1 --save "$dir/gpt-ck" >/dev/null
"$bin" checkpoint export --format hf "$dir/gpt-ck" "$dir/gpt" >/dev/null
"$bin" train --tokenizer "$dir/tok.json" \
  --model llama:layers=2,heads=4,kv_heads=2,dim=32,ffn=64,context=32,qk_norm=1,rope_theta=500000 \
  --steps 2 --batch 4 --ranks 1 --save "$dir/qwen-ck" >/dev/null
"$bin" checkpoint export --format hf "$dir/qwen-ck" "$dir/qwen" >/dev/null

tokens() { "$bin" generate --checkpoint "hf:$1" --prompt "the cat" --max-new-tokens 12 --json |
  /usr/bin/python3 -c 'import json, sys; print(json.loads(sys.stdin.readlines()[-1])["tokens"])'; }

# edit <folder> <python statements on `config` (dict) and `weights` (name -> numpy array)> [dtype]
edit() {
  /usr/bin/python3 - "$1" "$2" "${3:-F32}" <<'PY'
import json, pathlib, struct, sys
import numpy as np
folder, code, dtype = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
blob = (folder / "model.safetensors").read_bytes()
size = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + size])
weights = {}
for name, entry in header.items():
    if name == "__metadata__":
        continue
    begin, end = entry["data_offsets"]
    weights[name] = np.frombuffer(blob[8 + size + begin:8 + size + end], np.float32).reshape(entry["shape"]).copy()
config = json.loads((folder / "config.json").read_text())
exec(code)
(folder / "config.json").write_text(json.dumps(config))
out, data, at = {}, [], 0
for name in sorted(weights):
    values = weights[name].astype(np.float32)
    raw = (values.tobytes() if dtype == "F32" else values.astype(np.float64).tobytes()
           if dtype == "F64" else (values.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    out[name] = {"dtype": dtype, "shape": list(values.shape), "data_offsets": [at, at + len(raw)]}
    data.append(raw)
    at += len(raw)
head = json.dumps(out).encode()
(folder / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"".join(data))
PY
}
variant() { rm -rf "$dir/v" && cp -r "$dir/$1" "$dir/v" && edit "$dir/v" "$2" "${3:-F32}"; }

case $case_name in
variants)
  qwen=$(tokens "$dir/qwen")
  variant qwen 'config["rope_parameters"] = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}; config.pop("rope_scaling")'
  same "$qwen" "$(tokens "$dir/v")" "RoPE as transformers 5 spells it (rope_parameters)"
  variant qwen 'config["rope_parameters"] = {"rope_type": "default", "rope_theta": 500000.0}; config["pretraining_tp"] = 2; config["attention_dropout"] = 0.1'
  same "$qwen" "$(tokens "$dir/v")" "both RoPE spellings agreeing, inert keys"
  gpt=$(tokens "$dir/gpt")
  variant gpt 'weights = {name.removeprefix("transformer."): v for name, v in weights.items()}'
  same "$gpt" "$(tokens "$dir/v")" "a GPT2Model-style save (no transformer. prefix)"
  variant gpt 'weights = {name.removeprefix("transformer."): v for name, v in weights.items()}; config["architectures"] = ["GPT2Model"]'
  same "$gpt" "$(tokens "$dir/v")" "a GPT2Model folder (its head the token table)"
  variant gpt 'config["reorder_and_upcast_attn"] = True; config["summary_type"] = "cls_index"; config["resid_pdrop"] = 0.1'
  same "$gpt" "$(tokens "$dir/v")" "GPT-2's inert keys"
  variant qwen 'config["torch_dtype"] = "float64"' F64
  same "$qwen" "$(tokens "$dir/v")" "weights stored as F64"
  ;;
refused)
  refused() {  # refused <pattern> <folder>
    expect 2 "$1" "$bin" generate --checkpoint "hf:$2" --prompt a
  }
  variant qwen 'config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}'
  refused 'gives RoPE theta 10000 but rope_theta gives 500000' "$dir/v"
  variant qwen 'config["rope_parameters"] = {"rope_type": "yarn", "factor": 8.0, "rope_theta": 500000.0}'
  refused "has rope_type 'yarn'" "$dir/v"
  variant qwen 'config["rope_parameters"] = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}'
  refused "has no low_freq_factor" "$dir/v"
  # Without head_dim a Qwen3's heads are its class's 128 wide: the tensors do not fit.
  variant qwen 'config.pop("head_dim")'
  refused "tensor 'model.layers.0.self_attn.q_proj.weight' has shape \[32, 32\], the config needs \[512, 32\]" "$dir/v"
  variant qwen 'config.update(use_sliding_window=True, sliding_window=16, max_window_layers=1)'
  refused 'sliding window of 16 positions, shorter than the context of 32' "$dir/v"
  variant qwen 'config["model_type"] = "gpt2"'
  refused '"model_type" is "gpt2" but the architecture Qwen3ForCausalLM' "$dir/v"
  variant gpt 'config["scale_attn_weights"] = False'
  refused '"scale_attn_weights" is false' "$dir/v"
  variant gpt 'weights["transformer.h.1.mlp.c_fc.weight"][3, 5] = float("nan")'
  refused "tensor 'transformer.h.1.mlp.c_fc.weight' holds nan at element 389" "$dir/v"
  variant qwen 'weights["model.norm.weight"][7] = float("inf")' BF16
  refused "tensor 'model.norm.weight' holds inf at element 7" "$dir/v"
  variant gpt 'weights["wpe.weight"] = weights["transformer.wpe.weight"]'
  refused "holds both 'transformer.wpe.weight' and 'wpe.weight'" "$dir/v"
  # A shard shorter than its header says: every command refuses it by name.
  cp -r "$dir/qwen" "$dir/short"
  truncate -s -100 "$dir/short/model.safetensors"
  refused "model.safetensors is not a valid safetensors file: the file is .* bytes, but its header describes .* (truncated)" "$dir/short"
  expect 2 "(truncated)" "$bin" train --init "hf:$dir/short" --steps 1
  # A folder too large for this machine (a 70B-parameter Llama; its shard a sparse file): the
  # memory check refuses it by name before a byte of it is read, for every command.
  mkdir "$dir/big" && cp "$dir/tok.json" "$dir/big/tokenizer.json"
  /usr/bin/python3 - "$dir/big" <<'PY'
import json, pathlib, struct, sys
folder = pathlib.Path(sys.argv[1])
d, f, layers, vocab, heads, kv = 8192, 28672, 80, 300, 64, 8
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d,
          "intermediate_size": f, "num_attention_heads": heads, "num_key_value_heads": kv,
          "num_hidden_layers": layers, "vocab_size": vocab, "rms_norm_eps": 1e-5,
          "rope_theta": 500000.0, "max_position_embeddings": 8192, "tie_word_embeddings": False}
(folder / "config.json").write_text(json.dumps(config))
shapes = {"model.embed_tokens.weight": [vocab, d], "model.norm.weight": [d], "lm_head.weight": [vocab, d]}
for i in range(layers):
    p, q, k = f"model.layers.{i}.", d, kv * d // heads
    shapes.update({p + "self_attn.q_proj.weight": [q, d], p + "self_attn.k_proj.weight": [k, d],
                   p + "self_attn.v_proj.weight": [k, d], p + "self_attn.o_proj.weight": [d, q],
                   p + "mlp.gate_proj.weight": [f, d], p + "mlp.up_proj.weight": [f, d],
                   p + "mlp.down_proj.weight": [d, f], p + "input_layernorm.weight": [d],
                   p + "post_attention_layernorm.weight": [d]})
header, at = {}, 0
for name, shape in shapes.items():
    size = 2
    for n in shape:
        size *= n
    header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [at, at + size]}
    at += size
head = json.dumps(header).encode()
with open(folder / "model.safetensors", "wb") as out:
    out.write(struct.pack("<Q", len(head)) + head)
    out.truncate(8 + len(head) + at)
PY
  too_big="needs about .* of memory, but only .* is available"
  expect 2 "of checkpoint hf:$dir/big (.* parameters) $too_big"     "$bin" generate --checkpoint "hf:$dir/big" --prompt a
  expect 2 "$too_big" "$bin" serve --checkpoint "hf:$dir/big" --port 0
  expect 2 "training model llama layers=80 .* $too_big"     "$bin" train --init "hf:$dir/big" --steps 1
  expect 2 "$too_big" "$bin" rl --init "hf:$dir/big" --steps 1
  # A checkpoint of meshtensor's own with a NaN: verify names the tensor.
  cp -r "$dir/gpt-ck" "$dir/nan-ck"
  /usr/bin/python3 - "$dir/nan-ck" <<'PY'
import json, pathlib, struct, sys
step = sorted(pathlib.Path(sys.argv[1]).glob("step-*"))[-1]
shard = next(step.glob("*.safetensors"))
blob = bytearray(shard.read_bytes())
size = struct.unpack("<Q", blob[:8])[0]
entry = json.loads(blob[8:8 + size])["model.head.norm.weight"]
struct.pack_into("<f", blob, 8 + size + entry["data_offsets"][0] + 4, float("nan"))
shard.write_bytes(bytes(blob))
PY
  expect 1 "tensor 'model.head.norm.weight', block .* holds nan at element 1" \
    "$bin" checkpoint verify "$dir/nan-ck"
  ;;
paths)
  ln -s "$dir/loop1" "$dir/loop2" && ln -s "$dir/loop2" "$dir/loop1"
  expect 2 "loop1: not a Hugging Face model folder (Too many levels of symbolic links)" \
    "$bin" generate --checkpoint "hf:$dir/loop1" --prompt a
  ln -s "$dir/nowhere" "$dir/dangling"
  expect 2 "is a symbolic link that leads to no folder" \
    "$bin" checkpoint export --format hf "$dir/gpt-ck" "$dir/dangling"
  expect 2 "/proc/meshtensor-export" \
    "$bin" checkpoint export --format hf "$dir/gpt-ck" /proc/meshtensor-export
  mkdir "$dir/empty" && ln -s "$dir/empty" "$dir/link"
  "$bin" checkpoint export --format hf "$dir/gpt-ck" "$dir/link" >/dev/null
  [ -L "$dir/link" ] || fail "the export replaced the link with a folder"
  [ -s "$dir/empty/config.json" ] || fail "the export did not fill the folder the link names"
  same "$(tokens "$dir/gpt")" "$(tokens "$dir/link")" "an export through a link to an empty folder"
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
