#!/usr/bin/env bash
# Hostile files and paths given to `meshtensor train`: a gzip bomb behind a valid IDX header is
# refused after the bytes the header declares (memory stays small), directories given as data
# files are clean errors, and a --plot path with quotes and newlines is written as a file of that
# name without any of it reaching gnuplot as a command.
# Usage: hostile_files.sh <meshtensor binary>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/helpers.sh"
bin=$(realpath "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# A data set of 100 images whose image file goes on with 512 MiB of zeros (a 500 KiB download),
# and the same data set without them, whose run's peak memory is the baseline: a sanitizer build's
# process is several times larger than a plain one's.
data=$dir/data
plain=$dir/plain
mkdir -p "$data" "$plain"
python3 - "$data" "$plain" <<'PY'
import gzip, struct, sys
root, plain = sys.argv[1], sys.argv[2]
def write(name, header, body, extra=0):
    with gzip.open(f"{plain}/{name}.gz", "wb", compresslevel=1) as f:
        f.write(header + body)
    with gzip.open(f"{root}/{name}.gz", "wb", compresslevel=1) as f:
        f.write(header + body)
        zeros = bytes(1 << 20)
        for _ in range(extra):
            f.write(zeros)
images = struct.pack(">IIII", 0x803, 100, 28, 28)
labels = struct.pack(">II", 0x801, 100)
write("train-images-idx3-ubyte", images, bytes(100 * 784), extra=512)
write("train-labels-idx1-ubyte", labels, bytes(100))
write("t10k-images-idx3-ubyte", images, bytes(100 * 784))
write("t10k-labels-idx1-ubyte", labels, bytes(100))
PY
rss=$dir/rss
set +e
/usr/bin/time -f %M -o "$rss" "$bin" train --data "$data" --steps 1 --model mlp:8 >"$dir/out" 2>&1
status=$?
set -e
grep -q "more than 1048576 bytes after the 78400 the dims describe" "$dir/out" && [ "$status" = 2 ] ||
  { echo "FAILED: gzip bomb: exit $status"; cat "$dir/out"; exit 1; }
/usr/bin/time -f %M -o "$dir/plain_rss" "$bin" train --data "$plain" --steps 1 --model mlp:8 \
  >"$dir/plain_out" 2>&1 || { echo "FAILED: the data set without the bomb"; cat "$dir/plain_out"; exit 1; }
bomb_kib=$(tail -1 "$rss")
plain_kib=$(tail -1 "$dir/plain_rss")
# The bomb's 512 MiB must not be held: at most 128 MiB above the run on the plain data set.
[ "$bomb_kib" -lt $((plain_kib + 131072)) ] ||
  { echo "FAILED: gzip bomb grew to $bomb_kib KiB (the plain data set: $plain_kib KiB)"; exit 1; }
echo "ok: gzip bomb refused at $bomb_kib KiB (the plain data set: $plain_kib KiB)"

# A directory where a data file should be.
cp -r "$data" "$dir/dirdata"
rm "$dir/dirdata/train-images-idx3-ubyte.gz"
mkdir -p "$dir/dirdata/train-images-idx3-ubyte.gz"
expect 2 "train-images-idx3-ubyte.gz: cannot read it: it is a directory" \
  "$bin" train --data "$dir/dirdata" --steps 1

# Plot paths made of gnuplot syntax: the file appears under exactly that name, and nothing runs.
if command -v gnuplot >/dev/null; then
  for name in "q'uote.png" $'new\nline.png' $'x.png\'\nsystem "touch ran-marker"\n#' \
    $'y.png"\n! touch ran-marker\n'; do
    (cd "$dir" && "$bin" train --model mlp:8 --steps 2 --plot "$name" >/dev/null)
    head -c 8 "$dir/$name" | grep -q PNG || { echo "FAILED: no PNG at the path '$name'"; exit 1; }
    [ ! -e "$dir/ran-marker" ] || { echo "FAILED: the plot path ran a gnuplot command"; exit 1; }
  done
  echo "ok: plot paths with quotes and newlines are file names only"
fi
expect 2 "--plot $dir/missing/x.png: cannot write the file" \
  "$bin" train --model mlp:8 --steps 2 --plot "$dir/missing/x.png"
