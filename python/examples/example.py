# A DTensor user's first meshtensor script: 4 thread ranks, or 4 processes under
# `mpirun -np 4 python3 example.py`.
import numpy as np
import meshtensor as mt
from meshtensor import Partial, Replicate, Shard

def main(world):
    mesh = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    x = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)            # same data on every rank
    d = mt.distribute_tensor(x, mesh, [Shard(0), Replicate()])      # 4 + 3 rows over dp
    r = d.redistribute(mesh, [Replicate(), Shard(1)])               # one all-gather, one local chunk
    p = mt.DTensor.from_local(x * (world.rank + 1), mesh, [Partial(), Partial()])
    total = p.full_tensor(mode="exact")                             # correctly rounded sum
    assert (r.full_tensor() == x).all() and (total == 10 * x).all()
    print(f"rank {world.rank} ({world.backend}): {d.to_local().shape} -> {r.to_local().shape}\n", end="")

mt.run(main, ranks=4)
