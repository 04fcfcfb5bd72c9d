"""DTensors and collectives on thread ranks, against NumPy and the C++ tool."""

import math
import random
import re
import time

import numpy as np
import pytest

import meshtensor as mt
from meshtensor import Partial, Replicate, Shard

DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8]


def on_ranks(ranks, fn):
    return mt.run_threads(ranks, fn)


def block_of(x, mesh, placements, rank):
    shape, offset = mt.local_layout(mesh, placements, x.shape, rank)
    return x[tuple(slice(o, o + s) for o, s in zip(offset, shape))]


@pytest.mark.parametrize("dtype", DTYPES)
def test_distribute_keeps_each_ranks_block_and_full_tensor_restores(dtype):
    x = (np.arange(7 * 5) % 200).reshape(7, 5).astype(dtype)

    def body(world):
        mesh = mt.init_device_mesh("cpu", (2, 2))
        results = []
        for placements in ([Shard(0), Shard(1)], [Shard(0), Shard(0)], [Replicate(), Shard(1)],
                           "S0@1,S0@0"):
            d = mt.distribute_tensor(x, mesh, placements)
            assert d.shape == x.shape and d.dtype == np.dtype(dtype)
            expected = block_of(x, mt.DeviceMesh((2, 2)), placements, world.rank)
            assert d.to_local().dtype == np.dtype(dtype)
            assert np.array_equal(d.to_local(), expected)
            full = d.full_tensor()
            results.append(full.tobytes() == x.tobytes())
        return results

    assert all(all(r) for r in on_ranks(4, body))


def test_redistribute_round_trips_between_random_specs():
    rng = random.Random(7)
    tokens = ["S0", "S1", "R"]
    x = np.random.default_rng(3).standard_normal((11, 6)).astype(np.float32)
    pairs = [(",".join(rng.choice(tokens) for _ in range(3)),
              ",".join(rng.choice(tokens) for _ in range(3))) for _ in range(12)]

    def body(world):
        mesh = mt.init_device_mesh("cpu", (2, 2, 2))
        grid = mt.DeviceMesh((2, 2, 2))
        for src, dst in pairs:
            d = mt.distribute_tensor(x, mesh, src)
            for merge in (True, False):
                r = d.redistribute(mesh, dst, merge=merge)
                assert r.spec == dst
                assert np.array_equal(r.to_local(), block_of(x, grid, dst, world.rank)), (src, dst)
                back = r.redistribute(placements=src)
                assert np.array_equal(back.to_local(), d.to_local())
        return True

    assert all(on_ranks(8, body))


def test_partial_sums_reduce_in_every_mode():
    x = np.arange(12, dtype=np.float64).reshape(4, 3)

    def body(world):
        mesh = mt.init_device_mesh("cpu", (4,))
        d = mt.DTensor.from_local(x * (world.rank + 1), mesh, [Partial()])
        assert d.shape == (4, 3)
        out = {}
        for mode in ("ordered", "exact", "native"):
            out[mode] = d.redistribute(mesh, [Replicate()], mode=mode).to_local()
        avg = mt.DTensor.from_local(x * (world.rank + 1), mesh, [Partial("avg")])
        out["avg"] = avg.full_tensor()
        return out

    for out in on_ranks(4, body):
        for mode in ("ordered", "exact", "native"):
            assert np.array_equal(out[mode], x * 10)
        assert np.array_equal(out["avg"], x * 2.5)


def test_exact_sums_are_correctly_rounded_and_the_same_on_any_mesh():
    """Four contributions of f64 values over many binades: exact mode gives math.fsum's bits,
    whether the 4 sit on a 1-d mesh of 4, a 2x2 mesh, a 1x4 mesh or beside a Shard dim."""
    shape = (5, 7)
    parts = [mt.contribution(shape, "f64", 11, i) for i in range(4)]
    fsum = np.array([math.fsum(p.flat[i] for p in parts) for i in range(35)]).reshape(shape)

    def on_mesh(mesh_shape, placements):
        def body(world):
            mesh = mt.init_device_mesh("cpu", mesh_shape)
            grid = mt.DeviceMesh(mesh_shape)
            coords = grid.coordinates(world.rank)
            index = 0
            for m, p in enumerate(placements):
                if p.is_partial():
                    index = index * mesh_shape[m] + coords[m]
            held = ["R" if p.is_partial() else p for p in placements]
            block = np.ascontiguousarray(block_of(parts[index], grid, held, world.rank))
            d = mt.DTensor.from_local(block, mesh, placements, shape=shape)
            return mt.digest(d.full_tensor(mode="exact"))
        return on_ranks(math.prod(mesh_shape), body)

    digests = (on_mesh((4,), [Partial()]) + on_mesh((2, 2), [Partial(), Partial()]) +
               on_mesh((1, 4), [Replicate(), Partial()]) +
               on_mesh((2, 2, 2), [Partial(), Shard(0), Partial()]))
    assert set(digests) == {mt.digest(fsum)}


