"""A few ops of the ai.onnx.ml domain that are plain index maps or elementwise
math: Binarizer and ArrayFeatureExtractor (registered as "ai.onnx.ml.<Op>")."""

from __future__ import annotations

from ...wgsl_codegen import kir
from ...wgsl_codegen.kir import select
from . import Unsupported, register


@register("ai.onnx.ml.Binarizer")
def binarizer(ctx, node):
    x = node.inputs[0]
    dt = ctx.dtype(x)
    if dt == "bool":
        raise Unsupported("Binarizer on bool tensors")
    t = node.attr("threshold", 0.0)
    ctx.generic(node.outputs[0], ctx.shape(x), dt,
                lambda cs: select(ctx.read(x, cs) > kir.const(t, dt), kir.const(1, dt), kir.const(0, dt)))


@register("ai.onnx.ml.ArrayFeatureExtractor")
def array_feature_extractor(ctx, node):
    x, idx = node.inputs[:2]
    xs = list(ctx.shape(x))
    k = 1
    for d in ctx.shape(idx):
        k *= d
    n = xs[-1]
    out = (xs[:-1] if len(xs) > 1 else [1]) + [k]

    def rule(cs):
        i = kir.clamp(ctx.read_flat(idx, cs[-1]), 0, n - 1)
        return ctx.read(x, (cs[:-1] if len(xs) > 1 else []) + [i])
    ctx.generic(node.outputs[0], out, ctx.dtype(x), rule)
