"""Elementwise ops: math, activations, comparisons, logic, Where, Clip, Cast.

Each lowers to one Generic op whose expression reads its inputs with numpy
broadcasting; fusion later merges chains of them into one dispatch.
Formulas are written so NaN propagates as onnxruntime does (e.g. Relu uses a
select that keeps NaN, not max()). The activations are plain functions of an
expression (`relu`, `softplus`, `hard_sigmoid`, ...) so the recurrent ops use
the same definitions.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir import kir
from ...ir.kir import Expr, f32, select
from .registry import Unsupported, register
from ...dtypes import storage_of
from .common import INT_BITS, broadcast_shapes, onnx_type


def _keep_nan(x: Expr, value: Expr) -> Expr:
    """`value`, but NaN where x is NaN (WGSL's max/min/sign/pow may drop a NaN; onnxruntime keeps it)."""
    if x.dtype != "f32":
        return value
    return select(kir.unary("isnan", x), x, value)


# --- activations -------------------------------------------------------------------
# One definition each, used by the activation ops below and by the recurrent ops'
# `activations` attribute (rnn.py). Parameters default as the ONNX ops' attributes do.

def relu(x: Expr) -> Expr:
    # a select keeps NaN (max(x, 0) may drop it)
    return select(x < 0.0, f32(0.0), x) if x.dtype == "f32" else kir.maximum(x, 0)


def sigmoid(x: Expr) -> Expr:
    return 1.0 / (1.0 + kir.unary("exp", -x))


def tanh(x: Expr) -> Expr:
    return kir.unary("tanh", x)


def softplus(x: Expr) -> Expr:
    # log(1 + exp(x)) without overflow: max(x, 0) + log(1 + exp(-|x|))
    return select(x > 0.0, x, f32(0.0)) + kir.unary("log", 1.0 + kir.unary("exp", -kir.unary("abs", x)))


def softsign(x: Expr) -> Expr:
    return x / (1.0 + kir.unary("abs", x))


def elu(x: Expr, alpha=1.0) -> Expr:
    return select(x < 0.0, alpha * (kir.unary("exp", x) - 1.0), x)


def leaky_relu(x: Expr, alpha=0.01) -> Expr:
    return select(x < 0.0, alpha * x, x)


def thresholded_relu(x: Expr, alpha=1.0) -> Expr:
    return select(x > alpha, x, f32(0.0))


def hard_sigmoid(x: Expr, alpha=0.2, beta=0.5) -> Expr:
    return _keep_nan(x, kir.maximum(f32(0.0), kir.minimum(f32(1.0), alpha * x + beta)))


def affine(x: Expr, alpha=1.0, beta=0.0) -> Expr:
    """alpha * x + beta: a recurrent activation only (no longer an ONNX op)."""
    return alpha * x + beta


def scaled_tanh(x: Expr, alpha=1.0, beta=1.0) -> Expr:
    """alpha * tanh(beta * x): a recurrent activation only (no longer an ONNX op)."""
    return alpha * kir.unary("tanh", beta * x)


def _given(attrs: dict, *names) -> dict:
    """The node's values of these attributes (the activation's defaults stand for the others)."""
    return {n: attrs[n] for n in names if n in attrs}


def gelu(x: Expr, approximate: str = "none") -> Expr:
    """0.5 x (1 + erf(x / sqrt 2)), or its tanh approximation (`approximate="tanh"`)."""
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + kir.unary("tanh", inner))
    return 0.5 * x * (1.0 + kir.unary("erf", x * (1.0 / math.sqrt(2.0))))


