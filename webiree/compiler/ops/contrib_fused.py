"""onnxruntime's fused contrib operators (com.microsoft): FusedMatMul, FusedConv,
EmbedLayerNormalization.

Each unfolds onto the lowerings of the ops it fuses: FusedMatMul onto contraction.py's
`emit_matmul` (transposes and alpha are the MatMul anchor's own), FusedConv onto conv.py's
Conv followed by one Generic (+ Z, activation) that fusion folds back into the conv's
epilogue, EmbedLayerNormalization onto a gathering Generic and norms.py's
`emit_layer_norm`. Semantics follow onnxruntime's CPU kernels (contrib_ops/cpu/fused_conv.cc,
math/fused_matmul.cc, bert/embed_layer_norm.cc).
"""

from __future__ import annotations

import dataclasses

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import select
from .common import require_float
from .contraction import emit_matmul
from .conv import conv
from .elementwise import UNARY, hard_sigmoid, leaky_relu, relu, sigmoid, tanh
from .norms import emit_layer_norm
from .reduce import emit_reduce
from .registry import Unsupported, register

MS = "com.microsoft."


# --- FusedMatMul -------------------------------------------------------------------

def _batch_transposed(ctx, node, name, which):
    """transBatchA/B: the stored operand [d0, d1, .., d(r-2), d(r-1)] is the logical one with its
    first dim moved to position r-2 (onnxruntime's fused Transpose(perm=[1, .., r-2, 0, r-1]))."""
    s = list(ctx.shape(name))
    r = len(s)
    if r < 3:
        raise Unsupported(f"transBatch{which}=1 on a rank-{r} operand (it needs rank 3 or more)")
    shape = s[1:r - 1] + [s[0], s[r - 1]]
    out = ctx.temp(f"batch_t{which}")
    ctx.generic(out, shape, ctx.dtype(name), lambda cs: ctx.read(name, [cs[r - 2]] + cs[:r - 2] + [cs[r - 1]]))
    return out


@register(MS + "FusedMatMul")
def fused_matmul(ctx, node):
    """Y = alpha * op(A) @ op(B): transA/transB transpose the last two dims, transBatchA/B move the
    first dim of the stored operand behind the batch dims."""
    a, b = node.inputs[:2]
    for which, name in (("A", a), ("B", b)):
        v = node.attr(f"transBatch{which}", 0)
        if v not in (0, 1):
            raise Unsupported(f"transBatch{which}={v} (0 or 1)")
    if node.attr("transBatchA", 0):
        a = _batch_transposed(ctx, node, a, "A")
    if node.attr("transBatchB", 0):
        b = _batch_transposed(ctx, node, b, "B")
    emit_matmul(ctx, node, a, b, node.outputs[0], trans_a=bool(node.attr("transA", 0)),
                trans_b=bool(node.attr("transB", 0)), alpha=float(node.attr("alpha", 1.0)))


# --- FusedConv ---------------------------------------------------------------------

def _clip(x, lo, hi):
    return select(x > hi, kir.f32(hi), select(x < lo, kir.f32(lo), x))


# activation name -> (number of activation_params, rule(x, params)), as onnxruntime's
# GetFusedActivationAttr reads them (MLAS's fused activations)
FUSED_ACTIVATIONS = {
    "Relu": (0, lambda x, p: relu(x)),
    "Tanh": (0, lambda x, p: tanh(x)),
    "Sigmoid": (0, lambda x, p: sigmoid(x)),
    "LeakyRelu": (1, lambda x, p: leaky_relu(x, p[0])),
    "Clip": (2, lambda x, p: _clip(x, p[0], p[1])),
    "HardSigmoid": (2, lambda x, p: hard_sigmoid(x, p[0], p[1])),
    "HardSwish": (0, lambda x, p: UNARY["HardSwish"](x, {})),
}


def fused_activation(node):
    """The rule of the node's `activation` with its `activation_params`; None for no activation."""
    act = node.attr("activation", "")
    if isinstance(act, bytes):
        act = act.decode()
    if not act:
        return None
    if act not in FUSED_ACTIVATIONS:
        raise Unsupported(f"activation={act!r} (onnxruntime fuses {sorted(FUSED_ACTIVATIONS)})")
    count, rule = FUSED_ACTIVATIONS[act]
    params = [float(v) for v in node.attr("activation_params", [])]
    if len(params) != count:
        raise Unsupported(f"activation_params={params} ({act} takes {count} parameter(s))")
    return lambda x: rule(x, params)


@register(MS + "FusedConv")
def fused_conv(ctx, node):
    """Y = activation(Conv(X, W, B) + Z): conv.py's Conv, then one Generic adding the optional
    sum input Z (the output's shape) and applying the activation."""
    act = fused_activation(node)
    z = node.input(3)
    if act is None and not z:
        conv(ctx, node)
        return
    tmp = ctx.temp("conv")
    conv(ctx, dataclasses.replace(node, inputs=list(node.inputs[:3]), outputs=[tmp]))
    shape = ctx.shape(tmp)
    if z:
        require_float(ctx, node, z)
        if tuple(ctx.shape(z)) != tuple(shape):
            raise ShapeError(f"FusedConv's Z {ctx.shape(z)} must have the output's shape {tuple(shape)}")

    def rule(cs):
        v = ctx.read(tmp, cs)
        if z:
            v = v + ctx.read(z, cs)
        return act(v) if act else v
    ctx.generic(node.outputs[0], shape, "f32", rule)
