"""Redistribute plans as Python data."""

import json

from ._meshtensor import DeviceMesh, _plan


def _dtype_name(dtype):
    names = {"float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64",
             "int32": "i32", "uint8": "u8"}
    text = getattr(dtype, "__name__", None) or str(dtype)
    return names.get(text, text)


class Plan:
    """What a redistribute does: its steps (collectives on groups of mesh dims, local copies),
    the bytes each moves and the cost model's estimate. Pure data: nothing communicates."""

    def __init__(self, data, text):
        self._data = data
        self._text = text

    @property
    def steps(self):
        """The steps in execution order, as dicts (kind, group, group_names, op, before, after,
        bytes per rank, ...)."""
        return self._data["steps"]

    @property
    def collectives(self):
        """Number of communicating steps."""
        return self._data["collectives"]

    def to_dict(self):
        """The whole plan as a dict (what `meshtensor plan --json` prints)."""
        return json.loads(json.dumps(self._data))

    def explain(self):
        """A person-readable account, one line per step."""
        return self._text

    def __str__(self):
        return self._text

    def __repr__(self):
        return (f"Plan({self._data['from']} -> {self._data['to']} on {self._data['mesh']}, "
                f"{self.collectives} collectives)")


def plan(mesh, src, dst, shape, dtype="f32", *, mode="ordered", merge=True):
    """The plan of redistributing a tensor of `shape` and `dtype` on `mesh` (a DeviceMesh or its
    shape) from placements `src` to `dst` (lists of placements or spec text such as "S0,R")."""
    if not isinstance(mesh, DeviceMesh):
        mesh = DeviceMesh(mesh)
    data, text = _plan(mesh, src, dst, shape, _dtype_name(dtype), mode, merge)
    return Plan(json.loads(data), text)
