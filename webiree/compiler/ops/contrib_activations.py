"""onnxruntime's contrib activations (domain com.microsoft): Gelu, FastGelu, BiasGelu,
QuickGelu, BiasAdd, BiasSplitGelu.

Each is one Generic op built from elementwise.py's activation functions, so fusion
folds it into the MatMul before it like any ONNX activation. Semantics follow
onnxruntime's contrib-operator documentation and CPU kernels
(onnxruntime/contrib_ops/cpu/activations.h, bert/bias_gelu.cc); BiasAdd and
BiasSplitGelu have only GPU kernels there, and follow its documentation.
"""

from __future__ import annotations

from ...errors import ShapeError
from .common import broadcast_shapes, require_float
from .elementwise import gelu, sigmoid
from .registry import register

MS = "com.microsoft."


def _with_bias(ctx, node, names):
    """The broadcast shape of `names` and a rule reading their sum at output coordinates."""
    for n in names:
        require_float(ctx, node, n)
    shape = broadcast_shapes(*[ctx.shape(n) for n in names])

    def total(cs):
        acc = None
        for n in names:
            v = ctx.read_bcast(n, shape, cs)
            acc = v if acc is None else acc + v
        return acc
    return shape, total


@register(MS + "Gelu")
def ms_gelu(ctx, node):
    """Y = 0.5 X (1 + erf(X / sqrt 2))."""
    shape, x = _with_bias(ctx, node, [node.inputs[0]])
    ctx.generic(node.outputs[0], shape, "f32", lambda cs: gelu(x(cs)))


@register(MS + "BiasGelu")
def bias_gelu(ctx, node):
    """C = Gelu(A + B), the erf form; B is broadcast (a bias over the last dim)."""
    shape, x = _with_bias(ctx, node, node.inputs[:2])
    ctx.generic(node.outputs[0], shape, "f32", lambda cs: gelu(x(cs)))


@register(MS + "FastGelu")
def fast_gelu(ctx, node):
    """Y = Gelu(X + bias) in its tanh approximation; the bias input is optional."""
    shape, x = _with_bias(ctx, node, [n for n in node.inputs[:2] if n])
    ctx.generic(node.outputs[0], shape, "f32", lambda cs: gelu(x(cs), "tanh"))


@register(MS + "QuickGelu")
def quick_gelu(ctx, node):
    """Y = X * sigmoid(alpha X), alpha 1.702 by default."""
    alpha = float(node.attr("alpha", 1.702))
    shape, x = _with_bias(ctx, node, [node.inputs[0]])
    ctx.generic(node.outputs[0], shape, "f32", lambda cs: (lambda v: v * sigmoid(alpha * v))(x(cs)))


@register(MS + "BiasAdd")
def bias_add(ctx, node):
    """Y = X + bias + skip: X and skip [N, S, C], bias [C]."""
    x, bias, skip = node.inputs[:3]
    if len(ctx.shape(x)) != 3 or ctx.shape(skip) != ctx.shape(x) or list(ctx.shape(bias)) != [ctx.shape(x)[-1]]:
        raise ShapeError(f"BiasAdd needs X and skip of one shape [N, S, C] and bias [C], got "
                         f"{ctx.shape(x)}, {ctx.shape(skip)} and {ctx.shape(bias)}")
    shape, total = _with_bias(ctx, node, [x, bias, skip])
    ctx.generic(node.outputs[0], shape, "f32", total)


@register(MS + "BiasSplitGelu")
def bias_split_gelu(ctx, node):
    """A = X + bias split in halves along the last dim; Y = left half * Gelu(right half) (erf form).
    X [N, S, D], bias [D], Y [N, S, D / 2]."""
    x, bias = node.inputs[:2]
    s = list(ctx.shape(x))
    if len(s) != 3 or s[-1] % 2 or list(ctx.shape(bias)) != [s[-1]]:
        raise ShapeError(f"BiasSplitGelu needs X [N, S, D] with D even and bias [D], got {tuple(s)} and "
                         f"{ctx.shape(bias)}")
    require_float(ctx, node, x)
    require_float(ctx, node, bias)
    half = s[-1] // 2

    def rule(cs):
        n, i, c = cs
        left = ctx.read(x, [n, i, c]) + ctx.read(bias, [c])
        right = ctx.read(x, [n, i, c + half]) + ctx.read(bias, [c + half])
        return left * gelu(right)
    ctx.generic(node.outputs[0], s[:-1] + [half], "f32", rule)
