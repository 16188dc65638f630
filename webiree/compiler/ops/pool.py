"""The pooling family: MaxPool (with its Indices output), AveragePool, LpPool,
GlobalAveragePool, GlobalMaxPool, GlobalLpPool, MaxUnpool, RoiAlign.

Windowed pools lower to the Pool anchor and global pools to a Reduce over the
spatial dims. MaxPool's indices, MaxUnpool and RoiAlign's samples are folds
per output element: the Loop kind.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import f32, select
from ...ir.program import Pool, Reduce, flat_of, numel
from .registry import Unsupported, register
from .common import check_positive, const_ints, window_out, window_pads
from .loops import emit_loop, unflatten


def _pool(ctx, node, mode):
    x = node.inputs[0]
    xs = ctx.shape(x)
    nd = len(xs) - 2
    if nd < 1:
        raise ShapeError(f"{node.op} needs an N,C,spatial input, got {xs}")
    kernel = list(node.attr("kernel_shape", []))
    if len(kernel) != nd:
        raise ShapeError(f"kernel_shape {kernel} does not match {nd} spatial dims")
    strides = list(node.attr("strides", [1] * nd))
    dilations = list(node.attr("dilations", [1] * nd))
    check_positive("strides", strides, nd)
    check_positive("dilations", dilations, nd)
    check_positive("kernel_shape", kernel, nd)
    pads = window_pads(node, xs[2:], kernel, strides, dilations)
    out_sp = window_out(xs[2:], kernel, strides, dilations, pads, bool(node.attr("ceil_mode", 0)))
    out_shape = [xs[0], xs[1]] + out_sp
    whole = list(kernel) == list(xs[2:]) and not any(pads) and all(d == 1 for d in out_sp)
    if whole and mode in ("avg", "max") and ctx.dtype(x) == "f32" and not (len(node.outputs) > 1 and node.outputs[1]):
        # a window over the whole input is a global pool: a reduction over all of it, which the
        # workgroup tree splits among invocations (a window loop of 300 x 300 in one invocation
        # passes llvmpipe's loop limit)
        _global_reduce(ctx, node, x, "mean" if mode == "avg" else "max")
        return
    op = Pool(name=node.name, out=node.outputs[0], nodes=[node.name], x=ctx.buffer(x), mode=mode,
              x_shape=tuple(xs), out_shape=tuple(out_shape), kernel=tuple(kernel), strides=tuple(strides),
              dilations=tuple(dilations), pads=tuple(pads),
              count_include_pad=bool(node.attr("count_include_pad", 0)), p=float(node.attr("p", 2)))
    ctx.anchor(op, out_shape, ctx.dtype(x))
    if node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        _maxpool_indices(ctx, node, x, node.outputs[1], out_shape, kernel, strides, dilations, pads)


@register("MaxPool")
def maxpool(ctx, node):
    _pool(ctx, node, "max")


def _maxpool_indices(ctx, node, x, out, out_shape, kernel, strides, dilations, pads):
    """MaxPool's second output: the flat index (N, C and storage order included) of each maximum."""
    xs = ctx.shape(x)
    nd = len(xs) - 2
    in_sp = xs[2:]
    col_major = bool(node.attr("storage_order", 0))
    ksize = numel(kernel)

    def step(cs, k, accs):
        kc = unflatten(k, kernel)
        ok = kir.const(True, "bool")
        pos = []
        for i in range(nd):
            p = cs[2 + i] * strides[i] - pads[i] + kc[i] * dilations[i]
            ok = kir.binary("and", ok, kir.binary("and", p >= 0, p < in_sp[i]))
            pos.append(kir.clamp(p, 0, in_sp[i] - 1))
        v = ctx.read(x, [cs[0], cs[1]] + pos)
        take = kir.binary("and", ok, kir.binary("or", accs[1] < 0, v > accs[0]))
        if col_major:
            flat = i_flat = kir.i32(0)
            mult = 1
            for i in range(nd):
                i_flat = i_flat + pos[i] * mult
                mult *= in_sp[i]
            flat = (cs[0] * xs[1] + cs[1]) * numel(in_sp) + i_flat
        else:
            flat = flat_of([cs[0], cs[1]] + pos, xs)
        return [select(take, v, accs[0]), select(take, flat, accs[1])]
    emit_loop(ctx, out, out_shape, "i32", ksize, [ctx.dtype(x), "i32"],
              lambda cs: [kir.const(-math.inf, "f32") if ctx.dtype(x) == "f32" else kir.i32(-(1 << 31)), kir.i32(-1)],
              step, lambda cs, accs: accs[1])
    ctx.onnx_types[out] = 7


@register("AveragePool")
def avgpool(ctx, node):
    _pool(ctx, node, "avg")


@register("LpPool")
def lppool(ctx, node):
    _pool(ctx, node, "lp")


