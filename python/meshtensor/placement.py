"""Placements: how a tensor lives along one mesh dim (torch.distributed.tensor's names)."""

from ._meshtensor import InvalidArgument

_REDUCE_OPS = ("sum", "avg", "max", "min")


class Placement:
    """Base of Shard, Replicate and Partial."""

    __slots__ = ()

    def is_shard(self, dim=None):
        return False

    def is_replicate(self):
        return False

    def is_partial(self):
        return False


class Shard(Placement):
    """Split along tensor dim `dim` (negative: from the end) into torch.chunk-style pieces."""

    __slots__ = ("dim", "_text")

    def __init__(self, dim):
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise InvalidArgument(f"Shard dim must be an int, got {dim!r}")
        self.dim = dim
        self._text = f"S{dim}" if dim >= 0 else None  # spec token; negative dims need the rank

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    def _token(self, ndim):
        dim = self.dim + ndim if self.dim < 0 else self.dim
        if dim < 0:
            raise InvalidArgument(f"{self!r} is out of range for a {ndim}-d tensor")
        return f"S{dim}"

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash(("Shard", self.dim))

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate(Placement):
    """Every rank along the mesh dim holds the whole tensor."""

    __slots__ = ()
    _text = "R"

    def is_replicate(self):
        return True

    def _token(self, ndim):
        return "R"

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")

    def __repr__(self):
        return "Replicate()"


class Partial(Placement):
    """Pending contributions: the value is reduce_op (sum, avg, max, min) over the mesh dim."""

    __slots__ = ("reduce_op", "_text")

    def __init__(self, reduce_op="sum"):
        if reduce_op not in _REDUCE_OPS:
            raise InvalidArgument(
                f"Partial reduce_op must be one of {', '.join(_REDUCE_OPS)}, got {reduce_op!r}")
        self.reduce_op = reduce_op
        self._text = f"P({reduce_op})"

    def is_partial(self):
        return True

    def _token(self, ndim):
        return f"P({self.reduce_op})"

    def __eq__(self, other):
        return isinstance(other, Partial) and other.reduce_op == self.reduce_op

    def __hash__(self):
        return hash(("Partial", self.reduce_op))

    def __repr__(self):
        return f"Partial({self.reduce_op})"
