"""Meshes, placements, layouts and plans: pure, no ranks needed."""

import itertools

import numpy as np
import pytest

import meshtensor as mt
from meshtensor import Partial, Replicate, Shard
from conftest import chunk


def test_device_mesh_properties():
    mesh = mt.DeviceMesh((2, 3), mesh_dim_names=("dp", "tp"))
    assert mesh.shape == (2, 3)
    assert mesh.ndim == 2
    assert mesh.size() == 6 and mesh.size("tp") == 3 and mesh.size(0) == 2
    assert mesh.mesh_dim_names == ("dp", "tp")
    assert mesh.coordinates(4) == (1, 1)
    assert mesh.group_ranks(4, "tp") == [3, 4, 5]
    assert mesh.group_ranks(0, ["dp", "tp"]) == [0, 1, 2, 3, 4, 5]
    assert mesh.group_ranks(0, ["tp", "dp"]) == [0, 3, 1, 4, 2, 5]
    assert not mesh.is_bound
    assert mesh == mt.DeviceMesh.parse("2x3", "dp,tp")
    with pytest.raises(mt.InvalidArgument, match="get_rank needs a mesh bound to a world"):
        mesh.get_rank()


def test_bad_meshes_raise_with_the_value():
    with pytest.raises(mt.InvalidArgument, match="0"):
        mt.DeviceMesh((2, 0))
    with pytest.raises(mt.ParseError, match="2xq"):
        mt.DeviceMesh.parse("2xq")
    with pytest.raises(mt.InvalidArgument, match="dim names"):
        mt.DeviceMesh((2, 2), mesh_dim_names=("a",))


def test_placements_follow_torch():
    assert Shard(0) == Shard(0) and Shard(0) != Shard(1) and Replicate() == Replicate()
    assert Partial() == Partial("sum") and Partial("avg") != Partial()
    assert repr(Shard(1)) == "Shard(dim=1)" and repr(Partial("max")) == "Partial(max)"
    assert Shard(0).is_shard() and Shard(0).is_shard(0) and not Shard(0).is_shard(1)
    assert Replicate().is_replicate() and Partial().is_partial()
    assert mt.parse_placements("S0,R,P(avg)") == (Shard(0), Replicate(), Partial("avg"))
    assert len({Shard(0), Shard(0), Replicate()}) == 2
    with pytest.raises(mt.InvalidArgument, match="median"):
        Partial("median")
    with pytest.raises(mt.InvalidArgument, match="'0'"):
        Shard("0")
    with pytest.raises(mt.ParseError, match="unknown placement 'Q'"):
        mt.parse_placements("S0,Q")


def torch_chunk_pieces(array, parts, axis):
    """array cut into torch.chunk's pieces along axis, with NumPy's array_split at its bounds."""
    length = array.shape[axis]
    bounds = [chunk(length, parts, i)[0] for i in range(1, parts)]
    return np.array_split(array, bounds, axis=axis)


@pytest.mark.parametrize("length,parts", [(l, p) for l in (0, 1, 5, 7, 8, 13) for p in (1, 2, 3, 4, 8)])
def test_one_dim_layouts_are_torch_chunk_pieces(length, parts):
    x = np.arange(length * 3).reshape(length, 3)
    mesh = mt.DeviceMesh((parts,))
    pieces = torch_chunk_pieces(x, parts, 0)
    for rank in range(parts):
        shape, offset = mt.local_layout(mesh, [Shard(0)], x.shape, rank)
        block = x[offset[0]:offset[0] + shape[0], offset[1]:offset[1] + shape[1]]
        assert block.shape == pieces[rank].shape
        assert (block == pieces[rank]).all()
    # Where sizes divide evenly, these are NumPy's own array_split pieces too.
    if parts and length % parts == 0:
        for rank, piece in enumerate(np.array_split(x, parts)):
            assert mt.local_layout(mesh, [Shard(0)], x.shape, rank)[0] == piece.shape


@pytest.mark.parametrize("spec", ["S0,S0", "S0@1,S0@0", "S1,S0", "R,S1", "S0,R"])
@pytest.mark.parametrize("shape", [(7, 5), (9, 3), (2, 11)])
def test_two_dim_layouts_nest_torch_chunk(spec, shape):
    mesh = mt.DeviceMesh((2, 3))
    x = np.arange(shape[0] * shape[1]).reshape(shape)
    covered = np.zeros(shape, dtype=int)
    placements = spec.split(",")
    levels = [int(p.split("@")[1]) if "@" in p else None for p in placements]
    for rank in range(6):
        coords = mesh.coordinates(rank)
        expected = x
        # Apply each sharding mesh dim in shard order (outermost first).
        order = sorted(range(2), key=lambda m: (levels[m] if levels[m] is not None else m))
        for m in order:
            p = placements[m].split("@")[0]
            if p.startswith("S"):
                expected = torch_chunk_pieces(expected, mesh.shape[m], int(p[1:]))[coords[m]]
        local_shape, offset = mt.local_layout(mesh, spec, shape, rank)
        block = x[tuple(slice(o, o + s) for o, s in zip(offset, local_shape))]
        assert block.shape == expected.shape and (block == expected).all()
        if all(coords[m] == 0 for m in range(2) if not placements[m].startswith("S")):
            covered[tuple(slice(o, o + s) for o, s in zip(offset, local_shape))] += 1
    assert (covered == 1).all()


def test_plan_is_python_data():
    plan = mt.plan((2, 2), [Partial(), Shard(0)], [Replicate(), Replicate()], (8, 8), np.float32)
    assert plan.collectives >= 1
    kinds = [step["kind"] for step in plan.steps]
    assert "all_reduce" in kinds or "all_gather" in kinds
    text = plan.explain()
    assert text.startswith("redistribute P(sum),S0 -> R,R of 8x8 f32 on mesh 2x2")
    assert str(plan) == text
    data = plan.to_dict()
    assert data["from"] == "P(sum),S0" and data["to"] == "R,R"
    assert mt.plan(mt.DeviceMesh((2, 2)), "P,S0", "R,R", (8, 8)).to_dict() == data


def test_plan_merges_mesh_dims_unless_told_not_to():
    merged = mt.plan((2, 2), "S0,S0", "R,R", (8, 8))
    single = mt.plan((2, 2), "S0,S0", "R,R", (8, 8), merge=False)
    assert merged.collectives == 1
    assert single.collectives == 2
    assert all(len(s["group"]) == 1 for s in single.steps if s["kind"] == "all_gather")


def test_plan_errors_are_the_cli_messages(cli):
    with pytest.raises(mt.ParseError) as error:
        mt.plan((2, 2), "S0,Q", "R,R", (4, 4))
    import subprocess
    done = subprocess.run([cli.binary, "plan", "--mesh", "2x2", "--from", "S0,Q", "--to", "R,R",
                           "--shape", "4x4"], capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip() == f"meshtensor: error: {error.value}"
    with pytest.raises(mt.InvalidArgument, match="tensor dim 2"):
        mt.plan((2, 2), [Shard(2), Replicate()], "R,R", (4, 4))
    with pytest.raises(mt.InvalidArgument, match="out of range for a 2-d tensor"):
        mt.plan((2, 2), [Shard(-3), Replicate()], "R,R", (4, 4))


def test_negative_shard_dims_count_from_the_end():
    assert mt.local_layout(mt.DeviceMesh((2,)), [Shard(-1)], (3, 5), 1) == ((3, 2), (0, 3))
