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

# each module registers its handlers
from . import contraction, control, conv, elementwise, ml, movement, norms, pool, quant, reduce, resize  # noqa: F401
from . import contrib_activations, contrib_attention, contrib_fused, contrib_norms, contrib_quant  # noqa: F401
from . import rnn, shape, spectral  # noqa: F401
from .registry import OPS, Unsupported, register

__all__ = ["OPS", "Unsupported", "register"]
