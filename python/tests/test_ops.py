"""DTensor compute ops with sharding propagation, and CommDebugMode, on thread ranks."""

import numpy as np
import pytest

import meshtensor as mt
from meshtensor import Replicate, Shard


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def test_megatron_mlp_runs_one_all_reduce_and_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 16)).astype(np.float32)
    want = gelu(x.astype(np.float64) @ w1) @ w2

    def body(world):
        mesh = mt.init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
        with mt.CommDebugMode() as mode:
            hidden = mt.ops.gelu(mt.ops.matmul(mt.distribute_tensor(x, mesh, [Replicate()]),
                                               mt.distribute_tensor(w1, mesh, [Shard(1)])))
            assert hidden.spec == "S2"
            partial = mt.ops.matmul(hidden, mt.distribute_tensor(w2, mesh, [Shard(0)]))
            assert partial.spec == "P(sum)"
            assert mode.count() == 0
            y = partial.full_tensor()
        assert mode.count("all_reduce") == 1
        assert [op["op"] for op in mode.ops] == ["matmul nn", "gelu", "matmul nn", "redistribute"]
        assert mode.ops[2]["strategy"]["output"] == "P(sum)"
        assert "all_reduce" in str(mode)
        return y

    for y in on(4, body):
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def on(ranks, fn):
    return mt.run_threads(ranks, fn)


def test_vocabulary_parallel_loss_equals_the_replicated_bits_in_exact_mode():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((64, 65536)).astype(np.float32)
    labels = rng.integers(0, 65536, 64).astype(np.int32)

    def body(world):
        mesh = mt.init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
        whole = mt.ops.cross_entropy(mt.distribute_tensor(logits, mesh, [Replicate()]),
                                     mt.distribute_tensor(labels, mesh, [Replicate()]),
                                     mode="exact")
        with mt.CommDebugMode() as mode:
            split = mt.ops.cross_entropy(mt.distribute_tensor(logits, mesh, [Shard(1)]),
                                         mt.distribute_tensor(labels, mesh, [Replicate()]),
                                         mode="exact")
        assert mode.ops[-1]["strategy"]["internal_collectives"] == 3
        return whole.to_local().tobytes(), split.to_local().tobytes()

    for whole, split in on(4, body):
        assert whole == split


def test_ops_reject_mismatched_shapes_naming_them():
    def body(world):
        mesh = mt.init_device_mesh("cpu", (2,))
        a = mt.distribute_tensor(np.zeros((4, 3), np.float32), mesh, [Replicate()])
        b = mt.distribute_tensor(np.zeros((5, 2), np.float32), mesh, [Replicate()])
        with pytest.raises(mt.InvalidArgument, match="4x3"):
            mt.ops.matmul(a, b)
        with pytest.raises(mt.InvalidArgument, match="form 'xx'"):
            mt.ops.matmul(a, b, form="xx")

    on(2, body)