def _unary_rules():
    u = kir.unary
    return {
        "Relu": lambda x, a: relu(x),
        "Sigmoid": lambda x, a: sigmoid(x),
        "Tanh": lambda x, a: tanh(x),
        "Exp": lambda x, a: u("exp", x),
        "Log": lambda x, a: u("log", x),
        "Sqrt": lambda x, a: u("sqrt", x),
        "Abs": lambda x, a: u("abs", x),
        "Neg": lambda x, a: -x,
        "Floor": lambda x, a: u("floor", x),
        "Ceil": lambda x, a: u("ceil", x),
        "Round": lambda x, a: u("round", x),
        "Reciprocal": lambda x, a: 1.0 / x,
        "Sin": lambda x, a: u("sin", x), "Cos": lambda x, a: u("cos", x), "Tan": lambda x, a: u("tan", x),
        "Asin": lambda x, a: u("asin", x), "Acos": lambda x, a: u("acos", x), "Atan": lambda x, a: u("atan", x),
        "Sinh": lambda x, a: u("sinh", x), "Cosh": lambda x, a: u("cosh", x),
        "Asinh": lambda x, a: u("asinh", x), "Acosh": lambda x, a: u("acosh", x), "Atanh": lambda x, a: u("atanh", x),
        "Erf": lambda x, a: u("erf", x),
        "Sign": lambda x, a: _keep_nan(x, u("sign", x)),
        "Softplus": lambda x, a: softplus(x),
        "Softsign": lambda x, a: softsign(x),
        "Not": lambda x, a: u("not", x),
        "BitwiseNot": lambda x, a: u("bnot", x),
        "Elu": lambda x, a: elu(x, **_given(a, "alpha")),
        "Selu": lambda x, a: a.get("gamma", 1.0507009873554805) * select(
            x <= 0.0, a.get("alpha", 1.6732632423543772) * (u("exp", x) - 1.0), x),
        "LeakyRelu": lambda x, a: leaky_relu(x, **_given(a, "alpha")),
        "HardSigmoid": lambda x, a: hard_sigmoid(x, **_given(a, "alpha", "beta")),
        "HardSwish": lambda x, a: _keep_nan(x, x * kir.maximum(f32(0.0), kir.minimum(f32(1.0), x * (1.0 / 6.0) + 0.5))),
        "ThresholdedRelu": lambda x, a: thresholded_relu(x, **_given(a, "alpha")),
        "Celu": lambda x, a: _keep_nan(x, kir.maximum(f32(0.0), x) + kir.minimum(
            f32(0.0), a.get("alpha", 1.0) * (u("exp", x / a.get("alpha", 1.0)) - 1.0))),
        "Shrink": lambda x, a: select(x < -a.get("lambd", 0.5), x + a.get("bias", 0.0),
                                      select(x > a.get("lambd", 0.5), x - a.get("bias", 0.0), f32(0.0))),
        "Gelu": lambda x, a: gelu(x, a.get("approximate", "none")),
        "Mish": lambda x, a: x * tanh(softplus(x)),
        "Identity": lambda x, a: x,
    }


UNARY = _unary_rules()
FLOAT_ONLY = set(UNARY) - {"Relu", "Abs", "Neg", "Sign", "Not", "BitwiseNot", "Identity"}


@register(*UNARY)
def unary(ctx, node):
    x = node.inputs[0]
    if node.op == "Identity" and ctx.const(x) is None:
        ctx.view(node.outputs[0], x, ctx.shape(x))
        return
    dt = ctx.dtype(x)
    if node.op in FLOAT_ONLY and dt != "f32":
        raise Unsupported(f"{node.op} on {dt} tensors")
    rule = UNARY[node.op]
    ctx.generic(node.outputs[0], ctx.shape(x), dt, lambda cs: rule(ctx.read(x, cs), node.attrs))


@register("Dropout")
def dropout(ctx, node):
    x = node.inputs[0]
    ctx.view(node.outputs[0], x, ctx.shape(x))
    if len(node.outputs) > 1 and node.outputs[1]:
        ctx.set_const(node.outputs[1], np.ones(ctx.shape(x), dtype=np.bool_))


