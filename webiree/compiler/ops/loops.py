"""Ops whose output elements are sequential folds: they lower to the `Loop`
kind (ir/program.py), one invocation per output element.

CumSum, CumProd, ScatterElements (and the old Scatter), ScatterND, TopK,
Hardmax, DFT, STFT, Einsum (a sum over the contracted letters); `emit_loop`
and `unflatten` also serve ConvTranspose, Col2Im, DeformConv (conv.py),
MaxPool's Indices output, MaxUnpool and RoiAlign (pool.py). Scatters fold
over every update in order, so duplicate indices and the add/mul/max/min
reductions give exactly the sequential result.

These kernels favour generality over speed (a scatter costs outputs x
updates, Einsum does not tile): the common fast paths (MatMul, Conv, Pool,
Reduce) keep their own kinds.
"""

from __future__ import annotations

import math

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import f32, select
from ...ir.program import O, coords_of, flat_of, numel
from ...ir.program import LOOP_K, Loop, acc_vars
from .registry import Unsupported, register
from .common import const_ints, const_scalar, norm_axis


def emit_loop(ctx, out: str, shape, dtype: str, count: int, dtypes, inits, step, result=None) -> None:
    """out[c] = result(c, accs) after folding `step(c, k, accs)` for k < count.

    inits(coords) -> [Expr]; step(coords, k, accs) -> [Expr] (new accumulator values);
    result(coords, accs) -> Expr (default: the first accumulator)."""
    shape = tuple(int(d) for d in shape)
    cs = coords_of(O, shape)
    accs = acc_vars(dtypes)
    res = result(cs, accs) if result is not None else accs[0]
    if res.dtype != dtype:
        res = kir.cast(res, dtype)
    op = Loop(name=ctx.node.name, out=out, nodes=[ctx.node.name], count=int(count), dtypes=list(dtypes),
              inits=list(inits(cs)), updates=list(step(cs, LOOP_K, accs)), result=res)
    ctx.anchor(op, shape, dtype)


def _norm_index(i, n):
    """An index that may be negative, made non-negative."""
    return select(i < 0, i + n, i)


# --- cumulative ops ------------------------------------------------------------

