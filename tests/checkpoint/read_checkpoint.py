"""An independent reader of meshtensor checkpoints, written from the safetensors specification
with NumPy only: it parses every file (8-byte little-endian header length, JSON header with
dtype, shape and data_offsets, data packed with no gaps), assembles each global tensor from the
blocks the index lists, and compares them with DIR/expected/<name>.raw when that directory
exists. Exits non-zero with the reason on any mismatch.

Usage: read_checkpoint.py DIR
"""
import json
import os
import struct
import sys

import numpy as np

DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bits; bfloat16 is the top half of a float32
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),
}


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def read_safetensors(path):
    """Returns {name: (dtype, shape, ndarray)} and the metadata of one file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail(f"{path}: shorter than the header length")
    (length,) = struct.unpack("<Q", blob[:8])
    if 8 + length > len(blob):
        fail(f"{path}: header length {length} past the end")
    header_bytes = blob[8 : 8 + length]
    if not header_bytes.startswith(b"{"):
        fail(f"{path}: header does not start with '{{'")
    header = json.loads(header_bytes.decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = blob[8 + length :]
    tensors = {}
    spans = []
    for name, entry in header.items():
        if set(entry) != {"dtype", "shape", "data_offsets"}:
            fail(f"{path}: {name} has fields {sorted(entry)}")
        dtype = DTYPES[entry["dtype"]]
        shape = tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            fail(f"{path}: {name} byte range does not match its shape")
        spans.append((begin, end))
        array = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape)
        tensors[name] = (entry["dtype"], shape, array)
    spans.sort()
    position = 0
    for begin, end in spans:
        if begin != position:
            fail(f"{path}: gap or overlap at byte {begin}")
        position = end
    if position != len(data):
        fail(f"{path}: {len(data) - position} bytes after the last tensor")
    return tensors, metadata


def main():
    root = sys.argv[1]
    directory = root
    if not os.path.exists(os.path.join(directory, "index.json")):
        with open(os.path.join(root, "LATEST")) as f:
            directory = os.path.join(root, f.read().strip())
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    files = {name: read_safetensors(os.path.join(directory, name)) for name in index["files"]}
    expected_dir = os.path.join(root, "expected")
    checked = 0
    for name, tensor in index["tensors"].items():
        dtype = DTYPES[tensor["dtype"]]
        shape = tuple(tensor["shape"])
        assembled = np.zeros(shape, dtype=dtype)
        covered = np.zeros(shape, dtype=bool)
        for block in tensor["blocks"]:
            stored_dtype, stored_shape, array = files[block["file"]][0][name]
            if stored_dtype != tensor["dtype"] or list(stored_shape) != block["shape"]:
                fail(f"{name}: {block['file']} holds {stored_dtype} {stored_shape}")
            where = tuple(slice(o, o + n) for o, n in zip(block["offset"], block["shape"]))
            if covered[where].any():
                fail(f"{name}: blocks overlap")
            assembled[where] = array
            covered[where] = True
        if not covered.all():
            fail(f"{name}: blocks do not cover the tensor")
        raw = os.path.join(expected_dir, name + ".raw")
        if os.path.isdir(expected_dir):
            with open(raw, "rb") as f:
                expected = np.frombuffer(f.read(), dtype=dtype).reshape(shape)
            if assembled.tobytes() != expected.tobytes():
                fail(f"{name}: values differ from {raw}")
            checked += 1
        if tensor["dtype"] == "BF16":
            as_float = (assembled.astype(np.uint32) << 16).view(np.float32)
            if not np.all(np.isfinite(as_float)):
                fail(f"{name}: bf16 values are not finite")
        print(f"{name}: {tensor['dtype']} {list(shape)} from {len(tensor['blocks'])} block(s)")
    print(f"OK: {len(index['tensors'])} tensors read from {len(files)} files, "
          f"{checked} compared with the expected values")


if __name__ == "__main__":
    main()
