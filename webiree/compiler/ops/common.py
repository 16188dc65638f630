"""Small helpers shared by op handlers: broadcasting, axes, attribute forms."""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from .registry import Unsupported


def broadcast_shapes(*shapes) -> tuple:
    """numpy broadcasting; a mismatch is a ShapeError."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def norm_axis(axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def const_ints(ctx, node, index: int, attr: str | None = None, default=None):
    """An int list given as a constant input (newer opsets) or an attribute (older)."""
    name = node.input(index)
    if name:
        v = ctx.const(name)
        if v is None:
            raise Unsupported(f"input {index} ({name}) must be a compile-time constant")
        return [int(x) for x in np.asarray(v).reshape(-1)]
    if attr is not None and attr in node.attrs:
        v = node.attrs[attr]
        return [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
    return default


def const_scalar(ctx, node, index: int, attr: str | None = None, default=None):
    name = node.input(index)
    if name:
        v = ctx.const(name)
        if v is None:
            return None
        return np.asarray(v).reshape(-1)[0].item()
    if attr is not None and attr in node.attrs:
        return node.attrs[attr]
    return default


ONNX_TO_INTERNAL = {1: "f32", 6: "i32", 7: "i32", 5: "i32", 3: "i32", 2: "i32", 4: "i32", 12: "u32", 13: "u32", 9: "bool"}


def onnx_type(ctx, name: str) -> int:
    """The ONNX element type of a tensor, as far as it is known (storage type otherwise)."""
    if name in ctx.graph.types:
        return ctx.graph.types[name].elem_type
    if name in ctx.onnx_types:
        return ctx.onnx_types[name]
    c = ctx.const(name)
    if c is not None:
        from onnx import helper
        return helper.np_dtype_to_tensor_dtype(np.asarray(c).dtype)
    return {"f32": 1, "i32": 6, "u32": 12, "bool": 9}[ctx.dtype(name)]


# ONNX integer type -> (bits, signed)
INT_BITS = {2: (8, False), 3: (8, True), 4: (16, False), 5: (16, True), 6: (32, True), 7: (64, True),
            12: (32, False), 13: (64, False)}