@register("CumSum", "CumProd")
def cumulative(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    axis = const_ints(ctx, node, 1)
    if axis is None:
        raise Unsupported("the axis must be a compile-time constant")
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


# --- scatters --------------------------------------------------------------------

def _combine(reduction: str, acc, v):
    if reduction == "none":
        return v
    if reduction == "add":
        return acc + v
    if reduction == "mul":
        return acc * v
    if reduction == "max":
        return kir.maximum(acc, v) if acc.dtype != "f32" else select(v > acc, v, acc)
    if reduction == "min":
        return kir.minimum(acc, v) if acc.dtype != "f32" else select(v < acc, v, acc)
    raise Unsupported(f"reduction {reduction!r}")


@register("ScatterElements", "Scatter")
def scatter_elements(ctx, node):
    data, idx, upd = node.inputs[:3]
    ds, js = ctx.shape(data), ctx.shape(idx)
    if len(ds) != len(js) or tuple(ctx.shape(upd)) != tuple(js):
        raise ShapeError(f"{node.op} data {ds}, indices {js} and updates {ctx.shape(upd)} do not match")
    axis = norm_axis(node.attr("axis", 0), len(ds))
    reduction = node.attr("reduction", "none")
    dt = ctx.dtype(data)
    n = ds[axis]

    def step(cs, k, accs):
        kc = coords_of(k, js)
        target = list(kc)
        target[axis] = _norm_index(ctx.read_flat(idx, k), n)
        hit = kir.binary("eq", flat_of(target, ds), flat_of(cs, ds))
        return [select(hit, _combine(reduction, accs[0], ctx.read_flat(upd, k)), accs[0])]
    emit_loop(ctx, node.outputs[0], ds, dt, numel(js), [dt], lambda cs: [ctx.read(data, cs)], step)


@register("ScatterND")
def scatter_nd(ctx, node):
    data, idx, upd = node.inputs[:3]
    ds, js, us = ctx.shape(data), ctx.shape(idx), ctx.shape(upd)
    q = js[-1]
    if tuple(us) != tuple(js[:-1]) + tuple(ds[q:]):
        raise ShapeError(f"ScatterND updates {us} do not match indices {js} and data {ds}")
    reduction = node.attr("reduction", "none")
    dt = ctx.dtype(data)
    slice_n = numel(ds[q:])

    def step(cs, k, accs):
        pos, rest = (k // slice_n, k % slice_n) if slice_n > 1 else (k, kir.i32(0))
        target = [_norm_index(ctx.read_flat(idx, pos * q + j), ds[j]) for j in range(q)]
        target += coords_of(rest, ds[q:]) if slice_n > 1 else [kir.i32(0)] * (len(ds) - q)
        hit = kir.binary("eq", flat_of(target, ds), flat_of(cs, ds))
        return [select(hit, _combine(reduction, accs[0], ctx.read_flat(upd, k)), accs[0])]
    emit_loop(ctx, node.outputs[0], ds, dt, numel(us), [dt], lambda cs: [ctx.read(data, cs)], step)


# --- ranking -----------------------------------------------------------------------

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
        k = const_ints(ctx, node, 1)
        if k is None:
            raise Unsupported("k must be a compile-time constant")
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
    if ctx.dtype(x) != "f32":
        raise Unsupported("Hardmax on non-float tensors")
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


# --- shared by the window folds -------------------------------------------------

def unflatten(k, dims):
    """Coordinates of a flat index k over `dims` (any dims, 1s included)."""
    out, rest = [], k
    for d in reversed(dims):
        out.append(rest % d if d > 1 else kir.i32(0))
        rest = rest // d if d > 1 else rest
    return out[::-1]


# --- DFT ---------------------------------------------------------------------------

@register("DFT")
def dft(ctx, node):
    x = node.inputs[0]
    s = list(ctx.shape(x))
    if ctx.dtype(x) != "f32":
        raise Unsupported("DFT on non-float tensors")
    if ctx.opset < 20:
        axis = node.attr("axis", 1)
    else:
        a = const_ints(ctx, node, 2)
        axis = a[0] if a is not None else (-2 if node.input(2) == "" else None)
        if axis is None:
            raise Unsupported("the axis must be a compile-time constant")
    axis = axis + len(s) if axis < 0 else axis
    if not 0 < axis < len(s) - 1:
        raise ShapeError(f"DFT axis {axis} is not a signal axis of {tuple(s)}")
    n_in = s[axis]
    length = const_scalar(ctx, node, 1)
    if node.input(1) and length is None:
        raise Unsupported("dft_length must be a compile-time constant")
    n = int(length) if length is not None else n_in
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    complex_in = s[-1] == 2
    if inverse and onesided:
        # the input is the first n//2+1 bins of a Hermitian spectrum; the output is real
        n = int(length) if length is not None else 2 * (n_in - 1)
        out_shape = s[:-1] + [1]
        out_shape[axis] = n
    else:
        n = int(length) if length is not None else n_in
        n_out = n // 2 + 1 if onesided else n
        out_shape = s[:-1] + [2]
        out_shape[axis] = n_out
    sign = 1.0 if inverse else -1.0
    hermitian = inverse and onesided

    def step(cs, j, accs):
        m = (cs[axis] * j) % n            # the twiddle exp(sign 2 pi i m / n)
        c, sn = _twiddle(m, n, sign)
        base = cs[:-1]
        if hermitian:   # bin j of the full spectrum: X[j], or conj(X[n - j]) past the stored half
            stored = j < n_in
            jj = kir.clamp(select(stored, j, n - j), 0, n_in - 1)
            inside = kir.binary("or", stored, n - j < n_in)
            conj = select(stored, f32(1.0), f32(-1.0))
        else:
            inside = j < n_in
            jj = kir.clamp(j, 0, n_in - 1)
            conj = f32(1.0)
        base = base[:axis] + [jj] + base[axis + 1:]
        re = select(inside, ctx.read(x, base + [kir.i32(0)]), f32(0.0))
        im = select(inside, ctx.read(x, base + [kir.i32(1)]) * conj, f32(0.0)) if complex_in else f32(0.0)
        return [accs[0] + re * c - im * sn, accs[1] + re * sn + im * c]

    def result(cs, accs):
        v = accs[0] if hermitian else select(kir.binary("eq", cs[-1], kir.i32(0)), accs[0], accs[1])
        return v * (1.0 / n) if inverse else v
    emit_loop(ctx, node.outputs[0], out_shape, "f32", n, ["f32", "f32"], lambda cs: [f32(0.0), f32(0.0)],
              step, result)


def _twiddle(m, n: int, sign: float):
    """(cos, sin) of sign * 2 pi m / n for an integer 0 <= m < n, exact at multiples of pi/2."""
    q4 = m * 4
    exact = kir.binary("eq", q4 % n, kir.i32(0))
    q = q4 // n
    ce = select(kir.binary("eq", q, kir.i32(0)), f32(1.0), select(kir.binary("eq", q, kir.i32(2)), f32(-1.0), f32(0.0)))
    se = select(kir.binary("eq", q, kir.i32(1)), f32(sign), select(kir.binary("eq", q, kir.i32(3)), f32(-sign), f32(0.0)))
    centered = select(m * 2 > n, m - n, m)          # the angle in [-pi, pi]: accurate sin/cos
    ang = kir.cast(centered, "f32") * (sign * 2.0 * math.pi / n)
    return select(exact, ce, kir.unary("cos", ang)), select(exact, se, kir.unary("sin", ang))


@register("STFT")
def stft(ctx, node):
    x = node.inputs[0]
    step_c, window, length_c = const_scalar(ctx, node, 1), node.input(2), const_scalar(ctx, node, 3)
    if step_c is None or (node.input(3) and length_c is None):
        raise Unsupported("frame_step and frame_length must be compile-time constants")
    xs = ctx.shape(x)
    if ctx.dtype(x) != "f32":
        raise Unsupported("STFT on non-float tensors")
    frame_len = int(length_c) if length_c is not None else ctx.shape(window)[0]
    hop = int(step_c)
    onesided = bool(node.attr("onesided", 1))
    complex_in = xs[-1] == 2
    frames = (xs[1] - frame_len) // hop + 1
    bins = frame_len // 2 + 1 if onesided else frame_len
    out_shape = [xs[0], frames, bins, 2]

    def step(cs, j, accs):
        b, f, kb = cs[0], cs[1], cs[2]
        c, sn = _twiddle((kb * j) % frame_len, frame_len, -1.0)
        pos = f * hop + j
        wv = ctx.read(window, [j]) if window else f32(1.0)
        re = ctx.read(x, [b, pos, kir.i32(0)]) * wv
        im = ctx.read(x, [b, pos, kir.i32(1)]) * wv if complex_in else f32(0.0)
        return [accs[0] + re * c - im * sn, accs[1] + re * sn + im * c]
    emit_loop(ctx, node.outputs[0], out_shape, "f32", frame_len, ["f32", "f32"], lambda cs: [f32(0.0), f32(0.0)],
              step, lambda cs, accs: select(kir.binary("eq", cs[3], kir.i32(0)), accs[0], accs[1]))


# --- Einsum ------------------------------------------------------------------------------

@register("Einsum")
def einsum(ctx, node):
    """out[free letters] = sum over the other letters of the product of the operands."""
    eq = node.attr("equation").replace(" ", "")
    names = [i for i in node.inputs if i]
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(names):
        raise ShapeError(f"Einsum equation {eq!r} has {len(terms)} operands, the node {len(names)}")
    shapes = [list(ctx.shape(n)) for n in names]
    ks = [len(s) - (len(t) - 3) if "..." in t else 0 for t, s in zip(terms, shapes)]
    E = max(ks, default=0)

    def letters_of(t, k):
        if "..." not in t:
            return list(t)
        i = t.index("...")
        # ellipsis dims are aligned on the right (broadcast), named by their position among E
        return list(t[:i]) + [f"...{E - k + j}" for j in range(k)] + list(t[i + 3:])
    dims: dict = {}
    expanded = []
    for t, s, k in zip(terms, shapes, ks):
        letters = letters_of(t, k)
        if len(letters) != len(s):
            raise ShapeError(f"Einsum term {t!r} does not match operand shape {tuple(s)}")
        for l, d in zip(letters, s):
            if dims.get(l, 1) not in (1, d) and d != 1:
                raise ShapeError(f"Einsum letter {l!r} has sizes {dims[l]} and {d}")
            dims[l] = max(dims.get(l, 1), d)
        expanded.append(letters)
    ell = [f"...{j}" for j in range(E)]
    if arrow:
        out_letters = letters_of(rhs, E) if "..." in rhs else list(rhs)
    else:   # implicit output: the ellipsis, then the letters used once, in alphabetical order
        once = sorted(l for l in dims if not l.startswith("...") and sum(e.count(l) for e in expanded) == 1)
        out_letters = ell + once
    summed = [l for l in dims if l not in out_letters]
    out_shape = [dims[l] for l in out_letters]
    dt = ctx.dtype(names[0])

    def step(cs, k, accs):
        val = dict(zip(out_letters, cs))
        val.update(zip(summed, unflatten(k, [dims[l] for l in summed])))
        prod = None
        for letters, n, s in zip(expanded, names, shapes):
            v = ctx.read(n, [val[l] if d != 1 else kir.i32(0) for l, d in zip(letters, s)])
            prod = v if prod is None else prod * v
        return [accs[0] + prod]
    emit_loop(ctx, node.outputs[0], out_shape, dt, numel([dims[l] for l in summed]), [dt],
              lambda cs: [kir.const(0, dt)], step)


__all__ = ["emit_loop", "unflatten"]
