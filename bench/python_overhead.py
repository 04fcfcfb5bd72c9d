"""What a Python redistribute costs next to the same C++ call, measured in the same run.

Every rank redistributes a small tensor back and forth, first through the C++ call
(meshtensor._meshtensor._time_redistribute, which loops in C++ without the GIL) and then through
DTensor.redistribute from Python; the ratio of the per-call medians is the binding's overhead.
On the threads backend the ranks' Python code shares one GIL, so the figure there includes that
contention; under `mpirun -np N python3 bench/python_overhead.py` each rank is a process.

Usage: python3 bench/python_overhead.py [--ranks 4] [--iterations 2000] [--repeats 5] [--json]
"""

import argparse
import json
import statistics
import time

import numpy as np

import meshtensor as mt
from meshtensor import Replicate, Shard
from meshtensor._meshtensor import _time_redistribute

CASES = [  # (mesh shape, source, target, tensor shape): small tensors, where overhead shows most
    ((2, 2), [Shard(0), Replicate()], [Replicate(), Shard(1)], (8, 8)),
    ((2, 2), [Shard(0), Shard(1)], [Replicate(), Replicate()], (16, 4)),
    ((4,), [Shard(0)], [Replicate()], (32,)),
]


def measure(world, iterations, repeats):
    rows = []
    for mesh_shape, src, dst, shape in CASES:
        if np.prod(mesh_shape) != world.size:
            mesh_shape = (world.size,)
            src, dst = [src[0]], [dst[-1]]
        mesh = mt.init_device_mesh("cpu", mesh_shape)
        x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        d = mt.distribute_tensor(x, mesh, src)
        d.redistribute(mesh, dst)  # plans and groups made once, outside the timing
        cpp, python = [], []
        for _ in range(repeats):
            world.barrier()
            cpp.append(_time_redistribute(d, dst, iterations) / iterations)
            world.barrier()
            start = time.perf_counter()
            for _ in range(iterations):
                d.redistribute(mesh, dst)
            python.append((time.perf_counter() - start) / iterations)
        rows.append({"case": f"{d.spec} -> {mt.plan(mesh_shape, src, dst, shape).to_dict()['to']} "
                             f"of {'x'.join(map(str, shape))} f32 on {'x'.join(map(str, mesh_shape))}",
                     "cpp_us": statistics.median(cpp) * 1e6,
                     "python_us": statistics.median(python) * 1e6})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = mt.run(lambda world: measure(world, args.iterations, args.repeats), ranks=args.ranks)
    if mt.under_mpirun() and mt.get_rank() != 0:
        return
    rows = results[0]
    backend = "mpi" if mt.under_mpirun() else "threads"
    for row in rows:
        row["ratio"] = row["python_us"] / row["cpp_us"]
        row["backend"] = backend
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return
    print(f"Python DTensor.redistribute vs the C++ call, {backend} backend, rank 0, "
          f"median per call over {args.repeats} x {args.iterations} calls")
    for row in rows:
        verdict = "ok" if row["ratio"] <= 2.0 else "over the 2x goal"
        print(f"  {row['case']:<40} C++ {row['cpp_us']:8.2f} us  Python {row['python_us']:8.2f} us"
              f"  ratio {row['ratio']:.2f} ({verdict})")


main()
