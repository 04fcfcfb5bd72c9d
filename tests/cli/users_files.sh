#!/usr/bin/env bash
# The user's files around a run: --save removes only the temporaries a save made and refuses a
# root whose LATEST or index.json is not a save's; --log, --plot and --trace leave the user's file
# as it was when the run fails, are written whole when it succeeds, and may not be an input.
# Usage: users_files.sh <meshtensor binary>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"

train=("$bin" train --model mlp:8 --steps 2)
holds() {  # holds <file> <text>: the file still holds exactly the text
  [ "$(cat "$1")" = "$2" ] || { echo "FAILED: $1 changed: $(head -c 200 "$1")"; exit 1; }
}

# --save: the user's .tmp-* entries, LATEST.tmp and other files survive a save.
mkdir -p ck/.tmp-mine ck/.tmp-step-00000001-1-0000abcd
echo keep > ck/.tmp-notes
echo keep > ck/.tmp-mine/data
echo keep > ck/LATEST.tmp
echo keep > ck/.tmp-step-00000001-1-0000abcd/notes.txt
echo keep > ck/README
"${train[@]}" --save ck >/dev/null
for f in ck/.tmp-notes ck/.tmp-mine/data ck/LATEST.tmp ck/.tmp-step-00000001-1-0000abcd/notes.txt ck/README; do
  holds "$f" keep
done
grep -qx "step-00000002" ck/LATEST || { echo "FAILED: no LATEST"; exit 1; }
echo "ok: a save keeps every entry it did not write"

# The leftover of an interrupted save (our name, only our files) is removed by the next save.
mkdir ck/.tmp-step-00000009-77-deadbeef
echo x > ck/.tmp-step-00000009-77-deadbeef/rank-00000.safetensors
"${train[@]}" --save ck >/dev/null
[ ! -e ck/.tmp-step-00000009-77-deadbeef ] || { echo "FAILED: leftover kept"; exit 1; }
echo "ok: an interrupted save's leftover is removed"

# A LATEST the user wrote, an index.json in the root, a file as the root: refused before training.
mkdir user-latest && echo "my notes" > user-latest/LATEST
expect 2 "user-latest/LATEST is not a pointer a save wrote" "${train[@]}" --save user-latest
holds user-latest/LATEST "my notes"
mkdir user-index && echo "user text" > user-index/index.json
expect 2 "user-index/index.json is in the way" "${train[@]}" --save user-index
holds user-index/index.json "user text"
[ "$(ls user-index)" = index.json ] || { echo "FAILED: user-index was written into"; exit 1; }
echo "a file" > plain
expect 2 "checkpoint root plain exists and is not a directory" "${train[@]}" --save plain

# --log / --plot / --trace: a failed run leaves the file as it was.
for option in --log --plot --trace; do
  echo precious > out.txt
  expect 2 "not-a-model" "$bin" train --model not-a-model $option out.txt
  holds out.txt precious
  expect 2 "missing.*no such file" "$bin" train --model mlp:8 --data missing $option out.txt
  holds out.txt precious
done
ls -a | grep -q '\.out\.txt\.tmp-' && { echo "FAILED: a temporary was left behind"; exit 1; }
echo "ok: failed runs leave --log, --plot and --trace files untouched"

# An output that is an input is refused, naming both.
printf 'one record\n\ntwo records\n' > text.txt
cp text.txt text.bak
expect 2 "--log text.txt is the file of --data text.txt" \
  "$bin" train --model gpt:layers=1,heads=1,dim=8,context=4 --data text.txt --log text.txt
cmp -s text.txt text.bak || { echo "FAILED: the training text changed"; exit 1; }
step=$(ls -d ck/step-* | head -1)
cp "$step/index.json" index.bak
expect 2 "lies inside --resume ck" "${train[@]}" --resume ck --log "$step/index.json"
cmp -s "$step/index.json" index.bak || { echo "FAILED: the checkpoint index changed"; exit 1; }
expect 2 "--trace same.txt is also the file of --log same.txt" \
  "${train[@]}" --log same.txt --trace same.txt
mkdir texts && cp text.txt texts/a.txt
expect 2 "--save texts is the directory of --data texts" \
  "$bin" train --model gpt:layers=1,heads=1,dim=8,context=4 --data texts --save texts
[ ! -e texts/LATEST ] || { echo "FAILED: saved into the data directory"; exit 1; }
echo "ok: outputs that are inputs are refused"

# A successful run writes the whole log, replacing the old one.
echo precious > run.csv
"${train[@]}" --log run.csv >/dev/null
head -1 run.csv | grep -q '^epoch,steps,train_loss' || { echo "FAILED: log not written"; exit 1; }
echo "ok: a successful run replaces the log"

# Data that is not a file: a FIFO and a device are refused by name, not read.
mkfifo fifo
expect 2 "fifo: not a text file or a directory of them (it is a FIFO)" \
  "$bin" train --model gpt:layers=1,heads=1,dim=8,context=4 --data fifo --steps 1
expect 2 "/dev/zero: not a text file or a directory of them (it is a character device)" \
  "$bin" train --model gpt:layers=1,heads=1,dim=8,context=4 --data /dev/zero --steps 1
