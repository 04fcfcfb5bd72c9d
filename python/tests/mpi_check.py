"""Run under `mpirun -np 4`: the mpi backend from Python, torch-style (no run(): the process is
the rank), checked against the same work on 4 thread ranks inside each process."""

import sys

import numpy as np

import meshtensor as mt
from meshtensor import Partial, Replicate, Shard

SHAPE = (11, 6)


def dtensor_work(world):
    mesh = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    d = mt.distribute_tensor(x, mesh, [Shard(0), Shard(1)])
    r = d.redistribute(mesh, [Replicate(), Shard(0)])
    assert np.array_equal(r.full_tensor(), x)
    parts = mt.contribution(SHAPE, "f32", 3, world.rank)
    exact = mt.DTensor.from_local(parts, mesh, [Partial(), Partial()]).full_tensor(mode="exact")
    gathered = world.all_gather(np.array([world.rank], dtype=np.int64))
    assert list(gathered) == list(range(world.size)), gathered
    return mt.digest(r.to_local()), mt.digest(exact)


def train_work(data):
    return mt.train(data, model="mlp:16", steps=3, batch=300, strategy="fsdp", mode="exact",
                    seed=2)["digest"]


def main():
    assert mt.under_mpirun(), "run me under mpirun"
    world = mt.get_world()
    assert world.backend == "mpi" and world.size == 4, world
    mine = dtensor_work(world)
    data = mt.load_dataset(sys.argv[1]) if len(sys.argv) > 1 else mt.load_dataset().limit(1200, 100)
    trained = train_work(data)
    threads = mt.run_threads(4, dtensor_work)
    threads_trained = mt.run_threads(2, lambda w: train_work(data))[0]
    assert mine == threads[world.rank], (mine, threads[world.rank])
    assert trained == threads_trained, (trained, threads_trained)
    world.barrier()
    print(f"rank {world.rank}: mpi equals threads ({mine[1]}, weights {trained})\n", end="")


main()