@pytest.mark.parametrize("mesh_shape,src,dst,shape,dtype,mode", [
    ((2, 2), "P,S0", "R,R", (7, 5), "f32", "exact"),
    ((2, 2), "P,P", "S1,R", (9, 4), "f64", "exact"),
    ((4,), "P", "S0", (13,), "bf16", "exact"),
    ((2, 2), "P,S0", "R,R", (7, 5), "f32", "ordered"),
    ((3,), "S0", "R", (10, 2), "i32", "ordered"),
])
def test_check_digests_equal_the_cli(cli, mesh_shape, src, dst, shape, dtype, mode):
    ranks = math.prod(mesh_shape)

    def body(world):
        mesh = mt.init_device_mesh("cpu", mesh_shape)
        return mt.check(mesh, src, dst, shape, dtype, mode=mode, seed=5)

    results = on_ranks(ranks, body)
    assert all(r["ok"] for r in results) and len({r["digest"] for r in results}) == 1
    out = cli("check", "--mesh", "x".join(map(str, mesh_shape)), "--from", src, "--to", dst,
              "--shape", "x".join(map(str, shape)), "--dtype", dtype, "--mode", mode, "--seed", 5)
    assert re.match(r"OK ([0-9a-f]{16})", out).group(1) == results[0]["digest"]


def test_exact_check_digest_does_not_depend_on_the_mesh(cli):
    digests = set()
    for mesh_shape, src in (((4,), "P"), ((2, 2), "P,P"), ((1, 4), "R,P")):
        out = cli("check", "--mesh", "x".join(map(str, mesh_shape)), "--from", src,
                  "--to", ",".join("R" * len(mesh_shape)), "--shape", "6x6", "--mode", "exact")
        digests.add(out.split()[1])
    assert len(digests) == 1


def test_numpy_memory_is_shared_not_copied():
    def body(world):
        mesh = mt.init_device_mesh("cpu", (2,))
        a = np.full((3, 4), world.rank + 1.0, dtype=np.float32)
        d = mt.DTensor.from_local(a, mesh, [Shard(0)])
        shared_in = np.shares_memory(d.to_local(), a)
        local = d.to_local()
        local[0, 0] = 42  # to_local is the DTensor's own block
        seen = d.to_local()[0, 0]
        strided = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # not contiguous: copied
        s = mt.DTensor.from_local(strided, mesh, [Replicate()])
        copied = not np.shares_memory(s.to_local(), strided)
        world.all_reduce(a)  # in place, into the array's own memory
        return shared_in, seen, copied, a[1, 1]

    for shared_in, seen, copied, reduced in on_ranks(2, body):
        assert shared_in and seen == 42 and copied and reduced == 3.0


def test_collectives_of_the_communicator():
    def body(world):
        r, n = world.rank, world.size
        a = np.arange(6, dtype=np.int64) + 10 * r
        s = world.all_reduce(a.copy())
        m = world.all_reduce(a.astype(np.float64), "max")
        g = world.all_gather(np.full((2, 3), r, dtype=np.int32))
        u = world.all_gather(np.full(r + 1, r, dtype=np.int32), counts=list(range(1, n + 1)))
        rs = world.reduce_scatter(np.ones((n * 2, 2), dtype=np.float32) * (r + 1))
        t = world.all_to_all(np.arange(n, dtype=np.int64) + 100 * r)
        b = world.broadcast(np.full(3, r, dtype=np.uint8), src=2)
        sub = world.split(r % 2, key=-r)
        subsum = sub.all_reduce(np.array([r], dtype=np.int64))
        world.barrier()
        return s, m, g, u, rs, t, b, sub.size, sub.world_ranks, subsum

    n = 4
    for r, (s, m, g, u, rs, t, b, sub_size, sub_ranks, subsum) in enumerate(on_ranks(n, body)):
        assert np.array_equal(s, 4 * np.arange(6) + 60)
        assert np.array_equal(m, np.arange(6) + 30.0)
        assert g.shape == (8, 3) and np.array_equal(g[:, 0], np.repeat(np.arange(4), 2))
        assert np.array_equal(u, np.concatenate([np.full(i + 1, i) for i in range(4)]))
        assert rs.shape == (2, 2) and (rs == 10).all()
        assert np.array_equal(t, np.arange(4) * 100 + r)
        assert (b == 2).all()
        assert sub_size == 2 and sub_ranks == ([2, 0] if r % 2 == 0 else [3, 1])
        assert subsum[0] == (2 if r % 2 == 0 else 4)


