"""Misuses of the module: each is refused at once, by an exception of meshtensor's classes that
names the cause, instead of a hang, a silent disagreement between ranks or pybind11's message."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import meshtensor as mt
from meshtensor import Replicate, Shard


def distribute(world, shape=(4, 4), placements=(Shard(0),), value=1.0, mesh_shape=(2,)):
    mesh = mt.init_device_mesh("cpu", mesh_shape)
    return mt.distribute_tensor(np.full(shape, value, np.float32), mesh, list(placements))


def test_a_rank_that_returns_early_releases_the_others_at_once_naming_it():
    def body(world):
        if world.rank == 1:
            return "left"
        world.all_reduce(np.ones(4, np.float32), timeout=60)

    start = time.monotonic()
    with pytest.raises(mt.CommError, match=r"world rank\(s\) \[1\] returned from the rank function"):
        mt.run_threads(2, body)
    assert time.monotonic() - start < 10


def test_a_dtensor_used_after_its_run_fails_at_once():
    held = mt.run_threads(2, distribute)
    start = time.monotonic()
    with pytest.raises(mt.CommError, match="world rank 0's run has ended"):
        held[0].full_tensor()
    with pytest.raises(mt.CommError, match="run has ended"):
        held[1].redistribute(placements=[Replicate()])
    assert time.monotonic() - start < 10


def test_ctrl_c_interrupts_ranks_waiting_in_collectives_and_in_python():
    def body(world):
        if world.rank == 0:
            threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            world.all_reduce(np.ones(4, np.float32), timeout=60)  # rank 1 never joins
        else:
            while True:
                time.sleep(0.01)

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        mt.run_threads(2, body)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("differ", [
    dict(mesh_shape=(1, 2), placements=(Replicate(), Shard(0))),
    dict(placements=(Shard(1),)),
    dict(value=2.0),
    dict(shape=(4, 5)),
])
def test_ranks_that_distribute_different_tensors_are_refused(differ):
    def body(world):
        return distribute(world, **(differ if world.rank == 1 else {})).spec

    with pytest.raises(mt.InvalidArgument, match="disagree on distribute_tensor.*world rank 1"):
        mt.run_threads(2, body)


def test_ranks_that_redistribute_differently_are_refused():
    def body(world):
        d = distribute(world)
        return d.redistribute(placements=[Replicate()] if world.rank == 0 else [Shard(1)]).spec

    with pytest.raises(mt.InvalidArgument, match="disagree on redistribute"):
        mt.run_threads(2, body)


@pytest.mark.parametrize("differ", ["root", "step", "keep", "metadata", "name"])
def test_ranks_that_save_differently_are_refused_and_nothing_is_written(tmp_path, differ):
    def body(world):
        other = world.rank == 1
        name = "v" if other and differ == "name" else "w"
        root = tmp_path / ("other" if other and differ == "root" else "ck")
        return mt.save_checkpoint({name: distribute(world)}, str(root),
                                  step=1 if other and differ == "step" else 0,
                                  keep=2 if other and differ == "keep" else 0,
                                  metadata={"run": "b" if other and differ == "metadata" else "a"})

    with pytest.raises(mt.InvalidArgument, match="disagree on the checkpoint"):
        mt.run_threads(2, body)
    assert not any(tmp_path.iterdir())


def test_epoch_order_counts_are_bounded():
    with pytest.raises(mt.InvalidArgument, match="epoch order of -1 samples"):
        mt.epoch_order(-1, 0, 0)
    with pytest.raises(mt.InvalidArgument, match="epoch order of 4294967296 samples"):
        mt.epoch_order(2**32, 0, 0)
    assert sorted(mt.epoch_order(10, 0, 0)) == list(range(10))


def test_epoch_order_too_big_for_memory_is_refused_under_a_limit():
    script = textwrap.dedent("""
        import resource, meshtensor as mt
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        try:
            mt.epoch_order(10**9, 0, 0)
        except mt.ResourceError as error:
            print("refused:", error)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert "refused:" in done.stdout and "epoch order of 1000000000 samples" in done.stdout, done


def test_collective_counts_that_overflow_are_refused():
    def body(world):
        world.all_gather(np.ones(4, np.float32), counts=[2**62, 2**62])

    with pytest.raises(mt.InvalidArgument, match="add up to more elements than a tensor holds"):
        mt.run_threads(2, body)

    def scatter(world):
        world.reduce_scatter(np.ones(4, np.float32), counts=[2**62, 2**62])

    with pytest.raises(mt.InvalidArgument, match="4611686018427387904"):
        mt.run_threads(2, scatter)


def test_wrong_argument_types_name_the_argument(tmp_path):
    cases = [
        (lambda: mt.run_threads("2", lambda w: None), "run_threads(): argument 'ranks' must be int"),
        (lambda: mt.load_checkpoint([1], str(tmp_path)),
         "load_checkpoint(): argument 'state_dict' must be dict, got list"),
        (lambda: mt.epoch_order("a", 0, 0), "epoch_order(): argument 'count' must be int"),
        (lambda: mt.MLP(784, [4], seed="a"), "MLP(): argument 'seed' must be int"),
        (lambda: mt.run_threads(1, lambda w: w.split("a")),
         "Communicator.split(): argument 'color' must be int, got str 'a'"),
        (lambda: mt.run_threads(1, lambda w: w.barrier(timeout="x")),
         "argument 'timeout' must be Optional[float]"),
        (lambda: mt.run_threads(1, lambda w: mt.init_device_mesh("cpu", (1,), mesh_dim_names="dp")),
         "mesh_dim_names must be a sequence of str, got str 'dp'"),
        (lambda: mt.run_threads(1, lambda w: mt.save_checkpoint({1: np.ones(2)}, str(tmp_path))),
         "a key of state_dict must be a str, got int 1"),
        (lambda: mt.run_threads(1, lambda w: mt.DTensor.from_local(np.ones(2), 5)),
         "argument 'device_mesh' must be DeviceMesh, got int 5"),
        (lambda: mt.train(None), "train(): argument 'data' must be Dataset"),
    ]
    for call, message in cases:
        with pytest.raises(mt.ArgumentTypeError, match=re.escape(message)) as error:
            call()
        assert isinstance(error.value, TypeError) and isinstance(error.value, mt.InvalidArgument)
