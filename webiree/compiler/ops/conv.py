"""The convolution family: Conv, ConvTranspose, Col2Im, DeformConv.

Conv lowers to the Conv anchor (a pointwise Conv to a MatMul); its bias
becomes a broadcasting Generic add that fusion folds into the epilogue. (A
zero Pad feeding a Conv becomes the Conv's own pads in a pass after lowering:
passes.fold_pad_into_conv.) ConvTranspose, Col2Im and DeformConv sum over the
input positions that reach each output element: the Loop kind.
(ConvInteger and QLinearConv are quant.py's: they lower to a Conv node, or, pointwise, to an
integer product; so does a pointwise Conv of two DequantizeLinears: quant.qdq_conv.)
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import f32, select
from ...ir.program import Conv, MatMul, flat_of, numel
from .registry import Unsupported, register
from .common import check_positive, const_ints, require_float, window_out, window_pads
from .loops import emit_loop, unflatten
from .quant import qdq_conv


@register("Conv")
def conv(ctx, node):
    x, w = node.inputs[0], node.inputs[1]
    xs, ws = ctx.shape(x), ctx.shape(w)
    if len(xs) < 3 or len(ws) != len(xs):
        raise ShapeError(f"Conv input {xs} and weight {ws} ranks do not match")
    require_float(ctx, node, x)
    if qdq_conv(ctx, node):
        return
    nd = len(xs) - 2
    kernel = list(node.attr("kernel_shape", ws[2:]))
    strides = list(node.attr("strides", [1] * nd))
    dilations = list(node.attr("dilations", [1] * nd))
    group = int(node.attr("group", 1))
    check_positive("strides", strides, nd)
    check_positive("dilations", dilations, nd)
    check_positive("kernel_shape", kernel, nd)
    if list(kernel) != list(ws[2:]):
        raise ShapeError(f"kernel_shape {kernel} differs from the weight's spatial dims {tuple(ws[2:])}")
    if group <= 0 or xs[1] % group or ws[0] % group or ws[1] * group != xs[1]:
        raise ShapeError(f"Conv group {group} does not divide channels: input {xs}, weight {ws}")
    pads = window_pads(node, xs[2:], kernel, strides, dilations)
    out_sp = window_out(xs[2:], kernel, strides, dilations, pads)
    out_shape = [xs[0], ws[0]] + out_sp
    b = node.input(2)
    out = node.outputs[0] if not b else ctx.temp("conv")
    if group == 1 and all(k == 1 for k in kernel) and all(s == 1 for s in strides) and not any(pads):
        # a pointwise conv is a matrix product: W[M, C] @ X[n][C, H*W] for every image n
        w2 = ctx.temp("w2d")
        wc = ctx.const(w)
        if wc is not None:
            ctx.set_const(w2, wc.reshape(ws[0], ws[1]))
        else:
            ctx.view(w2, w, (ws[0], ws[1]))
        P = numel(out_sp)
        op = MatMul(name=node.name, out=out, nodes=[node.name], a=ctx.buffer(w2), b=ctx.buffer(x),
                    batch=(xs[0],), a_batch=(), b_batch=(xs[0],), m=ws[0], n=P, k=ws[1])
        ctx.anchor(op, out_shape)
    else:
        op = Conv(name=node.name, out=out, nodes=[node.name], x=ctx.buffer(x), w=ctx.buffer(w),
                  x_shape=tuple(xs), w_shape=tuple(ws), out_shape=tuple(out_shape), strides=tuple(strides),
                  dilations=tuple(dilations), pads=tuple(pads), group=group)
        ctx.anchor(op, out_shape)
    if b:
        ctx.generic(node.outputs[0], out_shape, "f32",
                    lambda cs: ctx.read(out, cs) + ctx.read(b, [cs[1]]))


@register("ConvTranspose")
def conv_transpose(ctx, node):
    x, w = node.inputs[0], node.inputs[1]
    b = node.input(2)
    xs, ws = ctx.shape(x), ctx.shape(w)
    require_float(ctx, node, x)
    nd = len(xs) - 2
    group = int(node.attr("group", 1))
    kernel = list(node.attr("kernel_shape", ws[2:]))
    strides = list(node.attr("strides", [1] * nd))
    dil = list(node.attr("dilations", [1] * nd))
    out_pad = list(node.attr("output_padding", [0] * nd))
    auto = node.attr("auto_pad", "NOTSET")
    pads = node.attr("pads")
    out_sp = node.attr("output_shape")
    if out_sp is not None and len(out_sp) > nd:
        out_sp = out_sp[-nd:]
    C, M = xs[1], ws[1] * group
    if C != ws[0] or C % group:
        raise ShapeError(f"ConvTranspose input {xs} and weight {ws} do not match (group {group})")
    if pads is None and auto in ("SAME_UPPER", "SAME_LOWER") or out_sp is not None:
        if out_sp is None:
            out_sp = [xs[2 + i] * strides[i] for i in range(nd)]
        total = [strides[i] * (xs[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - out_sp[i]
                 for i in range(nd)]
        if auto == "SAME_UPPER":
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            pads = [t - t // 2 for t in total] + [t // 2 for t in total]
    else:
        pads = list(pads or [0] * (2 * nd))
        out_sp = [strides[i] * (xs[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - pads[i] - pads[nd + i]
                  for i in range(nd)]
    out_shape = [xs[0], M] + list(out_sp)
    Cg, Mg = C // group, M // group
    ksize = numel(kernel)

    def step(cs, k, accs):
        n, m, ys = cs[0], cs[1], cs[2:]
        c_local, kk = (k // ksize, k % ksize) if ksize > 1 else (k, kir.i32(0))
        kc = unflatten(kk, kernel)
        g = m // Mg if group > 1 else kir.i32(0)
        c = g * Cg + c_local
        ok = kir.const(True, "bool")
        src = []
        for i in range(nd):
            p = ys[i] + pads[i] - kc[i] * dil[i]
            q = p // strides[i] if strides[i] > 1 else p
            cond = kir.binary("and", p >= 0, q < xs[2 + i])
            if strides[i] > 1:
                cond = kir.binary("and", cond, kir.binary("eq", p % strides[i], kir.i32(0)))
            ok = kir.binary("and", ok, cond)
            src.append(kir.clamp(q, 0, xs[2 + i] - 1))
        xv = ctx.read(x, [n, c] + src)
        wv = ctx.read(w, [c, m % Mg if group > 1 else m] + kc)
        return [accs[0] + select(ok, xv * wv, f32(0.0))]

    init = (lambda cs: [ctx.read(b, [cs[1]])]) if b else (lambda cs: [f32(0.0)])
    emit_loop(ctx, node.outputs[0], out_shape, "f32", Cg * ksize, ["f32"], init, step)


@register("Col2Im")
def col2im(ctx, node):
    x = node.inputs[0]
    image = const_ints(ctx, node, 1)
    block = const_ints(ctx, node, 2)
    if image is None or block is None:
        raise Unsupported("image_shape and block_shape must be compile-time constants")
    nd = len(image)
    xs = ctx.shape(x)
    strides = list(node.attr("strides", [1] * nd))
    dil = list(node.attr("dilations", [1] * nd))
    pads = list(node.attr("pads", [0] * (2 * nd)))
    bsize = numel(block)
    C = xs[1] // bsize
    L = [(image[i] + pads[i] + pads[nd + i] - (dil[i] * (block[i] - 1) + 1)) // strides[i] + 1 for i in range(nd)]
    if numel(L) != xs[2]:
        raise ShapeError(f"Col2Im input {xs} does not hold {L} blocks")
    out_shape = [xs[0], C] + list(image)

    def step(cs, k, accs):
        n, c, ys = cs[0], cs[1], cs[2:]
        kc = unflatten(k, block)
        ok = kir.const(True, "bool")
        ls = []
        for i in range(nd):
            p = ys[i] + pads[i] - kc[i] * dil[i]
            q = p // strides[i] if strides[i] > 1 else p
            cond = kir.binary("and", p >= 0, q < L[i])
            if strides[i] > 1:
                cond = kir.binary("and", cond, kir.binary("eq", p % strides[i], kir.i32(0)))
            ok = kir.binary("and", ok, cond)
            ls.append(kir.clamp(q, 0, L[i] - 1))
        v = ctx.read(x, [n, c * bsize + k, flat_of(ls, L)])
        return [accs[0] + select(ok, v, f32(0.0))]
    emit_loop(ctx, node.outputs[0], out_shape, "f32", bsize, ["f32"], lambda cs: [f32(0.0)], step)


# --- DeformConv: bilinear samples at learned offsets -----------------------------------

def _bilinear_zero(ctx, x, base, h, w, H, W):
    """Bilinear sample of x[*base, h, w] (f32 pixel coordinates); taps outside the image read 0."""
    h0f, w0f = kir.unary("floor", h), kir.unary("floor", w)
    lh, lw = h - h0f, w - w0f
    h0, w0 = kir.cast(h0f, "i32"), kir.cast(w0f, "i32")
    total = None
    for dh, wh in ((0, 1.0 - lh), (1, lh)):
        for dw, ww in ((0, 1.0 - lw), (1, lw)):
            hi, wi = h0 + dh, w0 + dw
            ok = kir.binary("and", kir.binary("and", hi >= 0, hi < H), kir.binary("and", wi >= 0, wi < W))
            v = ctx.read(x, base + [kir.clamp(hi, 0, H - 1), kir.clamp(wi, 0, W - 1)])
            term = select(ok, v, f32(0.0)) * (wh * ww)
            total = term if total is None else total + term
    return total


@register("DeformConv")
def deform_conv(ctx, node):
    x, w, off = node.inputs[:3]
    b, mask = node.input(3), node.input(4)
    xs, ws, os_ = ctx.shape(x), ctx.shape(w), ctx.shape(off)
    if len(xs) != 4:
        raise Unsupported("DeformConv other than 2-D")
    N, C, H, W = xs
    M = ws[0]
    group = int(node.attr("group", 1))
    og = int(node.attr("offset_group", 1))
    kh, kw = list(node.attr("kernel_shape", ws[2:]))
    sh, sw = list(node.attr("strides", [1, 1]))
    dh, dw = list(node.attr("dilations", [1, 1]))
    pads = list(node.attr("pads", [0, 0, 0, 0]))
    oh, ow = os_[2], os_[3]
    Cg, Mg, Cog = C // group, M // group, C // og
    K = kh * kw

    def step(cs, k, accs):
        n, m, i, j = cs
        c_local, kk = k // K, k % K
        ki, kj = kk // kw, kk % kw
        c = (m // Mg) * Cg + c_local if group > 1 else c_local
        g = c // Cog if og > 1 else kir.i32(0)
        ch = (g * K + kk) * 2
        h = kir.cast(i * sh - pads[0] + ki * dh, "f32") + ctx.read(off, [n, ch, i, j])
        ww = kir.cast(j * sw - pads[1] + kj * dw, "f32") + ctx.read(off, [n, ch + 1, i, j])
        v = _bilinear_zero(ctx, x, [n, c], h, ww, H, W) * ctx.read(w, [m, c_local, ki, kj])
        if mask:
            v = v * ctx.read(mask, [n, g * K + kk, i, j])
        return [accs[0] + v]
    init = (lambda cs: [ctx.read(b, [cs[1]])]) if b else (lambda cs: [f32(0.0)])
    emit_loop(ctx, node.outputs[0], [N, M, oh, ow], "f32", Cg * K, ["f32"], init, step)
