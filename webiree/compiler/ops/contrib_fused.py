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

import numpy as np

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
    for which in "AB":
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


# --- EmbedLayerNormalization -------------------------------------------------------

@register(MS + "EmbedLayerNormalization")
def embed_layer_norm(ctx, node):
    """output = LayerNorm(word[input_ids] + position[position_ids] + segment[segment_ids]) * gamma + beta;
    position_ids default to 0..S-1 (given, [1, S] or [B, S]); the optional mask_index output is the
    count of non-zero mask entries per batch row (0 without a mask, whatever mask_index_type says, as
    onnxruntime's CPU kernel does); embedding_sum is the sum before the norm."""
    ids, seg_ids, word, pos, seg, gamma, beta = (node.input(i) for i in range(7))
    mask, pos_ids = node.input(7), node.input(8)
    s = list(ctx.shape(ids))
    if len(s) != 2:
        raise ShapeError(f"EmbedLayerNormalization needs input_ids [B, S], got {tuple(s)}")
    B, S = s
    H = ctx.shape(word)[-1]
    if bool(seg_ids) != bool(seg):
        raise ShapeError("EmbedLayerNormalization needs segment_ids and segment_embedding together")
    for n in (word, pos) + ((seg,) if seg else ()):
        require_float(ctx, node, n)
        if len(ctx.shape(n)) != 2 or ctx.shape(n)[1] != H:
            raise ShapeError(f"EmbedLayerNormalization: embedding {n!r} must be [rows, {H}], got {ctx.shape(n)}")
    for n in [i for i in (seg_ids, mask, pos_ids) if i]:
        if ctx.dtype(n) != "i32":
            raise Unsupported(f"{n!r} of {ctx.dtype(n)} elements (ids and masks are int32)")
    if pos_ids and list(ctx.shape(pos_ids)) not in ([1, S], [B, S]):
        raise ShapeError(f"position_ids must be [1, {S}] or [{B}, {S}], got {ctx.shape(pos_ids)}")
    if not pos_ids and ctx.shape(pos)[0] < S:
        raise ShapeError(f"position_embedding has {ctx.shape(pos)[0]} rows for a sequence of {S}")

    def row(table, index):     # table[index, h]; an index out of range is clamped
        return lambda cs: ctx.read(table, [kir.clamp(index(cs), 0, ctx.shape(table)[0] - 1), cs[2]])
    terms = [row(word, lambda cs: ctx.read(ids, cs[:2]))]
    terms.append(row(pos, lambda cs: ctx.read_bcast(pos_ids, [B, S], cs[:2])) if pos_ids
                 else lambda cs: ctx.read(pos, [cs[1], cs[2]]))
    if seg:
        terms.append(row(seg, lambda cs: ctx.read(seg_ids, cs[:2])))
    outs = list(node.outputs) + ["", ""]
    total = outs[2] or ctx.temp("embedding_sum")

    def embedding(cs):
        acc = terms[0](cs)
        for t in terms[1:]:
            acc = acc + t(cs)
        return acc
    ctx.generic(total, [B, S, H], "f32", embedding)
    emit_layer_norm(ctx, total, gamma, beta, 2, float(node.attr("epsilon", 1e-12)), outs[0])
    if outs[1]:
        if not mask:
            ctx.set_const(outs[1], np.zeros([B], np.int32))
            return
        nonzero = ctx.temp("mask_nonzero")
        ctx.generic(nonzero, [B, S], "i32", lambda cs: select(kir.binary("ne", ctx.read(mask, cs), kir.i32(0)),
                                                              kir.i32(1), kir.i32(0)))
        ctx.view(outs[1], emit_reduce(ctx, nonzero, [1], "sum"), [B])
