#!/usr/bin/env bash
# Damaged and hostile checkpoints: every case ends in a clear error (inspect and verify exit 1
# naming the problem, train --resume exits 2), never a crash, a hang or a silent OK; a prune
# removes only checkpoints a save wrote.
# Usage: damaged_checkpoints.sh <meshtensor binary> <python3>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$1
python=${2:-python3}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

run=(train --model mlp:16 --batch 500 --steps 2 --strategy fsdp --ranks 2)
"$bin" "${run[@]}" --save "$dir/good" >/dev/null
good=$dir/good/step-00000002
fresh() {  # fresh <name>: a copy of the good checkpoint to damage
  rm -rf "${dir:?}/$1"
  cp -r "$good" "$dir/$1"
  echo "$dir/$1"
}
edit_index() {  # edit_index <checkpoint> <python statement on d>
  "$python" - "$1/index.json" "$2" <<'PY'
import json, sys
path, statement = sys.argv[1], sys.argv[2]
d = json.load(open(path))
exec(statement)
open(path, "w").write(json.dumps(d))
PY
}
# all_fail <status> <checkpoint> <pattern>: inspect and verify exit <status> (2: the index is
# unreadable, 1: the files disagree with it), a resume exits 2; each names the problem.
all_fail() {
  expect "$1" "$3" "$bin" checkpoint inspect "$2"
  expect "$1" "$3" "$bin" checkpoint verify "$2"
  expect 2 "$3" "$bin" "${run[@]}" --resume "$2"
}

# 1. JSON nested far deeper than any checkpoint's, in the index and in a safetensors header.
deep=$(fresh deep_offset)
"$python" - "$deep/index.json" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
text = text.replace('"offset": []', '"offset": ' + "[" * 100000 + "]" * 100000, 1)
open(path, "w").write(text)
PY
all_fail 2 "$deep" "index.json: its JSON nests deeper than 64 levels"
deep=$(fresh deep_version)
"$python" - "$deep/index.json" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read().replace('"version": 2', '"version": ' + "[" * 80000 + "1" + "]" * 80000)
open(path, "w").write(text)
PY
all_fail 2 "$deep" "index.json: its JSON nests deeper than 64 levels"
deep=$(fresh wide_version)
edit_index "$deep" 'd["version"] = [[i] * 50 for i in range(20000)]'
all_fail 2 "$deep" "'version' is a list of 20000 item(s), not an integer"
deep=$(fresh deep_header)
"$python" - "$deep/rank-00000.safetensors" <<'PY'
import struct, sys
path = sys.argv[1]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = data[8:8 + n].decode()
start = header.index('"shape":') + len('"shape":')
end = header.index("]", start) + 1
header = header[:start] + "[" * 70000 + "]" * 70000 + header[end:]
header += " " * ((8 - len(header) % 8) % 8)
open(path, "wb").write(struct.pack("<Q", len(header)) + header.encode() + data[8 + n:])
PY
size=$(stat -c %s "$deep/rank-00000.safetensors")
edit_index "$deep" "d['files']['rank-00000.safetensors']['bytes'] = $size"
expect 1 "rank-00000.safetensors.*nests deeper than 64 levels" "$bin" checkpoint inspect "$deep"
expect 1 "rank-00000.safetensors.*nests deeper than 64 levels" "$bin" checkpoint verify "$deep"
expect 2 "rank-00000.safetensors.*nests deeper than 64 levels" "$bin" "${run[@]}" --resume "$deep"

# 2. An index that lost or renamed a tensor the files still hold.
gone=$(fresh removed)
edit_index "$gone" 'del d["tensors"]["model.0.bias"]'
expect 1 "holds tensor 'model.0.bias' .*which no block of the index references" \
  "$bin" checkpoint verify "$gone"
expect 1 "holds tensor 'model.0.bias'" "$bin" checkpoint inspect "$gone"
renamed=$(fresh renamed)
edit_index "$renamed" 'd["tensors"]["model.0.bias2"] = d["tensors"].pop("model.0.bias")'
expect 1 "the index for tensor 'model.0.bias2'.*has no such entry" "$bin" checkpoint verify "$renamed"
expect 1 "holds tensor 'model.0.bias' .*which no block" "$bin" checkpoint verify "$renamed"
expect 1 "has no such entry" "$bin" checkpoint inspect "$renamed"
twice=$(fresh referenced_twice)
edit_index "$twice" 'd["tensors"]["extra"] = d["tensors"]["model.0.bias"]'
expect 1 "has no such entry" "$bin" checkpoint verify "$twice"

# 3. A header length or block range past the end of the file.
long=$(fresh header_length)
"$python" - "$long/rank-00001.safetensors" <<'PY'
import struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[:8] = struct.pack("<Q", len(data) + 1000)
open(path, "wb").write(data)
PY
all_fail 1 "$long" "rank-00001.safetensors.*header length .* does not fit"
past=$(fresh block_range)
edit_index "$past" 'b = d["tensors"]["model.0.weight"]["blocks"][0]; b["data_offsets"] = [10**9, 10**9 + b["data_offsets"][1] - b["data_offsets"][0]]'
all_fail 1 "$past" "does not match the index for tensor 'model.0.weight'"

# 4. An index of very many blocks is checked in n log n (the test's timeout would stop a
#    quadratic check), and a grid with an overlap is named.
many=$dir/many/step-00000000
mkdir -p "$many"
"$python" - "$many" 200000 <<'PY'
import json, struct, sys
root, n = sys.argv[1], int(sys.argv[2])
header = {"t": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}
text = json.dumps(header)
text += " " * ((8 - len(text) % 8) % 8)
open(root + "/rank-00000.safetensors", "wb").write(struct.pack("<Q", len(text)) + text.encode() + bytes(n))
blocks = [{"file": "rank-00000.safetensors", "offset": [i], "shape": [1], "data_offsets": [i, i + 1],
           "checksum": "0000000000000000"} for i in range(n)]
index = {"format": "meshtensor.checkpoint", "version": 1, "step": 0, "world_size": 1, "metadata": {},
         "files": {"rank-00000.safetensors": {"bytes": 8 + len(text) + n}},
         "tensors": {"t": {"dtype": "U8", "shape": [n], "blocks": blocks}}}
open(root + "/index.json", "w").write(json.dumps(index))
PY
expect 1 "holds tensor 't' .*which 200000 blocks of the index references" "$bin" checkpoint verify "$many"
edit_index "$many" 'd["tensors"]["t"]["blocks"][7]["offset"] = [8]; d["tensors"]["t"]["blocks"][7]["data_offsets"] = [8, 9]'
expect 2 "blocks 1 at \[8\] (rank-00000.safetensors) and 1 at \[8\] (rank-00000.safetensors) overlap" \
  "$bin" checkpoint inspect "$many"

# 5. --keep-checkpoints removes only what a save wrote, never a user's directories.
root=$dir/prune
mkdir -p "$root"
cp -r "$good" "$root/step-best"
cp -r "$good" "$root/step-00000001-copy"
cp -r "$good" "$root/step-1"
mkdir -p "$root/step-00000000" "$root/notes"
echo keep >"$root/notes/x"
"$bin" "${run[@]}" --save "$root" --save-every 1 --keep-checkpoints 1 >/dev/null
for kept in step-best step-00000001-copy step-1 step-00000000 notes/x step-00000002; do
  [ -e "$root/$kept" ] || { echo "FAILED: --keep-checkpoints removed $kept"; exit 1; }
done
[ ! -e "$root/step-00000001" ] || { echo "FAILED: step-00000001 was not pruned"; exit 1; }
echo "ok: prune kept every directory it did not write"
