"""Ops along axes: Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax, Hardmax, TopK,
CumSum/CumProd.

Reductions and Softmax lower to an anchor that reduces the middle axis of an
[outer, R, inner] view; reductions over axes that are not contiguous first
move them together with a transpose (a Generic op). Hardmax, TopK (a rank
count per element) and the cumulative ops fold along their axis per output
element: the Loop kind.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import f32, select
from ...ir.program import Reduce, Softmax, numel
from .registry import Unsupported, register
from .common import const_ints, norm_axis, require_float, required_ints
from .loops import emit_loop


def split3(shape, first: int, last: int):
    """outer, R, inner of `shape` with axes [first, last) reduced."""
    return numel(shape[:first]), numel(shape[first:last]), numel(shape[last:])


@register("Softmax", "LogSoftmax")
def softmax(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    if ctx.opset < 13:
        axis = norm_axis(node.attr("axis", 1), len(s))
        outer, r, inner = split3(s, axis, len(s))
    else:
        axis = norm_axis(node.attr("axis", -1), len(s))
        outer, r, inner = split3(s, axis, axis + 1)
    op = Softmax(name=node.name, out=node.outputs[0], nodes=[node.name], x=ctx.buffer(x),
                 outer=outer, r=r, inner=inner, log=node.op == "LogSoftmax")
    ctx.anchor(op, s)


REDUCE_MODES = {
    "ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min", "ReduceProd": "prod",
    "ReduceL1": "l1", "ReduceL2": "l2", "ReduceLogSum": "logsum", "ReduceLogSumExp": "logsumexp",
    "ReduceSumSquare": "sumsquare", "ArgMax": "argmax", "ArgMin": "argmin",
}


@register(*REDUCE_MODES)
def reduce(ctx, node):
    x = node.inputs[0]
    s = list(ctx.shape(x))
    rank = len(s)
    mode = REDUCE_MODES[node.op]
    keep = node.attr("keepdims", 1)
    if mode in ("argmax", "argmin"):
        axes = [norm_axis(node.attr("axis", 0), rank)]
    else:
        uses_input = node.op == "ReduceSum" and ctx.opset >= 13 or ctx.opset >= 18
        axes = const_ints(ctx, node, 1) if uses_input else node.attr("axes")
        if uses_input and node.input(1) == "" and axes is None:
            axes = None
        if axes is None or len(axes) == 0:
            if node.attr("noop_with_empty_axes", 0):
                ctx.view(node.outputs[0], x, s)
                return
            axes = list(range(rank))
        axes = sorted({norm_axis(a, rank) for a in axes})
        if not axes:   # a scalar: nothing to reduce
            ctx.generic(node.outputs[0], s, ctx.dtype(x), lambda cs: ctx.read(x, cs))
            return
    dt = "i32" if mode in ("argmax", "argmin") else ctx.dtype(x)
    if ctx.dtype(x) == "bool" and mode in ("max", "min", "argmax", "argmin", "sum", "prod"):
        # reduce bools as 0/1 integers
        as_int = ctx.temp("as_int")
        ctx.generic(as_int, s, "i32", lambda cs: kir.cast(ctx.read(x, cs), "i32"))
        x = as_int
    elif ctx.dtype(x) != "f32" and mode not in ("sum", "max", "min", "prod", "argmax", "argmin"):
        raise Unsupported(f"{node.op} on {ctx.dtype(x)} tensors")
    out_keep = [1 if i in axes else d for i, d in enumerate(s)]
    out_shape = out_keep if keep else [d for i, d in enumerate(s) if i not in axes]
    red = emit_reduce(ctx, x, axes, mode, bool(node.attr("select_last_index", 0)))
    if mode in ("argmax", "argmin"):
        ctx.onnx_types[node.outputs[0]] = 7
    if dt == "bool":
        ctx.generic(node.outputs[0], out_shape, "bool",
                    # > 0, not != 0: an empty max (INT_MIN) is false, an empty min (INT_MAX) true
                    lambda cs: ctx.read(red, list(cs) if keep else _reinsert(cs, axes, rank)) > 0)
        return
    ctx.view(node.outputs[0], red, out_shape)


def emit_reduce(ctx, x: str, axes, mode: str, select_last: bool = False) -> str:
    """A Reduce of `x` over `axes` (any set); returns the result, with the reduced dims kept as 1."""
    s = list(ctx.shape(x))
    rank = len(s)
    axes = sorted(set(axes))
    out_keep = [1 if i in axes else d for i, d in enumerate(s)]
    src = x
    if axes != list(range(axes[0], axes[-1] + 1)):
        # gather the reduced axes at the end with a transpose
        perm = [i for i in range(rank) if i not in axes] + axes
        src = ctx.temp("moved")
        tshape = [s[p] for p in perm]

        def rule(cs, perm=perm):
            coords = [None] * rank
            for i, p in enumerate(perm):
                coords[p] = cs[i]
            return ctx.read(x, coords)
        ctx.generic(src, tshape, ctx.dtype(x), rule)
        outer, r, inner = split3(tshape, rank - len(axes), rank)
    else:
        outer, r, inner = split3(s, axes[0], axes[-1] + 1)
    op = Reduce(name=ctx.node.name, out=ctx.temp("red"), nodes=[ctx.node.name], x=ctx.buffer(src), mode=mode,
                outer=outer, r=r, inner=inner, select_last=select_last)
    ctx.anchor(op, out_keep, ctx.dtype(src) if mode not in ("argmax", "argmin") else "i32")
    return op.out


def _reinsert(cs, axes, rank):
    """Coordinates of a keepdims shape from those of the reduced shape."""
    it = iter(cs)
    return [kir.i32(0) if i in axes else next(it) for i in range(rank)]


# --- folds along an axis (the Loop kind) -------------------------------------------

@register("CumSum", "CumProd")
def cumulative(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    axis = required_ints(ctx, node, 1, "the axis must be a compile-time constant")
    axis = norm_axis(axis[0], len(s))
    dt = ctx.dtype(x)
    if dt == "bool":
        raise Unsupported(f"{node.op} on bool tensors")
    exclusive, reverse = bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0))
    n = s[axis]
    prod = node.op == "CumProd"
    ident = kir.const(1 if prod else 0, dt)

    def step(cs, k, accs):
        i = cs[axis]
        take = (k > i if exclusive else k >= i) if reverse else (k < i if exclusive else k <= i)
        v = ctx.read(x, cs[:axis] + [k] + cs[axis + 1:])
        return [select(take, accs[0] * v if prod else accs[0] + v, accs[0])]
    emit_loop(ctx, node.outputs[0], s, dt, n, [dt], lambda cs: [ident], step)


def _better(a, b, ia, ib, largest: bool):
    """a (at index ia) ranks before b (at index ib): larger (or smaller), ties to the lower index."""
    strictly = a > b if largest else a < b
    if a.dtype == "f32":   # NaN ranks as the largest value
        strictly = select(kir.unary("isnan", a), kir.binary("and", kir.unary("not", kir.unary("isnan", b)),
                                                             kir.const(largest, "bool")),
                          select(kir.unary("isnan", b), kir.const(not largest, "bool"), strictly))
    same = kir.binary("or", kir.binary("eq", a, b),
                      kir.binary("and", kir.unary("isnan", a), kir.unary("isnan", b))) \
        if a.dtype == "f32" else kir.binary("eq", a, b)
    return kir.binary("or", strictly, kir.binary("and", same, ia < ib))


@register("TopK")
def topk(ctx, node):
    x = node.inputs[0]
    s = list(ctx.shape(x))
    axis = norm_axis(node.attr("axis", -1), len(s))
    if ctx.opset < 10:
        k = node.attr("k")
    else:
        k = required_ints(ctx, node, 1, "k must be a compile-time constant")
        k = k[0]
    n = s[axis]
    if not 0 <= k <= n:
        raise ShapeError(f"TopK k={k} is outside 0..{n}")
    largest = bool(node.attr("largest", 1))
    dt = ctx.dtype(x)
    if dt == "bool":
        raise Unsupported("TopK on bool tensors")
    rank = ctx.temp("rank")

    def rank_step(cs, j, accs):
        i = cs[axis]
        other = ctx.read(x, cs[:axis] + [j] + cs[axis + 1:])
        return [accs[0] + kir.cast(_better(other, ctx.read(x, cs), j, i, largest), "i32")]
    emit_loop(ctx, rank, s, "i32", n, ["i32"], lambda cs: [kir.i32(0)], rank_step)
    out_shape = s[:axis] + [k] + s[axis + 1:]
    values, indices = (node.outputs + ["", ""])[:2]
    for out, want in ((values, "value"), (indices, "index")):
        if not out:
            continue
        odt = dt if want == "value" else "i32"

        def pick(cs, j, accs, want=want):
            src = cs[:axis] + [j] + cs[axis + 1:]
            hit = kir.binary("eq", ctx.read(rank, src), cs[axis])
            return [select(hit, ctx.read(x, src) if want == "value" else j, accs[0])]
        emit_loop(ctx, out, out_shape, odt, n, [odt], lambda cs, odt=odt: [kir.const(0, odt)], pick)
    if indices:
        ctx.onnx_types[indices] = 7


@register("Hardmax")
def hardmax(ctx, node):
    x = node.inputs[0]
    s = list(ctx.shape(x))
    require_float(ctx, node, x)
    if ctx.opset < 13:   # the input is coerced to 2-D at `axis`
        axis = norm_axis(node.attr("axis", 1), len(s))
        view = [numel(s[:axis]), numel(s[axis:])]
        src = ctx.temp("2d")
        ctx.view(src, x, view)
        tmp = ctx.temp("hard2d")
        _hardmax(ctx, src, view, 1, tmp)
        ctx.view(node.outputs[0], tmp, s)
        return
    axis = norm_axis(node.attr("axis", -1), len(s))
    _hardmax(ctx, x, s, axis, node.outputs[0])


def _hardmax(ctx, x, s, axis, out):
    n = s[axis]

    def step(cs, j, accs):
        v = ctx.read(x, cs[:axis] + [j] + cs[axis + 1:])
        take = kir.binary("or", accs[1] < 0, v > accs[0])
        return [select(take, v, accs[0]), select(take, j, accs[1])]

    def result(cs, accs):
        return select(kir.binary("eq", accs[1], cs[axis]), f32(1.0), f32(0.0))
    emit_loop(ctx, out, s, "f32", n, ["f32", "i32"], lambda cs: [f32(0.0), kir.i32(-1)], step, result)