@register("IsNaN", "IsInf")
def isnan_isinf(ctx, node):
    x = node.inputs[0]

    def rule(cs):
        v = ctx.read(x, cs)
        if node.op == "IsNaN":
            return kir.unary("isnan", v)
        inf = kir.unary("isinf", v)
        pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
        if pos and neg:
            return inf
        if pos:
            return inf & (v > 0.0)
        if neg:
            return inf & (v < 0.0)
        return kir.const(False, "bool")
    ctx.generic(node.outputs[0], ctx.shape(x), "bool", rule)


def _pow(a: Expr, b: Expr) -> Expr:
    if b.is_const:
        y = b.attr
        if y == 1.0:
            return a
        if y == 2.0:
            return a * a
        if y == 3.0:
            return a * a * a
        if y == 0.5:
            return kir.unary("sqrt", a)
        if y == -1.0:
            return 1.0 / a
        if y == 0.0:
            return f32(1.0)
    ab = kir.unary("abs", a)
    r = kir.binary("pow", ab, b)
    # C/IEEE special cases the GPU's exp2(y * log2(x)) does not honour: pow(+-0, y < 0) = inf,
    # pow(x, +-inf) = inf or 0 by |x| < 1, pow(+-1, +-inf) = 1
    inf = f32(math.inf)
    r = select(kir.binary("and", kir.binary("eq", ab, f32(0.0)), b < 0.0), inf, r)
    r = select(kir.unary("isinf", b), select(kir.binary("eq", ab, f32(1.0)), f32(1.0),
                                             select(kir.binary("eq", ab < 1.0, b < 0.0), inf, f32(0.0))), r)
    is_int = kir.binary("eq", kir.unary("floor", b), b)
    odd = kir.binary("ne", kir.unary("floor", b * 0.5) * 2.0, b)
    neg_result = select(is_int, select(odd, -r, r), f32(math.nan))
    out = select(a < 0.0, neg_result, r)
    out = _keep_nan(a, _keep_nan(b, out))      # pow(NaN, y) and pow(x, NaN) are NaN ...
    out = select(kir.binary("eq", a, f32(1.0)), f32(1.0), out)      # ... except pow(1, y) = 1
    return select(kir.binary("eq", b, f32(0.0)), f32(1.0), out)   # ... and pow(x, 0) = 1


def _mod(a: Expr, b: Expr, fmod: int) -> Expr:
    if a.dtype == "f32":
        if fmod:   # C fmod: fmod(x, +-inf) = x for finite x
            return select(kir.binary("and", kir.unary("isinf", b), kir.unary("not", kir.unary("isinf", a))), a, a % b)
        # WGSL's x % y is x - y * trunc(x / y): NaN for an infinite y, where the remainder is x
        finite_a = kir.unary("not", kir.binary("or", kir.unary("isinf", a), kir.unary("isnan", a)))
        r = select(kir.binary("and", kir.unary("isinf", b), finite_a), a, a % b)
        return select(kir.binary("and", kir.binary("ne", r, f32(0.0)), kir.binary("ne", r < 0.0, b < 0.0)), r + b, r)
    zero = kir.const(0, a.dtype)
    r = select(kir.binary("eq", b, zero), zero, a % b)
    if fmod or a.dtype == "u32":
        return r
    return select(kir.binary("and", kir.binary("ne", r, zero), kir.binary("ne", r < zero, b < zero)), r + b, r)


