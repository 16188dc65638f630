"""onnxruntime's normalizations: SkipLayerNormalization, SkipSimplifiedLayerNormalization
(com.microsoft) and SimplifiedLayerNormalization (RMS norm, which onnxruntime defines in the
default domain).

The layer norms lower onto norms.py's `emit_layer_norm` (the LayerNorm anchor, plus the
statistics when the graph uses them); the simplified ones are a sum-of-squares Reduce and a
Generic scaling by its reciprocal root, which fusion joins. The skip forms first add
input + skip (+ bias) in one Generic: the optional input_skip_bias_sum output. Semantics
follow onnxruntime's CPU kernels (contrib_ops/cpu/skip_layer_norm.cc,
core/providers/cpu/nn/layer_norm_impl.cc).
"""

from __future__ import annotations

from ...errors import ShapeError
from ...ir import kir
from .common import norm_axis, require_float
from .norms import check_stash_type, emit_layer_norm
from .reduce import emit_reduce, split3
from .registry import ONNXRUNTIME_DEFAULT_DOMAIN, Unsupported, register

MS = "com.microsoft."
SKIP_EPS = 1e-12      # onnxruntime's default epsilon of the skip forms


def emit_rms_norm(ctx, x, scale, axis, eps, out, inv_out=""):
    """out = x / sqrt(mean(x^2) + eps) * scale over dims [axis, rank); inv_out (when named) gets
    1 / sqrt(mean(x^2) + eps) with those dims kept as 1."""
    s = ctx.shape(x)
    _, r, _ = split3(s, axis, len(s))
    rs = s[axis:]
    kept = list(s[:axis]) + [1] * len(rs)
    ss = emit_reduce(ctx, x, list(range(axis, len(s))), "sumsquare")
    inv = inv_out or ctx.temp("inv_rms")
    ctx.generic(inv, kept, "f32", lambda cs: kir.unary("rsqrt", ctx.read(ss, cs) * (1.0 / r) + eps))
    ctx.generic(out, s, "f32", lambda cs: ctx.read(x, cs) * ctx.read(inv, cs[:axis] + [kir.i32(0)] * len(rs))
                * ctx.read_bcast(scale, rs, cs[axis:]))


ONNXRUNTIME_DEFAULT_DOMAIN.add("SimplifiedLayerNormalization")


@register("SimplifiedLayerNormalization")
def simplified_layer_norm(ctx, node):
    """Y = X / sqrt(mean(X^2) + epsilon) * scale over dims [axis, rank); optional inv_std_var."""
    x, scale = node.inputs[:2]
    require_float(ctx, node, x)
    check_stash_type(node)
    s = ctx.shape(x)
    axis = norm_axis(node.attr("axis", -1), len(s))
    outs = list(node.outputs) + [""]
    emit_rms_norm(ctx, x, scale, axis, float(node.attr("epsilon", 1e-5)), outs[0], inv_out=outs[1])


def _skip_sum(ctx, node, bias, out):
    """input + skip (+ bias): skip broadcasts to the input ([S, H] or [1, S, H] for [B, S, H]),
    gamma, beta and bias are [H]. Written to `out` (the input_skip_bias_sum output, or a temp)."""
    x, skip = node.inputs[:2]
    names = [x, skip] + ([bias] if bias else [])
    per_channel = [n for n in node.inputs[2:] if n]
    for n in names + per_channel:
        require_float(ctx, node, n)
    s = list(ctx.shape(x))
    if len(s) not in (2, 3):
        raise ShapeError(f"{node.op} needs a [B, S, H] or [T, H] input, got {tuple(s)}")
    sk = list(ctx.shape(skip))
    if sk[-2:] != s[-2:] or len(sk) > len(s) or (len(sk) == 3 and sk[0] not in (1, s[0])):
        raise ShapeError(f"{node.op}: skip {tuple(sk)} does not match the input {tuple(s)}")
    for n in per_channel:
        if list(ctx.shape(n)) != [s[-1]]:
            raise ShapeError(f"{node.op}: {n!r} must have shape [{s[-1]}], got {ctx.shape(n)}")

    def rule(cs):
        acc = ctx.read(x, cs) + ctx.read_bcast(skip, s, cs)
        for n in names[2:]:
            acc = acc + ctx.read(n, cs[-1:])
        return acc
    ctx.generic(out, s, "f32", rule)
    return out


def _skip_outputs(node):
    outs = list(node.outputs) + ["", "", ""]
    return outs[0], outs[1], outs[2], outs[3]


@register(MS + "SkipLayerNormalization")
def skip_layer_norm(ctx, node):
    """output = LayerNorm(input + skip + bias) * gamma + beta over the last dim; optional outputs
    mean, inv_std_var ([..., 1]) and input_skip_bias_sum."""
    x, gamma = node.inputs[0], node.inputs[2]
    beta, bias = node.input(3), node.input(4)
    out, mean_out, inv_out, sum_out = _skip_outputs(node)
    total = _skip_sum(ctx, node, bias, sum_out or ctx.temp("skip_sum"))
    emit_layer_norm(ctx, total, gamma, beta, len(ctx.shape(x)) - 1, float(node.attr("epsilon", SKIP_EPS)), out,
                    mean_out=mean_out, inv_out=inv_out)


@register(MS + "SkipSimplifiedLayerNormalization")
def skip_simplified_layer_norm(ctx, node):
    """output = RMSNorm(input + skip + bias) * gamma over the last dim; optional outputs
    inv_std_var and input_skip_bias_sum (the mean output onnxruntime leaves unset is refused)."""
    x, gamma = node.inputs[0], node.inputs[2]
    bias = node.input(3)
    out, mean_out, inv_out, sum_out = _skip_outputs(node)
    if mean_out:
        raise Unsupported(f"the mean output ({mean_out!r}): a simplified norm has no mean, and onnxruntime "
                          f"leaves that output unset")
    total = _skip_sum(ctx, node, bias, sum_out or ctx.temp("skip_sum"))
    emit_rms_norm(ctx, total, gamma, len(ctx.shape(x)) - 1, float(node.attr("epsilon", SKIP_EPS)), out,
                  inv_out=inv_out)
