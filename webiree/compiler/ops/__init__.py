"""The op registry: one ONNX op, one place (DESIGN.md contract 1).

Each handler is a plain function `handler(ctx, node)` registered under its
ONNX op type(s). It reads attributes with their ONNX defaults (and the
opset-dependent input/attribute forms), applies the op's shape rule and emits
canonical ops through the `Lowering` context (`ctx.generic`, `ctx.view`,
`ctx.anchor`, `ctx.set_const`). An op variant that cannot be compiled raises
`Unsupported` with the reason; lowering collects every such node into one
error.
"""

from __future__ import annotations

OPS: dict = {}


class Unsupported(Exception):
    """This node uses a variant of its op that webiree cannot compile."""


def register(*names):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn
    return deco


def never_fold(op: str) -> bool:
    return False


from . import elementwise, shape, contraction, conv, reduce, resize  # noqa: E402,F401  (registers handlers)
from . import control, loops, ml, movement, norms, quant, rnn  # noqa: E402,F401
