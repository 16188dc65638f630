"""Shape values: tensors computed from symbolic dims at compile time.

A model with a symbolic sequence length computes sizes in its graph: Shape ->
Gather -> Unsqueeze -> Concat -> Reshape, Range's limit, Expand's shape. With
static shapes these fold to constants; with symbolic dims they fold to a
`SymArray`, a small constant tensor whose elements are ints and `Dim`s
(ir/sym.py). An op that reads one as a size (Reshape, Expand, Slice, ...) gets
the Dims and carries them into its output shape; a kernel that reads one as
data gets its elements computed from the dims buffer (`read_value`), so shape
arithmetic never needs a readback and never a recompilation.

`fold` evaluates the shape-arithmetic ops on such values; an op it does not
know (or a value it cannot decide, such as `seq == 1`) goes to its handler,
whose kernel computes the value at run time.
"""

from __future__ import annotations

import contextvars

import numpy as np

from ..ir import kir
from ..ir.sym import Dim, SymbolicDimError, bounds, dmax, dmin, floordiv


class SymArray(np.ndarray):
    """An object array of ints and Dims with the ONNX value's integer dtype (`logical`)."""

    def __new__(cls, values, dtype=np.int64):
        obj = np.asarray(values, dtype=object).view(cls)
        obj.logical = np.dtype(dtype)
        return obj

    def __array_finalize__(self, obj):
        self.logical = getattr(obj, "logical", np.dtype(np.int64))


def _has_dim(a) -> bool:
    return any(isinstance(x, Dim) for x in np.asarray(a, dtype=object).reshape(-1))


def as_value(v, dtype=None):
    """A compile-time value: a SymArray where it holds a Dim, else a plain numpy array."""
    if isinstance(v, SymArray):
        if _has_dim(v):
            return v
        return np.asarray(v.astype(np.int64)).astype(v.logical)
    if isinstance(v, Dim) or (isinstance(v, (list, tuple)) and _has_dim(v)) or \
            (isinstance(v, np.ndarray) and v.dtype == object and _has_dim(v)):
        return SymArray(v, dtype or np.int64)
    return np.asarray(v, dtype=dtype) if dtype is not None else np.asarray(v)


def is_symbolic(c) -> bool:
    return isinstance(c, SymArray)


def value_dtype(c) -> np.dtype:
    return c.logical if isinstance(c, SymArray) else c.dtype


def as_shape(shape) -> tuple:
    return tuple(d if isinstance(d, Dim) else int(d) for d in shape)


def read_value(c: SymArray, flat: kir.Expr, dtype: str) -> kir.Expr:
    """Element `flat` of a shape value, as a kernel computes it (symbols from the dims buffer)."""
    elems = [kir.as_expr(e, "i32") if isinstance(e, Dim) else kir.i32(int(e)) for e in c.reshape(-1)]
    if dtype != "i32":
        elems = [kir.cast(e, dtype) for e in elems]
    value = elems[-1]
    for k in range(len(elems) - 2, -1, -1):
        value = kir.select(kir.binary("eq", flat, kir.i32(k)), elems[k], value)
    return value


# --- sizes that must be equal for the graph to make sense ---------------------------------

_CONSTRAINTS: contextvars.ContextVar = contextvars.ContextVar("webiree_size_constraints", default=None)


def collect_constraints():
    """Start collecting the run-time size checks of one lowering (returns the list and the token
    to reset with)."""
    found: list = []
    return found, _CONSTRAINTS.set(found)


def end_constraints(token) -> None:
    _CONSTRAINTS.reset(token)


def assume_equal(a, b, what: str):
    """a, where a and b must be equal sizes: decided by the bounds where they can be, else checked at
    run time (the module asserts it before any dispatch, naming `what`). Two different ints, or sizes
    the ranges keep apart, are a SymbolicDimError."""
    if a == b:
        return a
    if not isinstance(a, Dim) and not isinstance(b, Dim):
        raise SymbolicDimError(f"{what}: {a} != {b}")
    lo, hi = bounds(a - b)
    if lo > 0 or hi < 0:
        raise SymbolicDimError(f"{what}: {a} and {b} differ for every size in the declared ranges")
    found = _CONSTRAINTS.get()
    if found is None:
        raise SymbolicDimError(f"{what}: cannot tell whether {a} == {b}")
    if (a, b, what) not in found:
        found.append((a, b, what))
    return a if not isinstance(a, Dim) else b if not isinstance(b, Dim) else a


