"""Contractions: MatMul and Gemm lower to the MatMul anchor.

Gemm's `beta * C` becomes a broadcasting Generic add that fusion folds into
the MatMul's epilogue, so a Gemm (+ activation) is one dispatch.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir.program import MatMul
from .registry import Unsupported, register
from .common import broadcast_shapes


@register("MatMul")
def matmul(ctx, node):
    a, b = node.inputs[0], node.inputs[1]
    sa, sb = list(ctx.shape(a)), list(ctx.shape(b))
    if ctx.dtype(a) != "f32" or ctx.dtype(b) != "f32":
        raise Unsupported("MatMul on integer tensors")
    if not sa or not sb:
        raise ShapeError("MatMul of a scalar")
    va, vb = len(sa) == 1, len(sb) == 1
    if va:
        sa = [1] + sa
    if vb:
        sb = sb + [1]
    m, k = sa[-2], sa[-1]
    k2, n = sb[-2], sb[-1]
    if k != k2:
        raise ShapeError(f"MatMul inner dims differ: {ctx.shape(a)} @ {ctx.shape(b)}")
    a_batch, b_batch = tuple(sa[:-2]), tuple(sb[:-2])
    batch = broadcast_shapes(a_batch, b_batch)
    out_shape = list(batch) + [m, n]
    final = list(batch) + ([] if va else [m]) + ([] if vb else [n])
    op = MatMul(name=node.name, out=ctx.temp("mm"), nodes=[node.name], a=ctx.buffer(a), b=ctx.buffer(b),
                batch=tuple(batch), a_batch=a_batch, b_batch=b_batch, m=m, n=n, k=k)
    if not b_batch and a_batch and not va:
        # [..., M, K] @ [K, N]: one big matrix product with M' = prod(batch) * M
        op.m, op.batch, op.a_batch = int(np.prod(a_batch)) * m, (), ()
    ctx.anchor(op, [int(np.prod(batch)) * m, n] if not op.batch else out_shape)
    ctx.view(node.outputs[0], op.out, final)


@register("Gemm")
def gemm(ctx, node):
    a, b = node.inputs[0], node.inputs[1]
    ta, tb = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    sa, sb = ctx.shape(a), ctx.shape(b)
    if len(sa) != 2 or len(sb) != 2:
        raise ShapeError(f"Gemm needs 2-D inputs, got {sa} and {sb}")
    m, k = (sa[1], sa[0]) if ta else sa
    k2, n = (sb[1], sb[0]) if tb else sb
    if k != k2:
        raise ShapeError(f"Gemm inner dims differ: {sa}{'ᵀ' if ta else ''} @ {sb}{'ᵀ' if tb else ''}")
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    c = node.input(2)
    out = node.outputs[0] if not c or beta == 0.0 else ctx.temp("gemm")
    op = MatMul(name=node.name, out=out, nodes=[node.name], a=ctx.buffer(a), b=ctx.buffer(b),
                m=m, n=n, k=k, trans_a=ta, trans_b=tb, alpha=alpha)
    ctx.anchor(op, [m, n])
    if out != node.outputs[0]:
        shape = (m, n)
        broadcast_shapes(ctx.shape(c), shape)
        ctx.generic(node.outputs[0], shape, "f32",
                    lambda cs: ctx.read(out, cs) + (ctx.read_bcast(c, shape, cs) * beta if beta != 1.0
                                                    else ctx.read_bcast(c, shape, cs)))


@register("Det")
def det(ctx, node):
    """Determinants of small matrices (n <= 4) by the Leibniz formula, one Generic op."""
    import itertools

    x = node.inputs[0]
    s = list(ctx.shape(x))
    n = s[-1]
    if len(s) < 2 or s[-2] != n:
        raise ShapeError(f"Det needs square matrices, got {tuple(s)}")
    if n > 4:
        raise Unsupported(f"Det of {n}x{n} matrices (only up to 4x4)")
    if ctx.dtype(x) != "f32":
        raise Unsupported("Det on non-float tensors")
    from ...ir import kir

    def rule(cs):
        total = None
        for perm in itertools.permutations(range(n)):
            inv = sum(1 for i in range(n) for j in range(i + 1, n) if perm[i] > perm[j])
            term = None
            for r, c in enumerate(perm):
                v = ctx.read(x, cs + [kir.i32(r), kir.i32(c)])
                term = v if term is None else term * v
            if total is None:
                total = term if inv % 2 == 0 else -term
            else:
                total = total - term if inv % 2 else total + term
        return total
    ctx.generic(node.outputs[0], s[:-2], "f32", rule)