@register("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def global_pool(ctx, node):
    x = node.inputs[0]
    xs = ctx.shape(x)
    if len(xs) < 3:
        raise ShapeError(f"{node.op} needs an N,C,spatial input, got {xs}")
    mode = {"GlobalAveragePool": "mean", "GlobalMaxPool": "max", "GlobalLpPool": "lp"}[node.op]
    p = float(node.attr("p", 2))
    if mode == "lp":
        if p not in (1.0, 2.0):
            raise Unsupported(f"GlobalLpPool with p={p}")
        mode = "l1" if p == 1.0 else "l2"
    _global_reduce(ctx, node, x, mode)


def _global_reduce(ctx, node, x, mode):
    """out[n, c, 1, ...] = the reduction `mode` over all of x[n, c]'s spatial elements."""
    xs = ctx.shape(x)
    op = Reduce(name=node.name, out=node.outputs[0], nodes=[node.name], x=ctx.buffer(x), mode=mode,
                outer=xs[0] * xs[1], r=numel(xs[2:]), inner=1)
    ctx.anchor(op, list(xs[:2]) + [1] * (len(xs) - 2))


@register("MaxUnpool")
def max_unpool(ctx, node):
    x, idx = node.inputs[0], node.inputs[1]
    xs = ctx.shape(x)
    nd = len(xs) - 2
    kernel = list(node.attr("kernel_shape"))
    strides = list(node.attr("strides", [1] * nd))
    pads = list(node.attr("pads", [0] * (2 * nd)))
    out_sp = const_ints(ctx, node, 2)
    if node.input(2) and out_sp is None:
        raise Unsupported("output_shape must be a compile-time constant")
    inferred = [(xs[2 + i] - 1) * strides[i] - pads[i] - pads[nd + i] + kernel[i] for i in range(nd)]
    out_sp = inferred if out_sp is None else out_sp[-nd:]
    out_shape = [xs[0], xs[1]] + list(out_sp)
    in_shape = [xs[0], xs[1]] + inferred
    per_image = numel(xs[2:])

    # as the ONNX reference: indices address the inferred shape, a larger output_shape pads it with zeros
    def step(cs, k, accs):
        src = (cs[0] * xs[1] + cs[1]) * per_image + k
        inside = kir.const(True, "bool")
        for c, n in zip(cs[2:], inferred):
            inside = kir.binary("and", inside, c < n)
        hit = kir.binary("and", inside, kir.binary("eq", ctx.read_flat(idx, src), flat_of(cs, in_shape)))
        return [select(hit, ctx.read_flat(x, src), accs[0])]
    emit_loop(ctx, node.outputs[0], out_shape, ctx.dtype(x), per_image, [ctx.dtype(x)],
              lambda cs: [kir.const(0, ctx.dtype(x))], step)


@register("RoiAlign")
def roi_align(ctx, node):
    x, rois, bidx = node.inputs[:3]
    N, C, H, W = ctx.shape(x)
    R = ctx.shape(rois)[0]
    ph, pw = int(node.attr("output_height", 1)), int(node.attr("output_width", 1))
    sr = int(node.attr("sampling_ratio", 0))
    if sr <= 0:
        raise Unsupported("sampling_ratio=0 (the number of samples would depend on each ROI's size)")
    scale = float(node.attr("spatial_scale", 1.0))
    half = node.attr("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel") \
        == "half_pixel"
    is_max = node.attr("mode", "avg") == "max"

    def roi(cs, i):
        return ctx.read(rois, [cs[0], kir.i32(i)]) * scale - (0.5 if half else 0.0)

    def step(cs, k, accs):
        r, c, i, j = cs
        x0, y0, x1, y1 = (roi(cs, q) for q in range(4))
        rw, rh = x1 - x0, y1 - y0
        if not half:
            rw, rh = kir.maximum(rw, f32(1.0)), kir.maximum(rh, f32(1.0))
        bh, bw = rh / float(ph), rw / float(pw)
        iy, ix = k // sr, k % sr
        y = y0 + kir.cast(i, "f32") * bh + (kir.cast(iy, "f32") + 0.5) * bh / float(sr)
        xx = x0 + kir.cast(j, "f32") * bw + (kir.cast(ix, "f32") + 0.5) * bw / float(sr)
        outside = kir.binary("or", kir.binary("or", y < -1.0, y > float(H)), kir.binary("or", xx < -1.0, xx > float(W)))
        y, xx = kir.maximum(y, f32(0.0)), kir.maximum(xx, f32(0.0))
        ylo, xlo = kir.cast(kir.unary("trunc", y), "i32"), kir.cast(kir.unary("trunc", xx), "i32")
        ytop, xtop = ylo >= H - 1, xlo >= W - 1
        ylo, xlo = select(ytop, kir.i32(H - 1), ylo), select(xtop, kir.i32(W - 1), xlo)
        yhi, xhi = select(ytop, kir.i32(H - 1), ylo + 1), select(xtop, kir.i32(W - 1), xlo + 1)
        y, xx = select(ytop, kir.cast(ylo, "f32"), y), select(xtop, kir.cast(xlo, "f32"), xx)
        ly, lx = y - kir.cast(ylo, "f32"), xx - kir.cast(xlo, "f32")
        hy, hx = 1.0 - ly, 1.0 - lx
        n = kir.clamp(kir.cast(ctx.read(bidx, [r]), "i32"), 0, N - 1)
        taps = [(hy * hx, ylo, xlo), (hy * lx, ylo, xhi), (ly * hx, yhi, xlo), (ly * lx, yhi, xhi)]
        vals = [wt * ctx.read(x, [n, c, yy, xq]) for wt, yy, xq in taps]
        if is_max:
            v = kir.maximum(kir.maximum(vals[0], vals[1]), kir.maximum(vals[2], vals[3]))
            v = select(outside, f32(0.0), v)
            return [select(kir.binary("eq", k, kir.i32(0)), v, kir.maximum(accs[0], v))]
        v = vals[0] + vals[1] + vals[2] + vals[3]
        return [accs[0] + select(outside, f32(0.0), v)]
    result = (lambda cs, accs: accs[0]) if is_max else (lambda cs, accs: accs[0] * (1.0 / (sr * sr)))
    emit_loop(ctx, node.outputs[0], [R, C, ph, pw], "f32", sr * sr, ["f32"], lambda cs: [f32(0.0)], step, result)