def test_mesh_groups_and_coordinates():
    def body(world):
        mesh = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp = mesh.get_group("tp")
        total = tp.all_reduce(np.array([world.rank], dtype=np.int64))[0]
        return mesh.get_rank(), mesh.get_coordinate(), mesh.get_local_rank("tp"), tp.size, total

    for r, (rank, coord, local, size, total) in enumerate(on_ranks(4, body)):
        assert rank == r and coord == (r // 2, r % 2) and local == r % 2 and size == 2
        assert total == (1 if r < 2 else 5)


def test_errors_are_exceptions_of_matching_classes():
    def bad_spec(world):
        mesh = mt.init_device_mesh("cpu", (2,))
        mt.distribute_tensor(np.zeros((4, 4)), mesh, [Shard(3)])

    with pytest.raises(mt.InvalidArgument, match="shards tensor dim 3"):
        on_ranks(2, bad_spec)
    with pytest.raises(mt.InvalidArgument, match="mesh 3 has 3 ranks but the world communicator has 2"):
        on_ranks(2, lambda w: mt.init_device_mesh("cpu", (3,)))
    with pytest.raises(mt.InvalidArgument, match="device_type must be 'cpu', got 'cuda'"):
        on_ranks(1, lambda w: mt.init_device_mesh("cuda", (1,)))
    with pytest.raises(mt.InvalidArgument, match="no world on this thread"):
        mt.get_world()
    with pytest.raises(mt.InvalidArgument, match="float32 array"):
        mt.cross_entropy(np.zeros((2, 3), dtype=np.float64), [0, 1])
    with pytest.raises(mt.InvalidArgument, match="complex128"):
        mt.digest(np.zeros(3, dtype=np.complex128))
    with pytest.raises(mt.InvalidArgument, match="1 to 4096 ranks, not 100000"):
        mt.run_threads(100000, lambda w: None)


def test_a_failing_rank_fails_the_others_and_its_exception_is_raised():
    seen = []

    def body(world):
        if world.rank == 1:
            raise KeyError("rank one broke")
        try:
            world.barrier()
        except mt.CommError as error:
            seen.append(str(error))
            raise

    with pytest.raises(KeyError, match="rank one broke"):
        mt.run_threads(3, body)
    assert len(seen) == 2 and all("rank one broke" in s for s in seen)


def test_different_collectives_are_a_desync_and_a_missing_rank_a_timeout():
    def desync(world):
        a = np.zeros(4, dtype=np.float32)
        if world.rank == 0:
            world.all_reduce(a)
        else:
            world.broadcast(a)

    with pytest.raises(mt.DesyncError, match="all_reduce"):
        mt.run_threads(2, desync)

    def missing(world):
        if world.rank == 0:
            world.barrier(timeout=0.3)
        else:
            time.sleep(1.0)  # alive but not calling: a timeout (a rank that returns is named at once)

    with pytest.raises(mt.TimeoutError) as error:
        mt.run_threads(2, missing)
    assert isinstance(error.value, TimeoutError) and isinstance(error.value, mt.CommError)


def test_save_and_load_dtensors_on_another_mesh(tmp_path):
    x = np.random.default_rng(1).standard_normal((9, 5))
    y = np.arange(7, dtype=np.int32)

    def save(world):
        mesh = mt.init_device_mesh("cpu", (2, 2))
        state = {"x": mt.distribute_tensor(x, mesh, [Shard(0), Shard(1)]),
                 "y": mt.distribute_tensor(y, mesh, [Partial(), Shard(0)]),
                 "step": np.array(12, dtype=np.int64)}
        return mt.save_checkpoint(state, str(tmp_path), step=12, metadata={"who": "test"})

    path = on_ranks(4, save)[0]
    assert path.endswith("step-00000012")

    def load(world):
        mesh = mt.init_device_mesh("cpu", (3,))
        state = {"x": mt.distribute_tensor(np.zeros_like(x), mesh, [Shard(1)]),
                 "y": mt.distribute_tensor(np.zeros_like(y), mesh, [Replicate()]),
                 "step": np.zeros((), dtype=np.int64)}
        mt.load_checkpoint(state, str(tmp_path))
        return state["x"].full_tensor(), state["y"].to_local(), int(state["step"])

    for fx, ly, step in on_ranks(3, load):
        assert fx.tobytes() == x.tobytes() and np.array_equal(ly, y) and step == 12

    def wrong(world):
        mesh = mt.init_device_mesh("cpu", (1,))
        mt.load_checkpoint({"x": mt.distribute_tensor(np.zeros((9, 4)), mesh, [Replicate()])},
                           str(tmp_path))

    with pytest.raises(mt.DataError, match="x"):
        on_ranks(1, wrong)
    with pytest.raises(mt.DataError):
        on_ranks(1, lambda w: mt.load_checkpoint({}, str(tmp_path / "nothing")))


def test_release_cached_storage_hands_back_freed_tensor_memory():
    x = np.ones((1024, 1024), dtype=np.float32)  # 4 MiB: paged storage

    def body(world):
        mesh = mt.init_device_mesh("cpu", (1,))
        d = mt.distribute_tensor(x, mesh, [Replicate()])
        assert float(d.full_tensor().sum()) == 1024 * 1024
        return None

    mt.release_cached_storage()
    on_ranks(1, body)
    released = mt.release_cached_storage()
    assert isinstance(released, int)
    assert released >= 4 << 20  # at least the 4 MiB array's block waited for reuse
    assert mt.release_cached_storage() == 0
