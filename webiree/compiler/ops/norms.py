"""The normalizations: BatchNormalization (inference and training mode),
InstanceNormalization, LayerNormalization, LpNormalization, LRN.

LayerNormalization lowers to the LayerNorm anchor, InstanceNormalization to
the same kind per (n, c) row; inference BatchNormalization is a per-channel
scale and shift (folded at compile time when its statistics are constants);
training BatchNormalization and LpNormalization reduce, then divide; LRN is a
Generic summing its channel window.

LayerNormalization's Mean/InvStdDev outputs, when the graph uses them, are
reductions beside the anchor. RMSNormalization, GroupNormalization and
MeanVarianceNormalization lower through their ONNX function bodies (see
expand.py); onnxruntime's own normalizations are contrib_norms.py's.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.program import LayerNorm, numel
from .registry import ONNXRUNTIME_DEFAULT_DOMAIN, Unsupported, register
from .common import norm_axis, require_float
from .reduce import emit_reduce, split3


@register("BatchNormalization")
def batchnorm(ctx, node):
    x, scale, bias, mean, var = node.inputs[:5]
    if node.attr("training_mode", 0) or len([o for o in node.outputs if o]) > 1:
        if ctx.opset < 14:
            raise Unsupported("BatchNormalization's training outputs before opset 14")
        _batchnorm_training(ctx, node)
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

    def rule(cs):
        c = [cs[1]]
        inv = kir.unary("rsqrt", ctx.read(var, c) + eps)
        return (ctx.read(x, cs) - ctx.read(mean, c)) * inv * ctx.read(scale, c) + ctx.read(bias, c)
    ctx.generic(node.outputs[0], xs, "f32", rule)


def _batchnorm_training(ctx, node):
    """Y with the batch's own statistics; running mean and variance updated with `momentum`."""
    x, scale, bias, mean, var = node.inputs[:5]
    s = ctx.shape(x)
    eps = float(node.attr("epsilon", 1e-5))
    momentum = float(node.attr("momentum", 0.9))
    axes = [0] + list(range(2, len(s)))
    bmean = emit_reduce(ctx, x, axes, "mean")
    at_c = lambda cs: [kir.i32(0), cs[1]] + [kir.i32(0)] * (len(s) - 2)  # noqa: E731
    sq = ctx.temp("sq")
    ctx.generic(sq, s, "f32", lambda cs: (lambda d: d * d)(ctx.read(x, cs) - ctx.read(bmean, at_c(cs))))
    bvar = emit_reduce(ctx, sq, axes, "mean")
    ctx.generic(node.outputs[0], s, "f32",
                lambda cs: (ctx.read(x, cs) - ctx.read(bmean, at_c(cs)))
                * kir.unary("rsqrt", ctx.read(bvar, at_c(cs)) + eps) * ctx.read(scale, [cs[1]])
                + ctx.read(bias, [cs[1]]))
    outs = (list(node.outputs) + ["", ""])[1:3]
    for out, running, batch in zip(outs, (mean, var), (bmean, bvar)):
        if out:
            ctx.generic(out, [s[1]], "f32",
                        lambda cs, r=running, b=batch: ctx.read(r, cs) * momentum
                        + ctx.read(b, [kir.i32(0), cs[0]] + [kir.i32(0)] * (len(s) - 2)) * (1.0 - momentum))


@register("InstanceNormalization")
def instance_norm(ctx, node):
    x, scale, bias = node.inputs[:3]
    s = ctx.shape(x)
    if len(s) < 3:
        raise ShapeError(f"InstanceNormalization needs an N,C,spatial input, got {s}")
    require_float(ctx, node, x)
    r = numel(s[2:])
    ones = ctx.temp("ones")
    ctx.set_const(ones, np.ones([r], np.float32))
    normed = ctx.temp("normed")
    op = LayerNorm(name=node.name, out=normed, nodes=[node.name], x=ctx.buffer(x), scale=ctx.buffer(ones),
                   bias="", outer=s[0] * s[1], r=r, eps=float(node.attr("epsilon", 1e-5)))
    ctx.anchor(op, s)
    ctx.generic(node.outputs[0], s, "f32",
                lambda cs: ctx.read(normed, cs) * ctx.read(scale, [cs[1]]) + ctx.read(bias, [cs[1]]))


ONNXRUNTIME_DEFAULT_DOMAIN.add("LayerNormalization")     # onnxruntime's, before ONNX's opset 17


