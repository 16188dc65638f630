"""More index maps (Generic ops): Trilu, EyeLike, OneHot, DepthToSpace,
SpaceToDepth, ReverseSequence, TensorScatter, GridSample; and the scatters
ScatterElements (and the old Scatter) and ScatterND.

Like shape.py's ops, each output element reads its inputs at computed
coordinates; indices read from tensors are clamped so a bad index can never
read outside a buffer. A scatter's output element folds over every update in
order (the Loop kind), so duplicate indices and the add/mul/max/min
reductions give exactly the sequential result.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import f32, select
from ...ir.program import coords_of, flat_of, numel
from ..graph import internal_dtype
from .registry import Unsupported, register
from .common import norm_axis, require_float
from .loops import emit_loop


@register("Trilu")
def trilu(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    if len(s) < 2:
        raise ShapeError(f"Trilu needs a rank >= 2 input, got {s}")
    upper = bool(node.attr("upper", 1))
    k = node.input(1)
    dt = ctx.dtype(x)

    def rule(cs):
        kk = kir.cast(ctx.read_flat(k, kir.i32(0)), "i32") if k else kir.i32(0)
        d = cs[-1] - cs[-2]
        keep = d >= kk if upper else d <= kk
        return select(keep, ctx.read(x, cs), kir.const(0, dt))
    ctx.generic(node.outputs[0], s, dt, rule)


@register("EyeLike")
def eye_like(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    if len(s) != 2:
        raise ShapeError(f"EyeLike needs a 2-D input, got {s}")
    to = node.attr("dtype")
    dt = internal_dtype(to) if to is not None else ctx.dtype(x)
    if dt is None:
        raise Unsupported(f"EyeLike to ONNX type {to}")
    if to is not None:
        ctx.onnx_types[node.outputs[0]] = to
    elif x in ctx.graph.types:
        ctx.onnx_types[node.outputs[0]] = ctx.graph.types[x].elem_type
    k = int(node.attr("k", 0))
    ctx.generic(node.outputs[0], s, dt,
                lambda cs: select(kir.binary("eq", cs[1] - cs[0], kir.i32(k)), kir.const(1, dt), kir.const(0, dt)))


@register("OneHot")
def one_hot(ctx, node):
    idx, depth_name, values = node.inputs[:3]
    depth = ctx.const(depth_name)
    if depth is None:
        raise Unsupported("depth must be a compile-time constant")
    depth = int(np.asarray(depth).reshape(-1)[0])
    js = list(ctx.shape(idx))
    axis = norm_axis(node.attr("axis", -1), len(js) + 1)
    out_shape = js[:axis] + [depth] + js[axis:]
    dt = ctx.dtype(values)

    def rule(cs):
        i = ctx.read(idx, cs[:axis] + cs[axis + 1:])
        i = kir.cast(kir.unary("trunc", i), "i32") if i.dtype == "f32" else kir.cast(i, "i32")
        i = select(i < 0, i + depth, i)
        on = kir.binary("eq", i, cs[axis])
        return select(on, ctx.read_flat(values, kir.i32(1)), ctx.read_flat(values, kir.i32(0)))
    ctx.generic(node.outputs[0], out_shape, dt, rule)


@register("DepthToSpace")
def depth_to_space(ctx, node):
    x = node.inputs[0]
    n, c, h, w = ctx.shape(x)
    b = int(node.attr("blocksize"))
    if c % (b * b):
        raise ShapeError(f"DepthToSpace channels {c} are not a multiple of blocksize² {b * b}")
    crd = node.attr("mode", "DCR") == "CRD"
    co = c // (b * b)

    def rule(cs):
        on, oc, oh, ow = cs
        i, j = oh % b, ow % b
        src_c = oc * (b * b) + i * b + j if crd else (i * b + j) * co + oc
        return ctx.read(x, [on, src_c, oh // b, ow // b])
    ctx.generic(node.outputs[0], [n, co, h * b, w * b], ctx.dtype(x), rule)


@register("SpaceToDepth")
def space_to_depth(ctx, node):
    x = node.inputs[0]
    n, c, h, w = ctx.shape(x)
    b = int(node.attr("blocksize"))
    if h % b or w % b:
        raise ShapeError(f"SpaceToDepth spatial dims {(h, w)} are not multiples of blocksize {b}")

    crd = node.attr("mode", "DCR") == "CRD"

    def rule(cs):
        on, oc, oh, ow = cs
        blk, ic = (oc % (b * b), oc // (b * b)) if crd else (oc // c, oc % c)
        return ctx.read(x, [on, ic, oh * b + blk // b, ow * b + blk % b])
    ctx.generic(node.outputs[0], [n, c * b * b, h // b, w // b], ctx.dtype(x), rule)


@register("ReverseSequence")
def reverse_sequence(ctx, node):
    x, lens = node.inputs[:2]
    s = ctx.shape(x)
    batch_axis, time_axis = int(node.attr("batch_axis", 1)), int(node.attr("time_axis", 0))

    def rule(cs):
        n = kir.cast(ctx.read(lens, [cs[batch_axis]]), "i32")
        t = cs[time_axis]
        src = list(cs)
        src[time_axis] = kir.clamp(select(t < n, n - 1 - t, t), 0, s[time_axis] - 1)
        return ctx.read(x, src)
    ctx.generic(node.outputs[0], s, ctx.dtype(x), rule)


@register("TensorScatter")
def tensor_scatter(ctx, node):
    cache, upd = node.inputs[:2]
    widx = node.input(2)
    cs_, us = ctx.shape(cache), ctx.shape(upd)
    axis = norm_axis(node.attr("axis", -2), len(cs_))
    circular = node.attr("mode", "linear") == "circular"
    max_len, seq = cs_[axis], us[axis]

    def rule(cs):
        start = kir.cast(ctx.read(widx, [cs[0]]), "i32") if widx else kir.i32(0)
        p = cs[axis]
        rel = p - start
        if circular:
            rel = ((rel % max_len) + max_len) % max_len
        hit = kir.binary("and", rel >= 0, rel < seq)
        src = list(cs)
        src[axis] = kir.clamp(rel, 0, seq - 1)
        return select(hit, ctx.read(upd, src), ctx.read(cache, cs))
    ctx.generic(node.outputs[0], cs_, ctx.dtype(cache), rule)


# --- scatters (the Loop kind) -----------------------------------------------------

def _norm_index(i, n):
    """An index that may be negative, made non-negative."""
    return select(i < 0, i + n, i)


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


# --- GridSample ----------------------------------------------------------------------

def _reflect(v, lo: float, hi: float):
    """Reflect a coordinate by the nearer border until it lies within [lo, hi]."""
    rng = hi - lo
    if rng <= 0:
        return f32(lo)

    def fold(dx, near, far):
        n = kir.unary("trunc", dx / rng)
        r = dx - n * rng
        even = kir.binary("eq", kir.unary("floor", n * 0.5) * 2.0, n)
        return select(even, near + r if near == lo else near - r, far - r if far == hi else far + r)
    below = fold(lo - v, lo, hi)       # n even: lo + r, else hi - r
    above = fold(v - hi, hi, lo)       # n even: hi - r, else lo + r
    return select(v < lo, below, select(v > hi, above, v))


@register("GridSample")
def grid_sample(ctx, node):
    x, grid = node.inputs[:2]
    xs, gs = ctx.shape(x), ctx.shape(grid)
    nd = len(xs) - 2
    if gs[-1] != nd or len(gs) != nd + 2:
        raise ShapeError(f"GridSample grid {gs} does not match input {xs}")
    require_float(ctx, node, x)
    mode = node.attr("mode", "linear" if ctx.opset >= 20 else "bilinear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    pad = node.attr("padding_mode", "zeros")
    align = bool(node.attr("align_corners", 0))
    dims = xs[2:]
    out_shape = [xs[0], xs[1]] + list(gs[1:-1])
    lo = [0.0 if align else -0.5 for _ in dims]
    hi = [d - 1.0 if align else d - 0.5 for d in dims]

    def pixel_index(i, a):
        """(clamped index, inside) of integer tap i (i32) on axis a under the padding mode."""
        d = dims[a]
        if pad == "zeros":
            return kir.clamp(i, 0, d - 1), kir.binary("and", i >= 0, i < d)
        if pad == "border":
            return kir.clamp(i, 0, d - 1), None
        r = kir.cast(kir.unary("trunc", _reflect(kir.cast(i, "f32"), lo[a], hi[a])), "i32")
        return kir.clamp(r, 0, d - 1), None

    def rule(cs):
        n, c, sp = cs[0], cs[1], cs[2:]
        coords = []
        for a in range(nd):
            g = ctx.read(grid, [n] + sp + [kir.i32(nd - 1 - a)])
            d = dims[a]
            v = (g + 1.0) * 0.5 * (d - 1) if align else ((g + 1.0) * d - 1.0) * 0.5
            if mode == "nearest":
                v = kir.unary("round", v)     # WGSL round: half to even, as np.rint
            outside = kir.binary("or", v < lo[a], v > hi[a])
            if pad == "border":
                v = select(outside, kir.clamp(v, 0.0, d - 1.0), v)
            elif pad == "reflection":
                v = select(outside, _reflect(v, lo[a], hi[a]), v)
            coords.append(v)
        if mode == "nearest":
            taps = [([], f32(1.0), None)]
            for a in range(nd):
                i, ok = pixel_index(kir.cast(kir.unary("trunc", coords[a]), "i32"), a)
                taps = [(c_ + [i], w, ok if okp is None else (okp if ok is None else kir.binary("and", okp, ok)))
                        for c_, w, okp in taps]
        else:
            taps = [([], f32(1.0), None)]
            for a in range(nd):
                fl = kir.unary("floor", coords[a])
                t = coords[a] - fl
                i0 = kir.cast(fl, "i32")
                if mode == "linear":
                    axis_taps = [(i0, 1.0 - t), (i0 + 1, t)]
                else:
                    axis_taps = list(zip([i0 - 1, i0, i0 + 1, i0 + 2], _cubic_coeffs(t)))
                new = []
                for c_, w, okp in taps:
                    for i, wa in axis_taps:
                        idx, ok = pixel_index(i, a)
                        both = ok if okp is None else (okp if ok is None else kir.binary("and", okp, ok))
                        new.append((c_ + [idx], w * wa, both))
                taps = new
        value = None
        for c_, w, ok in taps:
            v = ctx.read(x, [n, c] + c_)
            if ok is not None:
                v = select(ok, v, f32(0.0))
            term = v if (w.is_const and w.attr == 1.0) else v * w
            value = term if value is None else value + term
        return value
    ctx.generic(node.outputs[0], out_shape, "f32", rule)


def _cubic_coeffs(t):
    a = -0.75
    x1, x0, xm, x2 = t + 1.0, t, 1.0 - t, 2.0 - t
    return [((a * x1 - 5 * a) * x1 + 8 * a) * x1 - 4 * a,
            ((a + 2) * x0 - (a + 3)) * x0 * x0 + 1.0,
            ((a + 2) * xm - (a + 3)) * xm * xm + 1.0,
            ((a * x2 - 5 * a) * x2 + 8 * a) * x2 - 4 * a]

