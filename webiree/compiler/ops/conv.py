"""Convolution and pooling: Conv, MaxPool, AveragePool, LpPool, Global*Pool,
BatchNormalization (inference), InstanceNormalization is in reduce.py.

Conv's bias becomes a broadcasting Generic add (fused into the conv's
epilogue later); a constant-zero Pad feeding a Conv is folded into its pads.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from ...ir.program import Conv, MatMul, Pool, Reduce
from .registry import Unsupported, register
from .shape import pad_params


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


def _check_positive(name, values, nd=None):
    if nd is not None and len(values) != nd:
        raise ShapeError(f"{name} {list(values)} does not match {nd} spatial dims")
    if any(v <= 0 or v >= (1 << 31) for v in values):
        raise ShapeError(f"{name} must be positive 32-bit integers, got {list(values)}")


@register("Conv")
def conv(ctx, node):
    x, w = node.inputs[0], node.inputs[1]
    xs, ws = ctx.shape(x), ctx.shape(w)
    if len(xs) < 3 or len(ws) != len(xs):
        raise ShapeError(f"Conv input {xs} and weight {ws} ranks do not match")
    if ctx.dtype(x) != "f32":
        raise Unsupported("Conv on non-float tensors")
    nd = len(xs) - 2
    kernel = list(node.attr("kernel_shape", ws[2:]))
    strides = list(node.attr("strides", [1] * nd))
    dilations = list(node.attr("dilations", [1] * nd))
    group = int(node.attr("group", 1))
    _check_positive("strides", strides, nd)
    _check_positive("dilations", dilations, nd)
    _check_positive("kernel_shape", kernel, nd)
    if list(kernel) != list(ws[2:]):
        raise ShapeError(f"kernel_shape {kernel} differs from the weight's spatial dims {tuple(ws[2:])}")
    if group <= 0 or xs[1] % group or ws[0] % group or ws[1] * group != xs[1]:
        raise ShapeError(f"Conv group {group} does not divide channels: input {xs}, weight {ws}")
    pads = window_pads(node, xs[2:], kernel, strides, dilations)
    # a constant-zero Pad right before the conv becomes the conv's own padding
    src = ctx.pad_source(x)
    if src is not None:
        x, extra = src
        xs = ctx.shape(x)
        pads = [p + e for p, e in zip(pads, extra)]
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
        P = int(np.prod(out_sp))
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
    _check_positive("strides", strides, nd)
    _check_positive("dilations", dilations, nd)
    _check_positive("kernel_shape", kernel, nd)
    pads = window_pads(node, xs[2:], kernel, strides, dilations)
    out_sp = window_out(xs[2:], kernel, strides, dilations, pads, bool(node.attr("ceil_mode", 0)))
    out_shape = [xs[0], xs[1]] + out_sp
    op = Pool(name=node.name, out=node.outputs[0], nodes=[node.name], x=ctx.buffer(x), mode=mode,
              x_shape=tuple(xs), out_shape=tuple(out_shape), kernel=tuple(kernel), strides=tuple(strides),
              dilations=tuple(dilations), pads=tuple(pads),
              count_include_pad=bool(node.attr("count_include_pad", 0)), p=float(node.attr("p", 2)))
    ctx.anchor(op, out_shape, ctx.dtype(x))
    if node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        from .loops import maxpool_indices
        maxpool_indices(ctx, node, x, node.outputs[1], out_shape, kernel, strides, dilations, pads)


@register("MaxPool")
def maxpool(ctx, node):
    _pool(ctx, node, "max")


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
    out_shape = list(xs[:2]) + [1] * (len(xs) - 2)
    op = Reduce(name=node.name, out=node.outputs[0], nodes=[node.name], x=ctx.buffer(x), mode=mode,
                outer=xs[0] * xs[1], r=int(np.prod(xs[2:])), inner=1)
    ctx.anchor(op, out_shape)


@register("BatchNormalization")
def batchnorm(ctx, node):
    x, scale, bias, mean, var = node.inputs[:5]
    if node.attr("training_mode", 0) or len([o for o in node.outputs if o]) > 1:
        from .norms import batchnorm_training
        if ctx.opset < 14:
            raise Unsupported("BatchNormalization's training outputs before opset 14")
        batchnorm_training(ctx, node)
        return
    eps = float(node.attr("epsilon", 1e-5))
    xs = ctx.shape(x)
    consts = [ctx.const(n) for n in (scale, bias, mean, var)]
    if all(c is not None for c in consts):
        s, b, m, v = (np.asarray(c, dtype=np.float64) for c in consts)
        a = s / np.sqrt(v + eps)
        name_a, name_b = ctx.temp("bn_scale"), ctx.temp("bn_shift")
        ctx.set_const(name_a, a.astype(np.float32))
        ctx.set_const(name_b, (b - m * a).astype(np.float32))
        ctx.generic(node.outputs[0], xs, "f32",
                    lambda cs: ctx.read(x, cs) * ctx.read(name_a, [cs[1]]) + ctx.read(name_b, [cs[1]]))
        return
    from ...ir import kir

    def rule(cs):
        c = [cs[1]]
        inv = kir.unary("rsqrt", ctx.read(var, c) + eps)
        return (ctx.read(x, cs) - ctx.read(mean, c)) * inv * ctx.read(scale, c) + ctx.read(bias, c)
    ctx.generic(node.outputs[0], xs, "f32", rule)


__all__ = ["window_pads", "window_out", "pad_params"]