def _ints(v) -> list:
    return [x if isinstance(x, Dim) else int(x) for x in np.asarray(v).reshape(-1)]


def _eq(a, b):
    if a == b:
        return True
    if not isinstance(a, Dim) and not isinstance(b, Dim):
        return False
    lo, hi = bounds(a - b)
    if lo > 0 or hi < 0:
        return False
    raise SymbolicDimError(f"whether {a} == {b} depends on the input size")


def fold(node, args: list, ctx):
    """The node's outputs evaluated on shape values (a list), or None where it cannot be."""
    op = node.op
    a = args[0] if args else None
    try:
        if op == "Identity":
            return [a]
        if op == "Cast":
            to = np.dtype(onnx_np(node.attr("to")))
            return [SymArray(a, to)] if to.kind in "iu" else None
        if op == "Gather":
            idx = np.asarray(args[1])
            if idx.dtype == object:
                return None
            axis = node.attr("axis", 0)
            n = a.shape[axis]
            return [SymArray(np.take(a, np.where(idx < 0, idx + n, idx), axis=axis), value_dtype(a))]
        if op == "Concat":
            parts = [SymArray(x, value_dtype(a)) for x in args if x is not None]
            return [SymArray(np.concatenate(parts, axis=node.attr("axis", 0)), value_dtype(a))]
        if op in ("Unsqueeze", "Squeeze"):
            axes = node.attr("axes") if node.attr("axes") is not None else (
                [int(x) for x in args[1].reshape(-1)] if len(args) > 1 and args[1] is not None else None)
            if op == "Unsqueeze":
                out = a
                for ax in sorted(x + a.ndim + len(axes) if x < 0 else x for x in axes):
                    out = np.expand_dims(out, ax)
            else:
                out = np.squeeze(a, axis=tuple(axes) if axes is not None else None)
            return [SymArray(out, value_dtype(a))]
        if op == "Reshape":
            shape = np.asarray(args[1])
            if shape.dtype == object:
                return None
            shape = [a.shape[i] if s == 0 else int(s) for i, s in enumerate(shape.reshape(-1))]
            return [SymArray(np.reshape(a, shape), value_dtype(a))]
        if op == "Slice" and a.ndim == 1:
            starts, ends = _ints(args[1]), _ints(args[2])
            axes = _ints(args[3]) if len(args) > 3 and args[3] is not None else [0]
            steps = _ints(args[4]) if len(args) > 4 and args[4] is not None else [1]
            if axes not in ([0], [-1]) or any(isinstance(x, Dim) for x in starts + ends + steps):
                return None
            n = a.shape[0]
            st, en = max(min(starts[0], n), -n - 1), max(min(ends[0], n), -n - 1)
            return [SymArray(a[st:en:steps[0]], value_dtype(a))]
        if op in ("Add", "Sub", "Mul", "Div", "Min", "Max", "Neg", "Equal", "Where"):
            vals = [np.asarray(x, dtype=object) for x in args if x is not None]
            dt = value_dtype(args[1] if op == "Where" else a)
            if np.dtype(dt).kind not in "iub":
                return None
            if op == "Neg":
                return [SymArray(-vals[0], dt)]
            if op == "Where":
                cond = np.asarray(args[0])
                if cond.dtype == object:
                    return None
                return [SymArray(np.where(cond.astype(bool), vals[1], vals[2]), dt)]
            fn = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y,
                  "Div": floordiv, "Min": dmin, "Max": dmax, "Equal": _eq}[op]
            out = vals[0]
            for v in vals[1:]:
                out = np.frompyfunc(fn, 2, 1)(out, v)
            if op == "Equal":
                return [np.asarray(out, dtype=bool)]
            return [SymArray(np.asarray(out, dtype=object), dt)]
    except SymbolicDimError:
        return None
    return None


def onnx_np(elem_type: int):
    from onnx import helper
    return helper.tensor_dtype_to_np_dtype(elem_type)