@register("LayerNormalization")
def layernorm(ctx, node):
    """ONNX's (opset 17) and onnxruntime's default-domain LayerNormalization of earlier opsets alike."""
    x, scale = node.inputs[0], node.inputs[1]
    s = ctx.shape(x)
    require_float(ctx, node, x)
    check_stash_type(node)
    outs = list(node.outputs) + ["", ""]
    emit_layer_norm(ctx, x, scale, node.input(2), norm_axis(node.attr("axis", -1), len(s)),
                    float(node.attr("epsilon", 1e-5)), outs[0], mean_out=outs[1], inv_out=outs[2])


def check_stash_type(node):
    """The statistics are computed in float32: stash_type 1 (float, the default), or 11 (double,
    computed in float32 as webiree computes every float64 intermediate); a narrower type is refused."""
    st = node.attr("stash_type", 1)
    if st not in (1, 11):
        raise Unsupported(f"stash_type={st} (webiree computes the statistics in float32: stash_type 1 or 11)")


def emit_layer_norm(ctx, x, scale, bias, axis, eps, out, mean_out="", inv_out=""):
    """out = (x - mean) / sqrt(var + eps) * scale (+ bias) over dims [axis, rank) through the
    LayerNorm anchor; scale and bias broadcast to those dims. mean_out and inv_out (when named)
    get the statistics, 1/sqrt(var + eps) for inv_out, with the normalized dims kept as 1."""
    s = ctx.shape(x)
    outer, r, _ = split3(s, axis, len(s))
    rs = s[axis:]
    if numel(ctx.shape(scale)) != r or (bias and numel(ctx.shape(bias)) != r):
        scale_b = ctx.temp("scale")
        ctx.generic(scale_b, rs, "f32", lambda cs: ctx.read_bcast(scale, rs, cs))
        scale = scale_b
        if bias:
            bias_b = ctx.temp("bias")
            ctx.generic(bias_b, rs, "f32", lambda cs: ctx.read_bcast(bias, rs, cs))
            bias = bias_b
    op = LayerNorm(name=ctx.node.name, out=out, nodes=[ctx.node.name], x=ctx.buffer(x),
                   scale=ctx.buffer(scale), bias=ctx.buffer(bias) if bias else "", outer=outer, r=r, eps=eps)
    ctx.anchor(op, s)
    if not (mean_out or inv_out):
        return
    axes = list(range(axis, len(s)))
    kept = list(s[:axis]) + [1] * len(rs)
    at = lambda cs: cs[:axis] + [kir.i32(0)] * len(rs)   # noqa: E731  (the statistic of this row)
    mean = emit_reduce(ctx, x, axes, "mean")
    if mean_out:
        ctx.view(mean_out, mean, kept)
    if inv_out:
        sq = ctx.temp("centered_sq")
        ctx.generic(sq, s, "f32", lambda cs: (lambda d: d * d)(ctx.read(x, cs) - ctx.read(mean, at(cs))))
        var = emit_reduce(ctx, sq, axes, "mean")
        ctx.generic(inv_out, kept, "f32", lambda cs: kir.unary("rsqrt", ctx.read(var, cs) + eps))


@register("LpNormalization")
def lp_norm(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    axis = norm_axis(node.attr("axis", -1), len(s))
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise ShapeError(f"LpNormalization p must be 1 or 2, got {p}")
    require_float(ctx, node, x)
    norm = emit_reduce(ctx, x, [axis], "l1" if p == 1 else "l2")
    def rule(cs):
        nv = ctx.read(norm, cs[:axis] + [kir.i32(0)] + cs[axis + 1:])
        return kir.select(kir.binary("eq", nv, kir.f32(0.0)), kir.f32(0.0), ctx.read(x, cs) / nv)   # 0/0 is 0
    ctx.generic(node.outputs[0], s, "f32", rule)


@register("LRN")
def lrn(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    size = int(node.attr("size"))
    alpha, beta = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75))
    bias = float(node.attr("bias", 1.0))
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    C = s[1]

    def rule(cs):
        total = None
        for d in range(-lo, hi + 1):
            c = cs[1] + d
            v = ctx.read(x, [cs[0], kir.clamp(c, 0, C - 1)] + cs[2:])
            term = kir.select(kir.binary("and", c >= 0, c < C), v * v, kir.f32(0.0))
            total = term if total is None else total + term
        base = bias + (alpha / size) * total
        return ctx.read(x, cs) / kir.binary("pow", base, kir.f32(beta))
    ctx.generic(node.outputs[0], s, "f32", rule)
