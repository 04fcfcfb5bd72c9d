"""Opt-in (runs when python3-torch is installed): layouts and full tensors against torch.chunk,
and collectives against torch.distributed (gloo) on the same data."""

import os
import tempfile

import numpy as np
import pytest

import meshtensor as mt
from meshtensor import Partial, Replicate, Shard

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.mark.parametrize("length,parts", [(l, p) for l in (1, 5, 7, 13, 16) for p in (2, 3, 4, 8)])
def test_shards_are_torch_chunk(length, parts):
    x = torch.arange(length * 2, dtype=torch.float32).reshape(length, 2)
    pieces = list(torch.chunk(x, parts, dim=0))
    pieces += [x[length:]] * (parts - len(pieces))  # torch.chunk drops empty trailing pieces

    def body(world):
        mesh = mt.init_device_mesh("cpu", (parts,))
        d = mt.distribute_tensor(x.numpy(), mesh, [Shard(0)])
        return d.to_local(), d.full_tensor()

    for rank, (local, full) in enumerate(mt.run_threads(parts, body)):
        assert np.array_equal(local, pieces[rank].numpy())
        assert np.array_equal(full, torch.cat(pieces).numpy())


def _gloo_rank(rank, size, store_file, contributions, blocks, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=size)
    summed = torch.from_numpy(contributions[rank].copy())
    dist.all_reduce(summed)
    gathered = [torch.empty_like(torch.from_numpy(blocks[0])) for _ in range(size)]
    dist.all_gather(gathered, torch.from_numpy(blocks[rank]))
    np.save(os.path.join(out_dir, f"sum-{rank}.npy"), summed.numpy())
    np.save(os.path.join(out_dir, f"gather-{rank}.npy"), torch.cat(gathered).numpy())
    dist.destroy_process_group()


def test_collectives_agree_with_torch_distributed():
    import torch.multiprocessing as mp

    size = 4
    ints = [np.arange(24, dtype=np.int64).reshape(6, 4) * (r + 1) - 7 for r in range(size)]
    floats = [mt.contribution((6, 4), "f64", 9, r) for r in range(size)]
    x = np.random.default_rng(2).standard_normal((8, 3))
    blocks = [b.numpy() for b in torch.chunk(torch.from_numpy(x), size)]
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for name, contributions in (("ints", ints), ("floats", floats)):
            out = os.path.join(tmp, name)
            os.makedirs(out)
            mp.spawn(_gloo_rank, args=(size, os.path.join(out, "store"), contributions, blocks, out),
                     nprocs=size, join=True)
            results[name] = ([np.load(os.path.join(out, f"sum-{r}.npy")) for r in range(size)],
                             [np.load(os.path.join(out, f"gather-{r}.npy")) for r in range(size)])

    def body(world):
        mesh = mt.init_device_mesh("cpu", (size,))
        s_int = mt.DTensor.from_local(ints[world.rank], mesh, [Partial()]).full_tensor()
        s_float = mt.DTensor.from_local(floats[world.rank], mesh, [Partial()]).full_tensor(mode="exact")
        full = mt.DTensor.from_local(np.ascontiguousarray(blocks[world.rank]), mesh, [Shard(0)]).full_tensor()
        return s_int, s_float, full

    for s_int, s_float, full in mt.run_threads(size, body):
        for r in range(size):
            assert np.array_equal(s_int, results["ints"][0][r])  # integer sums: exact in both
            np.testing.assert_allclose(s_float, results["floats"][0][r], rtol=1e-12, atol=1e-300)
            assert np.array_equal(full, results["ints"][1][r]) and np.array_equal(full, x)
