"""meshtensor: SPMD tensors sharded over an N-d device mesh.

The names follow torch.distributed.tensor where the concept is the same:

    import numpy as np
    import meshtensor as mt
    from meshtensor import Shard, Replicate

    def main(world):
        mesh = mt.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        x = np.arange(35, dtype=np.float32).reshape(7, 5)
        d = mt.distribute_tensor(x, mesh, [Shard(0), Replicate()])
        r = d.redistribute(mesh, [Replicate(), Shard(1)])
        assert (r.full_tensor() == x).all()

    mt.run(main, ranks=4)   # 4 threads here; under `mpirun -np 4 python3 ...` 4 processes

Every DTensor operation and collective is SPMD: every rank makes the same calls in the same order.
"""

import atexit as _atexit
import ctypes as _ctypes
import os as _os


def _load_mpi_globally():
    # OpenMPI opens its components with dlopen, and they resolve symbols of libmpi that a Python
    # extension's own (local) load does not make visible; load it globally first.
    if not ("OMPI_COMM_WORLD_SIZE" in _os.environ or "PMIX_RANK" in _os.environ):
        return
    for name in ("libmpi.so.40", "libmpi.so"):
        try:
            _ctypes.CDLL(name, mode=_ctypes.RTLD_GLOBAL)
            return
        except OSError:
            pass


_load_mpi_globally()

from ._meshtensor import (  # noqa: E402
    AdamW,
    CommDebugMode,
    ArgumentTypeError,
    CommError,
    Communicator,
    DataError,
    Dataset,
    DesyncError,
    DeviceMesh,
    DTensor,
    Error,
    GPT,
    InvalidArgument,
    MLP,
    Model,
    Optimizer,
    ParseError,
    ResourceError,
    SGD,
    Text,
    TimeoutError,
    check,
    contribution,
    cross_entropy,
    digest,
    distribute_tensor,
    epoch_order,
    fully_shard,
    generate,
    get_world,
    init_device_mesh,
    load_checkpoint,
    load_dataset,
    load_text,
    local_layout,
    ops,
    lr_at,
    parse_placements,
    replicate,
    release_cached_storage,
    rl,
    run_mpi,
    run_threads,
    save_checkpoint,
    train,
    under_mpirun,
)
from . import _meshtensor  # noqa: E402
from ._meshtensor import _finalize_mpi  # noqa: E402
from ._arguments import name_arguments as _name_arguments  # noqa: E402
from .placement import Partial, Placement, Replicate, Shard  # noqa: E402
from .plan import Plan, plan  # noqa: E402

__version__ = "0.1.0"

_name_arguments(globals(), _meshtensor, ArgumentTypeError)
_name_arguments(vars(ops), _meshtensor, ArgumentTypeError, prefix="ops.")

_atexit.register(_finalize_mpi)


def run(fn, ranks=1, *, link=None):
    """Runs fn(world) on every rank and returns the results of the ranks in this process.

    Under mpirun each process is one rank of the mpi backend (`ranks` is then the job's size,
    whatever is passed); otherwise `ranks` threads of this process run the threads backend.
    """
    if under_mpirun():
        return [run_mpi(fn)]
    return run_threads(ranks, fn, link=link)


def get_rank():
    """The calling rank's position in its world."""
    return get_world().rank


def get_world_size():
    """The number of ranks in the calling rank's world."""
    return get_world().size


__all__ = [
    "AdamW", "ArgumentTypeError", "CommDebugMode", "CommError", "Communicator", "DataError", "Dataset", "DesyncError", "DeviceMesh",
    "DTensor", "Error", "GPT", "InvalidArgument", "MLP", "Model", "Optimizer", "ParseError", "Partial", "Placement",
    "Plan", "Replicate", "ResourceError", "SGD", "Shard", "Text", "TimeoutError", "check", "contribution",
    "cross_entropy", "digest", "distribute_tensor", "epoch_order", "fully_shard", "generate", "get_rank",
    "get_world", "get_world_size", "init_device_mesh", "load_checkpoint", "load_dataset", "load_text",
    "local_layout", "lr_at", "ops", "parse_placements", "plan", "release_cached_storage", "replicate",
    "rl", "run", "run_mpi", "run_threads", "save_checkpoint", "train", "under_mpirun",
]
