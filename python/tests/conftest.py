"""Shared fixtures: the command-line tool (to compare with) and a small slice of Fashion-MNIST."""

import gzip
import os
import struct
import subprocess

import pytest

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="session")
def cli():
    """Runs the `meshtensor` tool of the same build; returns its stdout."""
    binary = os.environ.get("MESHTENSOR_CLI")
    if not binary:
        pytest.skip("MESHTENSOR_CLI is not set (CTest sets it)")

    def run(*args):
        done = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
        if done.returncode != 0:
            raise AssertionError(f"meshtensor {' '.join(map(str, args))} failed: {done.stderr}")
        return done.stdout

    run.binary = binary
    return run


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """The first 3000 training and 500 test images of Fashion-MNIST as plain IDX files."""
    out = tmp_path_factory.mktemp("fashion-mnist-slice")
    for name, count in (("train", 3000), ("t10k", 500)):
        for kind, header, item in (("images-idx3-ubyte", 16, 784), ("labels-idx1-ubyte", 8, 1)):
            with gzip.open(os.path.join(FASHION_MNIST, f"{name}-{kind}.gz")) as f:
                blob = f.read()
            head = blob[:4] + struct.pack(">I", count) + blob[8:header]
            (out / f"{name}-{kind}").write_bytes(head + blob[header:header + count * item])
    return str(out)


def chunk(length, parts, index):
    """(offset, size) of piece `index` of `length` items cut as torch.chunk cuts."""
    size = -(-length // parts) if parts else 0
    offset = min(index * size, length)
    return offset, min(size, length - offset)


@pytest.fixture
def text(tmp_path):
    """A small text of 80 fortune-shaped records."""
    path = tmp_path / "text.txt"
    path.write_text("".join(f"fortune {i}: {'ab' * (i % 5)} the end\n%\n" for i in range(80)))
    return str(path)