BINARY = {
    "Add": lambda a, b, n: a + b,
    "Sub": lambda a, b, n: a - b,
    "Mul": lambda a, b, n: a * b,
    "Div": lambda a, b, n: a / b if a.dtype == "f32" else select(kir.binary("eq", b, kir.const(0, b.dtype)),
                                                                 kir.const(0, a.dtype), a / b),
    "Pow": lambda a, b, n: _pow(a, kir.cast(b, "f32")) if a.dtype == "f32" else kir.cast(
        kir.unary("round", _pow(kir.cast(a, "f32"), kir.cast(b, "f32"))), a.dtype),
    "Mod": lambda a, b, n: _mod(a, b, n.attr("fmod", 0)),
    "And": lambda a, b, n: kir.binary("and", a, b),
    "Or": lambda a, b, n: kir.binary("or", a, b),
    "Xor": lambda a, b, n: kir.binary("ne", a, b),
    "Equal": lambda a, b, n: kir.binary("eq", a, b),
    "Less": lambda a, b, n: a < b,
    "LessOrEqual": lambda a, b, n: a <= b,
    "Greater": lambda a, b, n: a > b,
    "GreaterOrEqual": lambda a, b, n: a >= b,
    "BitwiseAnd": lambda a, b, n: kir.binary("band", a, b),
    "BitwiseOr": lambda a, b, n: kir.binary("bor", a, b),
    "BitwiseXor": lambda a, b, n: kir.binary("bxor", a, b),
    "PRelu": lambda a, b, n: select(a < 0.0, a * b, a),
}
BOOL_RESULT = {"And", "Or", "Xor", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}


@register(*BINARY)
def binary(ctx, node):
    a, b = node.inputs[0], node.inputs[1]
    if node.op in ("And", "Or", "Xor") and (ctx.dtype(a) != "bool" or ctx.dtype(b) != "bool"):
        raise Unsupported("logical ops need bool inputs")
    if node.op.startswith("Bitwise") and ctx.dtype(a) not in ("i32", "u32"):
        raise Unsupported(f"{node.op} on {ctx.dtype(a)}")
    out_shape = broadcast_shapes(ctx.shape(a), ctx.shape(b))
    rule = BINARY[node.op]
    dt = "bool" if node.op in BOOL_RESULT else ctx.dtype(a)
    ctx.generic(node.outputs[0], out_shape, dt,
                lambda cs: rule(ctx.read_bcast(a, out_shape, cs), ctx.read_bcast(b, out_shape, cs), node))


@register("BitShift")
def bitshift(ctx, node):
    a, b = node.inputs[0], node.inputs[1]
    dt = ctx.dtype(a)
    if dt not in ("i32", "u32"):
        raise Unsupported(f"BitShift on {dt} tensors")
    bits, signed = INT_BITS.get(onnx_type(ctx, a), (32, dt == "i32"))
    left = node.attr("direction") == "LEFT"
    out_shape = broadcast_shapes(ctx.shape(a), ctx.shape(b))

    def rule(cs):
        x, y = ctx.read_bcast(a, out_shape, cs), ctx.read_bcast(b, out_shape, cs)
        yi = kir.cast(y, "i32") if y.dtype != "i32" else y
        y = kir.cast(y, dt)
        zero = kir.const(0, dt)
        if left:
            v = kir.binary("shl", x, y)
            if bits < 32:   # keep the low `bits` bits, sign-extended for a signed type
                v = kir.binary("shl", v, kir.i32(32 - bits))
                v = kir.binary("shr", v, kir.i32(32 - bits)) if signed else \
                    kir.cast(kir.binary("shr", kir.bitcast(v, "u32"), kir.const(32 - bits, "u32")), dt)
            fill = zero
        else:
            v = kir.binary("shr", x, y)
            fill = select(x < zero, kir.const(-1, dt), zero) if signed and dt == "i32" else zero
        # (a 64-bit type is narrowed to 32 bits: its values fit, so shifting by 32..63 leaves 0 or -1)
        in_range = kir.binary("and", yi >= 0, yi < min(bits, 32))
        return select(in_range, v, fill)
    ctx.generic(node.outputs[0], out_shape, dt, rule)


