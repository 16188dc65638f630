"""Small helpers shared by op handlers: broadcasting, axes, attribute forms, and the
window attributes (kernel, strides, dilations, pads / auto_pad) Conv and the pools share."""

from __future__ import annotations

import math

import numpy as np

from ...dtypes import BY_ONNX, ONNX_OF_STORAGE
from ...errors import ShapeError
from ...ir.sym import SymbolicDimError, is_dim
from ..symbolic import assume_equal
from .registry import Unsupported


def broadcast_shapes(*shapes) -> tuple:
    """numpy broadcasting; a mismatch is a ShapeError."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = list(dict.fromkeys(s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0))
        dims = [d for d in dims if d != 1]
        if len(dims) > 1 and not any(is_dim(d) for d in dims):
            raise ShapeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        d = dims[0] if dims else 1
        for other in dims[1:]:      # symbolic sizes that must agree: checked at run time where not provable
            try:
                d = assume_equal(d, other, f"broadcast of {[tuple(map(str, s)) for s in shapes]} (dim {i})")
            except SymbolicDimError:
                raise ShapeError(f"shapes {[tuple(str(x) for x in s) for s in shapes]} do not broadcast") from None
        out.append(d)
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
        return [x if is_dim(x) else int(x) for x in np.asarray(v).reshape(-1)]
    if attr is not None and attr in node.attrs:
        v = node.attrs[attr]
        return [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
    return default


def require_float(ctx, node, x: str) -> None:
    """The op's kernels compute in f32: a tensor of another type is refused, naming the op."""
    if ctx.dtype(x) != "f32":
        raise Unsupported(f"{node.op} on non-float tensors")


def required_ints(ctx, node, index: int, message: str) -> list[int]:
    """const_ints of an input the op cannot do without; `message` says what is missing."""
    v = const_ints(ctx, node, index)
    if v is None:
        raise Unsupported(message)
    return v


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


# --- sliding windows (Conv and the pools read these attributes alike) ---------------

def window_pads(node, in_sp, kernel, strides, dilations):
    """Explicit begin/end pads from `pads` or `auto_pad`."""
    nd = len(in_sp)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(node.attr("pads", [0] * (2 * nd)))
        if len(pads) != 2 * nd:
            raise ShapeError(f"pads {pads} do not match {nd} spatial dims")
        if any(p < 0 or p >= (1 << 31) for p in pads):
            raise ShapeError(f"pads must be non-negative 32-bit integers, got {pads}")
        return pads
    if auto == "VALID":
        return [0] * (2 * nd)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise ShapeError(f"unknown auto_pad {auto!r}")
    begin, end = [], []
    for i, s, k, st, d in zip(range(nd), in_sp, kernel, strides, dilations):
        total = max((math.ceil(s / st) - 1) * st + (k - 1) * d + 1 - s, 0)
        small = total // 2
        begin.append(small if auto == "SAME_UPPER" else total - small)
        end.append(total - begin[-1])
    return begin + end


def window_out(in_sp, kernel, strides, dilations, pads, ceil_mode=False):
    """The output's spatial dims of a window sliding over `in_sp` (a window that does not fit is a ShapeError)."""
    nd = len(in_sp)
    out = []
    for i in range(nd):
        span = in_sp[i] + pads[i] + pads[nd + i] - dilations[i] * (kernel[i] - 1) - 1
        if ceil_mode:
            o = -(-span // strides[i]) + 1
            if (o - 1) * strides[i] >= in_sp[i] + pads[i]:
                o -= 1
        else:
            o = span // strides[i] + 1
        if o <= 0:
            raise ShapeError(f"window {kernel} with pads {pads} does not fit input {tuple(in_sp)}")
        out.append(o)
    return out


def check_positive(name, values, nd=None):
    """Strides, dilations and kernel sizes: one per spatial dim, each a positive 32-bit integer."""
    if nd is not None and len(values) != nd:
        raise ShapeError(f"{name} {list(values)} does not match {nd} spatial dims")
    if any(v <= 0 or v >= (1 << 31) for v in values):
        raise ShapeError(f"{name} must be positive 32-bit integers, got {list(values)}")
