"""Contractions: MatMul and Gemm lower to the MatMul anchor; Det; Einsum.

Gemm's `beta * C` becomes a broadcasting Generic add that fusion folds into
the MatMul's epilogue, so a Gemm (+ activation) is one dispatch. Einsum sums
the product of its operands over the contracted letters: the Loop kind.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.program import MatMul, numel
from .registry import Unsupported, register
from .common import broadcast_shapes, require_float
from .loops import emit_loop, unflatten
from .quant import qdq_matmul


@register("MatMul")
def matmul(ctx, node):
    a, b = node.inputs[0], node.inputs[1]
    if qdq_matmul(ctx, node):
        return
    emit_matmul(ctx, node, a, b, node.outputs[0])


def emit_matmul(ctx, node, a, b, out, trans_a=False, trans_b=False, alpha=1.0):
    """out = alpha * op(a) @ op(b) with numpy's matmul broadcasting, op transposing the last two
    dims where asked (the stored matrix is then [.., K, M] / [.., N, K]); a 1-D operand is a vector.
    Returns the MatMul anchor."""
    sa, sb = list(ctx.shape(a)), list(ctx.shape(b))
    if ctx.dtype(a) != "f32" or ctx.dtype(b) != "f32":
        raise Unsupported(f"{node.op} on integer tensors")
    if not sa or not sb:
        raise ShapeError(f"{node.op} of a scalar")
    va, vb = len(sa) == 1, len(sb) == 1
    if (va and trans_a) or (vb and trans_b):
        raise Unsupported(f"{node.op} transposing a 1-D operand")
    if va:
        sa = [1] + sa
    if vb:
        sb = sb + [1]
    m, k = (sa[-1], sa[-2]) if trans_a else (sa[-2], sa[-1])
    k2, n = (sb[-1], sb[-2]) if trans_b else (sb[-2], sb[-1])
    if k != k2:
        raise ShapeError(f"{node.op} inner dims differ: {ctx.shape(a)} @ {ctx.shape(b)}")
    a_batch, b_batch = tuple(sa[:-2]), tuple(sb[:-2])
    batch = broadcast_shapes(a_batch, b_batch)
    out_shape = list(batch) + [m, n]
    final = list(batch) + ([] if va else [m]) + ([] if vb else [n])
    op = MatMul(name=node.name, out=ctx.temp("mm"), nodes=[node.name], a=ctx.buffer(a), b=ctx.buffer(b),
                batch=tuple(batch), a_batch=a_batch, b_batch=b_batch, m=m, n=n, k=k,
                trans_a=trans_a, trans_b=trans_b, alpha=alpha)
    if not b_batch and a_batch and not va and not trans_a:
        # [..., M, K] @ [K, N]: one big matrix product with M' = prod(batch) * M
        op.m, op.batch, op.a_batch = numel(a_batch) * m, (), ()
    ctx.anchor(op, [numel(batch) * m, n] if not op.batch else out_shape)
    ctx.view(out, op.out, final)
    return op


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
    if qdq_matmul(ctx, node):
        return
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
    require_float(ctx, node, x)

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


@register("Einsum")
def einsum(ctx, node):
    """out[free letters] = sum over the other letters of the product of the operands."""
    eq = node.attr("equation").replace(" ", "")
    names = [i for i in node.inputs if i]
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(names):
        raise ShapeError(f"Einsum equation {eq!r} has {len(terms)} operands, the node {len(names)}")
    shapes = [list(ctx.shape(n)) for n in names]
    ks = [len(s) - (len(t) - 3) if "..." in t else 0 for t, s in zip(terms, shapes)]
    E = max(ks, default=0)

    def letters_of(t, k):
        if "..." not in t:
            return list(t)
        i = t.index("...")
        # ellipsis dims are aligned on the right (broadcast), named by their position among E
        return list(t[:i]) + [f"...{E - k + j}" for j in range(k)] + list(t[i + 3:])
    dims: dict = {}
    expanded = []
    for t, s, k in zip(terms, shapes, ks):
        letters = letters_of(t, k)
        if len(letters) != len(s):
            raise ShapeError(f"Einsum term {t!r} does not match operand shape {tuple(s)}")
        for l, d in zip(letters, s):
            if dims.get(l, 1) not in (1, d) and d != 1:
                raise ShapeError(f"Einsum letter {l!r} has sizes {dims[l]} and {d}")
            dims[l] = max(dims.get(l, 1), d)
        expanded.append(letters)
    ell = [f"...{j}" for j in range(E)]
    if arrow:
        out_letters = letters_of(rhs, E) if "..." in rhs else list(rhs)
    else:   # implicit output: the ellipsis, then the letters used once, in alphabetical order
        once = sorted(l for l in dims if not l.startswith("...") and sum(e.count(l) for e in expanded) == 1)
        out_letters = ell + once
    summed = [l for l in dims if l not in out_letters]
    out_shape = [dims[l] for l in out_letters]
    dt = ctx.dtype(names[0])

    def step(cs, k, accs):
        val = dict(zip(out_letters, cs))
        val.update(zip(summed, unflatten(k, [dims[l] for l in summed])))
        prod = None
        for letters, n, s in zip(expanded, names, shapes):
            v = ctx.read(n, [val[l] if d != 1 else kir.i32(0) for l, d in zip(letters, s)])
            prod = v if prod is None else prod * v
        return [accs[0] + prod]
    emit_loop(ctx, node.outputs[0], out_shape, dt, numel([dims[l] for l in summed]), [dt],
              lambda cs: [kir.const(0, dt)], step)