@register("Max", "Min", "Sum", "Mean")
def variadic(ctx, node):
    names = [i for i in node.inputs if i]
    out_shape = broadcast_shapes(*[ctx.shape(n) for n in names])
    dt = ctx.dtype(names[0])

    def rule(cs):
        vals = [ctx.read_bcast(n, out_shape, cs) for n in names]
        acc = vals[0]
        for v in vals[1:]:
            if node.op == "Max":
                acc = select(kir.binary("or", acc > v, kir.unary("isnan", acc)), acc, v) if dt == "f32" \
                    else kir.maximum(acc, v)
            elif node.op == "Min":
                acc = select(kir.binary("or", acc < v, kir.unary("isnan", acc)), acc, v) if dt == "f32" \
                    else kir.minimum(acc, v)
            else:
                acc = acc + v
        if node.op == "Mean":
            acc = acc / float(len(vals)) if dt == "f32" else acc / len(vals)
        return acc
    ctx.generic(node.outputs[0], out_shape, dt, rule)


@register("Where")
def where(ctx, node):
    c, x, y = node.inputs[:3]
    out_shape = broadcast_shapes(ctx.shape(c), ctx.shape(x), ctx.shape(y))
    ctx.generic(node.outputs[0], out_shape, ctx.dtype(x),
                lambda cs: select(ctx.read_bcast(c, out_shape, cs), ctx.read_bcast(x, out_shape, cs),
                                  ctx.read_bcast(y, out_shape, cs)))


@register("Clip")
def clip(ctx, node):
    x = node.inputs[0]
    dt = ctx.dtype(x)
    lo_name, hi_name = node.input(1), node.input(2)
    if ctx.opset < 11:
        lo = kir.const(node.attr("min", -3.4028234663852886e38), dt)
        hi = kir.const(node.attr("max", 3.4028234663852886e38), dt)
        lo_name = hi_name = ""
    else:
        lo = ctx.read_flat(lo_name, kir.i32(0)) if lo_name else None
        hi = ctx.read_flat(hi_name, kir.i32(0)) if hi_name else None

    def rule(cs):
        v = ctx.read(x, cs)
        if lo is not None:
            v = select(v < lo, lo, v)
        if hi is not None:
            v = select(v > hi, hi, v)
        return v
    ctx.generic(node.outputs[0], ctx.shape(x), dt, rule)


@register("Cast", "CastLike")
def cast(ctx, node):
    x = node.inputs[0]
    if node.op == "Cast":
        to = node.attr("to")
    else:
        like = node.inputs[1]
        to = ctx.graph.types[like].elem_type if like in ctx.graph.types else ctx.onnx_types.get(like)
        if to is None:
            c = ctx.const(like)
            if c is not None:
                from onnx import helper
                to = helper.np_dtype_to_tensor_dtype(c.dtype)
            else:   # an intermediate whose ONNX type inference did not record: its storage type says enough
                to = {"f32": 1, "i32": 6, "u32": 12, "bool": 9}[ctx.dtype(like)]
    if to == 11 and node.outputs[0] not in ctx.graph.outputs:
        to = 1   # a float64 intermediate is computed in float32 (WGSL has no f64)
    target = storage_of(to)
    if target is None:
        raise Unsupported(f"Cast to ONNX type {to} (WebGPU computes in 32-bit types)")
    src = ctx.dtype(x)
    ctx.onnx_types[node.outputs[0]] = to

    def rule(cs):
        v = ctx.read(x, cs)
        if src == "f32" and target in ("i32", "u32"):
            # ONNX truncates toward zero; NaN/inf have no defined result
            return kir.cast(kir.unary("trunc", v), target)
        if to in (2, 3, 4, 5) and src == "i32":  # narrowing integer casts wrap
            bits, signed = {2: (8, False), 3: (8, True), 4: (16, False), 5: (16, True)}[to]
            shift = 32 - bits
            v = kir.binary("shl", v, kir.i32(shift))
            return kir.binary("shr", v, kir.i32(shift)) if signed else \
                kir.cast(kir.binary("shr", kir.bitcast(v, "u32"), kir.const(shift, "u32")), "i32")
        return kir.cast(v, target)
    ctx.generic(node.outputs[0], ctx.shape(x), target, rule)
