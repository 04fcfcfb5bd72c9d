#!/usr/bin/env bash
# The main job: installs what is missing, builds meshtensor, learns a BPE tokenizer from Debian's
# fortunes and trains the Llama-family decoder on its tokens with FSDP over 2 thread ranks (it
# prints a sample a person can read), beside the byte-level GPT of the same size for bits per
# byte; exports the Llama as a Hugging Face folder and generates from it; shows two different
# layouts ending on the same weights in exact mode; then improves the Llama with GRPO (on-policy
# RL) towards English words, every generated token checked against the trainer's bits.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default
meshtensor=build/src/meshtensor

run() { echo; echo "\$ $*"; "$@"; }
rm -rf build/demo-ckpt build/demo-bytes-ckpt build/demo-hf

# A byte-level BPE tokenizer learned from the fortunes' training records (1,024 tokens: 767
# merges, in well under a second).
run $meshtensor tokenizer train --vocab 1024 --out build/demo-tokenizer.json

# The headline model: the Llama family (RMSNorm, RoPE, SwiGLU, grouped-query attention; 4
# layers, dim 128, context 128 tokens, the head tied to the token table) on BPE tokens, FSDP on
# 2 ranks: 600 steps of 16 windows, AdamW with warmup and a cosine schedule.
run $meshtensor train --model llama:tie=1 --tokenizer build/demo-tokenizer.json --strategy fsdp \
  --ranks 2 --log build/demo-train.csv --plot build/demo-train.png --save build/demo-ckpt |
  tee build/demo-train.txt
echo "(figures every 50 steps in build/demo-train.csv, the curves in build/demo-train.png)"

# The byte-level GPT of the same size and steps, for comparison: bits per byte over the same
# validation text (its sample, letters rather than words, is left out).
echo
echo "\$ $meshtensor train --model gpt --strategy fsdp --ranks 2 --save build/demo-bytes-ckpt"
$meshtensor train --model gpt --strategy fsdp --ranks 2 --save build/demo-bytes-ckpt \
  >build/demo-bytes.txt
grep "^validation loss" build/demo-bytes.txt
bits() { grep -o '^validation loss .* bits per byte' "$1" | grep -o '[0-9.]* bits per byte'; }
echo
echo "validation: Llama on BPE tokens $(bits build/demo-train.txt), GPT on bytes $(bits build/demo-bytes.txt)"

# The Llama as a Hugging Face folder (LlamaForCausalLM, safetensors, tokenizer.json), and
# generation from that folder.
run $meshtensor checkpoint export --format hf build/demo-ckpt build/demo-hf
run $meshtensor generate --checkpoint hf:build/demo-hf --prompt "The secret of life is" \
  --max-new-tokens 40 --seed 3

# Exact mode: the same global batches on FSDP over 4 ranks and on HSDP 3x1 with 2 micro-batches
# per rank end on the same bits, which a fixed reduction order alone cannot give (30 steps of a
# small Llama: too few to write text, so no sample).
exact=(train --model llama:layers=2,heads=4,kv_heads=2,dim=64,ffn=128,context=64,tie=1
       --tokenizer build/demo-tokenizer.json --mode exact --steps 30 --seed 7 --no-sample)
run $meshtensor "${exact[@]}" --strategy fsdp --ranks 4 | tee build/demo-exact-a.txt
run $meshtensor "${exact[@]}" --mesh 3x1 --micro-batches 2 | tee build/demo-exact-b.txt
digest_a=$(grep -o 'weights digest [0-9a-f]*' build/demo-exact-a.txt)
digest_b=$(grep -o 'weights digest [0-9a-f]*' build/demo-exact-b.txt)
echo
if [ "$digest_a" = "$digest_b" ]; then
  echo "exact mode: FSDP on 4 ranks and HSDP 3x1 with 2 micro-batches end on the same $digest_a"
else
  echo "exact mode: the layouts differ: $digest_a vs $digest_b" >&2
  exit 1
fi

# GRPO from the Llama on the words task: 150 steps of 8 prompts x 4 completions, exact mode
# (every token's log-probability is the trainer's bits, or the run stops).
run $meshtensor rl --init build/demo-ckpt --steps 150 --log build/demo-rl.csv --plot build/demo-rl.png
echo "(every step in build/demo-rl.csv, the reward curve in build/demo-rl.png)"
