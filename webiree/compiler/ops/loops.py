"""Emitting the `Loop` kind (ir/program.py): an output whose every element is a
sequential fold over a known number of steps, one invocation per element.

Several op families lower to it, each in its own file: ConvTranspose, Col2Im
and DeformConv (conv.py), MaxPool's Indices output, MaxUnpool and RoiAlign
(pool.py), CumSum/CumProd, TopK and Hardmax (reduce.py), the scatters
(movement.py), DFT and STFT (spectral.py), Einsum (contraction.py). These
kernels favour generality over speed (a scatter costs outputs x updates,
Einsum does not tile): the common fast paths (MatMul, Conv, Pool, Reduce)
keep their own kinds.
"""

from __future__ import annotations

from ...ir import kir
from ...ir.program import O, coords_of
from ...ir.program import LOOP_K, Loop, acc_vars


def emit_loop(ctx, out: str, shape, dtype: str, count: int, dtypes, inits, step, result=None) -> None:
    """out[c] = result(c, accs) after folding `step(c, k, accs)` for k < count.

    inits(coords) -> [Expr]; step(coords, k, accs) -> [Expr] (new accumulator values);
    result(coords, accs) -> Expr (default: the first accumulator)."""
    shape = tuple(int(d) for d in shape)
    cs = coords_of(O, shape)
    accs = acc_vars(dtypes)
    res = result(cs, accs) if result is not None else accs[0]
    if res.dtype != dtype:
        res = kir.cast(res, dtype)
    op = Loop(name=ctx.node.name, out=out, nodes=[ctx.node.name], count=int(count), dtypes=list(dtypes),
              inits=list(inits(cs)), updates=list(step(cs, LOOP_K, accs)), result=res)
    ctx.anchor(op, shape, dtype)


def unflatten(k, dims):
    """Coordinates of a flat index k over `dims` (any dims, 1s included): a window position, a block
    position, a tuple of summed Einsum letters."""
    out, rest = [], k
    for d in reversed(dims):
        out.append(rest % d if d > 1 else kir.i32(0))
        rest = rest // d if d > 1 else rest
    return out[::-1]


__all__ = ["emit_loop", "unflatten"]
