"""Small helpers shared by op handlers: broadcasting, axes, attribute forms."""

from __future__ import annotations

import numpy as np

from ...dtypes import BY_ONNX, ONNX_OF_STORAGE
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
    return ONNX_OF_STORAGE[ctx.dtype(name)]


# ONNX integer type -> (bits, signed)
INT_BITS = {d.onnx: (d.bits, d.signed) for d in BY_ONNX.values() if d.numpy[-2] in "iu"}
