#!/usr/bin/env bash
# The main job: installs what is missing, builds meshtensor and trains a GPT on Debian's fortunes
# with FSDP over 2 thread ranks (it prints a sample of what it learned to write), then a BPE
# tokenizer and the same GPT on its tokens (bits per byte side by side), exported as a Hugging
# Face folder and generating from it; shows two different layouts ending on the same weights in
# exact mode, then improves the byte GPT with GRPO (on-policy RL) towards English words, every
# generated token checked against the trainer's bits.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default
meshtensor=build/src/meshtensor

run() { echo; echo "\$ $*"; "$@"; }
# FSDP training of the default GPT (4 layers, 4 heads, dim 128, context 128; byte tokens) on
# 2 ranks: 600 steps of 16 windows, AdamW with warmup and a cosine schedule.
rm -rf build/demo-ckpt build/demo-bpe-ckpt build/demo-hf
run $meshtensor train --model gpt --strategy fsdp --ranks 2 --log build/demo-train.csv \
  --plot build/demo-train.png --save build/demo-ckpt | tee build/demo-train.txt
echo "(figures every 50 steps in build/demo-train.csv, the curves in build/demo-train.png)"

# A byte-level BPE tokenizer learned from the fortunes' training records (1,024 tokens: 767
# merges, in well under a second), and the same GPT with GPT-2's tied head trained on its tokens
# for the same 600 steps in about the same time: its samples are made of words, and its
# validation bits per byte (over the same text) beat the byte model's.
run $meshtensor tokenizer train --vocab 1024 --out build/demo-tokenizer.json
run $meshtensor train --model gpt:tie=1 --tokenizer build/demo-tokenizer.json --strategy fsdp \
  --ranks 2 --save build/demo-bpe-ckpt | tee build/demo-bpe.txt
bits() { grep -o '^validation loss .* bits per byte' "$1" | grep -o '[0-9.]* bits per byte'; }
echo
echo "validation: bytes $(bits build/demo-train.txt), BPE $(bits build/demo-bpe.txt)"

# The BPE model as a Hugging Face folder (GPT2LMHeadModel, safetensors, tokenizer.json), and
# generation from that folder.
run $meshtensor checkpoint export --format hf build/demo-bpe-ckpt build/demo-hf
run $meshtensor generate --checkpoint hf:build/demo-hf --prompt "The secret of life is" \
  --max-new-tokens 40 --seed 3

# Exact mode: the same global batches on FSDP over 4 ranks and on HSDP 3x1 with 2 micro-batches
# per rank end on the same bits, which a fixed reduction order alone cannot give.
exact=(train --model gpt:layers=2,heads=4,dim=64,context=64 --mode exact --steps 30 --seed 7)
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

# GRPO from that checkpoint on the words task: 150 steps of 8 prompts x 4 completions, exact mode
# (every token's log-probability is the trainer's bits, or the run stops), about 70 s.
run $meshtensor rl --init build/demo-ckpt --steps 150 --log build/demo-rl.csv --plot build/demo-rl.png
echo "(every step in build/demo-rl.csv, the reward curve in build/demo-rl.png)"
