"""Quantization: QuantizeLinear, DequantizeLinear (per tensor, per axis,
blocked), MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv, and BitCast.

8- and 16-bit integers live in i32 storage. A MatMulInteger or QLinearMatMul whose B is a
constant matrix (what quantize_dynamic and the QOperator format write) is one exact integer
product (`integer_product`: MatMul.int8, four values of K a word, dot4I8Packed); so is a pointwise
ConvInteger, QLinearConv or QDQ Conv of one image with constant 8-bit weights (`integer_conv`,
`qdq_conv`: the weights are A, the image's channels packed four to a word are B), and a QDQ MatMul or
Gemm with constant 8-bit weights (`qdq_matmul`). Other integer
products are summed in f32 by the MatMul and Conv kinds: exact while every partial sum stays
below 2^24 in magnitude (8-bit operands and K up to 256 always do), then rounded back to
integers. DynamicQuantizeLinear computes its ONNX function's values with one
reduction for both the minimum and the maximum (the minimum of x and of -x).
"""

from __future__ import annotations

from ...ir import program as P
from ...ir.program import MatMul, QuantizeWords, numel
from ...ir.sym import ceildiv, upper
from .. import symbolic

import itertools

import numpy as np
from onnx import helper

from ...errors import ShapeError
from ...ir import kir
from ..graph import Node, internal_dtype
from .registry import Unsupported, register
from ...dtypes import BY_ONNX
from .common import INT_BITS, onnx_type, window_pads

# DynamicQuantizeLinear's range: a long input is reduced in SPLIT slices at once (one dispatch, a
# GPU's workgroups each taking one), and the slices' results are reduced where they are read
# (16 loads, hoisted to the top of each kernel that reads the scale: kir.hoist_invariants). On the
# H200, quantize_dynamic MiniLM ran in 2.06 ms with 8 slices and 2.46 ms with 64 (its readers then
# take 128 loads each; the same GPU time in sum); lavapipe ran 8, 32 and 64 alike (0.85-0.89x f32).
SPLIT, SPLIT_FROM = 8, 8192
# A static x of n % 4 == 0 values up to this many is quantized by one QuantizeWords dispatch
# instead (range and packing together, each workgroup reducing the whole of x: _quantize_words);
# At the bound each of a CPU renderer's 4 x 64 invocations (config.py _range_pack) scans 4,096
# iterations of four vec4s (kernels/matmul_int8.py range_unroll) and packs 4,096 words, far inside
# llvmpipe's 65,535 iterations; beyond it the sliced reduction below spreads the range wider.
WORDS_UP_TO = 1 << 22
QRANGE = {2: (0, 255), 3: (-128, 127), 4: (0, 65535), 5: (-32768, 32767)}
_ids = itertools.count()


def _param_coords(ctx, name, x_shape, axis, block, cs):
    """Coordinates into a scale / zero point that is a scalar, per `axis`, or blocked along `axis`."""
    ps = list(ctx.shape(name))
    if len(ps) == 0 or numel(ps) == 1 and len(ps) <= 1:
        return [kir.i32(0)] * len(ps)
    if block:
        return [c // block if i == axis else c for i, c in enumerate(cs)]
    if len(ps) == 1:
        return [cs[axis]]
    raise ShapeError(f"a scale of shape {tuple(ps)} fits neither per-tensor nor per-axis quantization of {x_shape}")


def _operands(ctx, node):
    """(x, scale, zero point or None, x's shape, axis, block size) of a (De)QuantizeLinear."""
    x, scale = node.inputs[:2]
    s = ctx.shape(x)
    axis = int(node.attr("axis", 1))          # (only used by per-axis / blocked parameters)
    return x, scale, node.input(2), s, axis + len(s) if axis < 0 else axis, int(node.attr("block_size", 0))


@register("QuantizeLinear")
def quantize(ctx, node):
    x, scale, zp, s, axis, block = _operands(ctx, node)
    to = int(node.attr("output_dtype", 0)) or (onnx_type(ctx, zp) if zp else 2)
    if to not in QRANGE:
        raise Unsupported(f"QuantizeLinear to ONNX type {to}")
    lo, hi = QRANGE[to]

    def rule(cs):
        v = ctx.read(x, cs) / ctx.read(scale, _param_coords(ctx, scale, s, axis, block, cs))
        q = kir.cast(kir.unary("round", v), "i32")       # WGSL round: half to even, as np.rint
        if zp:
            q = q + kir.cast(ctx.read(zp, _param_coords(ctx, zp, s, axis, block, cs)), "i32")
        return kir.clamp(q, lo, hi)
    ctx.generic(node.outputs[0], s, "i32", rule)
    ctx.onnx_types[node.outputs[0]] = to


@register("DequantizeLinear")
def dequantize(ctx, node):
    x, scale, zp, s, axis, block = _operands(ctx, node)
    out_t = int(node.attr("output_dtype", 0)) or 1
    if out_t != 1:
        raise Unsupported(f"DequantizeLinear to ONNX type {out_t}")
    if ctx.dtype(x) not in ("i32", "u32"):
        raise Unsupported(f"DequantizeLinear of {ctx.dtype(x)} tensors")

    def rule(cs):
        v = kir.cast(ctx.read(x, cs), "f32")
        if zp:
            v = v - kir.cast(ctx.read(zp, _param_coords(ctx, zp, s, axis, block, cs)), "f32")
        return v * ctx.read(scale, _param_coords(ctx, scale, s, axis, block, cs))
    ctx.generic(node.outputs[0], s, "f32", rule)


@register("DynamicQuantizeLinear")
def dynamic_quantize(ctx, node):
    """The ONNX function's values: range [min(x, 0), max(x, 0)] -> scale = range / 255, zero point
    round(clip(-min / scale, 0, 255)) (half to even), y = saturate(round(x / scale) + zero point)."""
    x = node.inputs[0]
    y, y_scale, y_zp = (list(node.outputs) + ["", ""])[:3]
    s = ctx.shape(x)
    n = numel(s)
    if not symbolic.is_symbolic(n) and n % 4 == 0 and 0 < n <= WORDS_UP_TO and ctx.dtype(x) == "f32":
        _quantize_words(ctx, x, n, y, y_scale, y_zp)
        return
    # [x; -x]: one ReduceMin gives min(x) and -max(x). A long x is reduced over SPLIT slices, so a
    # GPU runs it on that many workgroups, and the slices' minima are taken by their readers
    # (+inf fills the last slice's tail: it changes no minimum).
    parts = SPLIT if upper(n) >= SPLIT_FROM else 1
    length = ceildiv(n, parts)

    def x_and_neg_x(cs):
        i = cs[1] * length + cs[2]
        v = ctx.read_flat(x, kir.minimum(i, n - 1))
        v = kir.select(kir.binary("eq", cs[0], 0), v, -v)
        return v if parts == 1 else kir.select(i < n, v, kir.f32(float("inf")))
    both = ctx.temp("x_and_neg_x")
    ctx.generic(both, (2, parts, length), "f32", x_and_neg_x)
    low = ctx.temp("min_and_neg_max")
    steps = [_node(ctx, "ReduceMin", [both], [low], opset=13, keepdims=0, axes=[2])]
    ctx.expand(steps + [Node(f"{ctx.node.name}/params", "DynamicQuantizeParams", [x, low], [y, y_scale or ctx.temp("scale"),
                     y_zp or ctx.temp("zero_point")], {}, "webiree", None, ctx.node.opset)])


def _quantize_words(ctx, x, n, y, y_scale, y_zp):
    """DynamicQuantizeLinear as one QuantizeWords dispatch (ir/program.py): the range, the
    parameters and y packed as the words an integer product reads (`_words_of` finds them under
    y's name), the scale and zero point in the two words after them. y itself, where something
    other than an integer product reads it, is unpacked from the words where it is read."""
    words = f"{y}:words"
    ctx.anchor(QuantizeWords(name=ctx.node.name, out=words, nodes=[ctx.node.name], x=ctx.buffer(x), n=n), [n // 4 + 2], "u32")
    tail = kir.i32(n // 4)
    if y_scale:
        ctx.generic(y_scale, (), "f32", lambda cs: kir.bitcast(ctx.read_flat(words, tail), "f32"))
        ctx.onnx_types[y_scale] = 1
    if y_zp:
        ctx.generic(y_zp, (), "i32", lambda cs: kir.cast(ctx.read_flat(words, tail + 1), "i32"))
        ctx.onnx_types[y_zp] = 2
    if y:
        def unpack(cs):
            i = P.flat_of(cs, ctx.shape(x))
            word = ctx.read_flat(words, i // 4)
            byte = kir.binary("band", kir.binary("shr", word, kir.cast(i % 4 * 8, "u32")), kir.const(0xFF, "u32"))
            return kir.cast(kir.binary("bxor", byte, kir.const(0x80, "u32")), "i32")   # (q - 128) & 255 = q ^ 128
        ctx.generic(y, ctx.shape(x), "i32", unpack)
        ctx.onnx_types[y] = 2


@register("webiree.DynamicQuantizeParams")
def dynamic_quantize_params(ctx, node):
    x, low = node.inputs
    y, y_scale, y_zp = node.outputs
    parts = ctx.shape(low)[1]          # [2, slices]: min(x) and -max(x) of each slice
    x_min, neg_max = kir.f32(0.0), kir.f32(0.0)
    for p in range(parts):
        x_min = kir.minimum(ctx.read(low, [kir.i32(0), kir.i32(p)]), x_min)
        neg_max = kir.minimum(ctx.read(low, [kir.i32(1), kir.i32(p)]), neg_max)
    ctx.generic(y_scale, (), "f32", lambda cs: P.dynamic_quant_scale(x_min, neg_max))
    ctx.onnx_types[y_scale] = 1
    scale = ctx.read_flat(y_scale, kir.i32(0))
    ctx.generic(y_zp, (), "i32", lambda cs: P.dynamic_quant_zero_point(x_min, scale))
    ctx.onnx_types[y_zp] = 2
    zp = ctx.read_flat(y_zp, kir.i32(0))
    ctx.generic(y, ctx.shape(x), "i32", lambda cs: P.dynamic_quant_value(ctx.read(x, cs), scale, zp))
    ctx.onnx_types[y] = 2


def _node(ctx, op, inputs, outputs, opset=18, **attrs) -> Node:
    """A helper node at a fixed opset (so its input/attribute forms are known)."""
    proto = helper.make_node(op, list(inputs), list(outputs), **attrs)
    from ..expand import to_node
    return to_node(proto, f"{ctx.node.name}/{op}_{next(_ids)}", opset)


def _centered(ctx, x, zp, axis_of_zp):
    """f32 (x - zero point); a 1-D zero point applies along `axis_of_zp` of x."""
    out = ctx.temp("centered")
    s = ctx.shape(x)

    def rule(cs):
        v = kir.cast(ctx.read(x, cs), "f32")
        if zp:
            zs = ctx.shape(zp)
            c = [kir.i32(0)] * len(zs) if numel(zs) == 1 else [cs[axis_of_zp % len(s)]]
            v = v - kir.cast(ctx.read(zp, c), "f32")
        return v
    ctx.generic(out, s, "f32", rule)
    return out


def _to_int32(ctx, src, out):
    ctx.generic(out, ctx.shape(src), "i32", lambda cs: kir.cast(kir.unary("round", ctx.read(src, cs)), "i32"))
    ctx.onnx_types[out] = 6


def _scalar_zero_point(ctx, zp):
    """A zero point as one number: 0 without one, the value of a constant one that is per tensor
    (or the same for every channel); None for a run-time or a varying one."""
    if not zp:
        return 0
    c = ctx.const(zp)
    if c is None or symbolic.is_symbolic(c):
        return None
    c = np.asarray(c).astype(np.int64).reshape(-1)
    return int(c[0]) if c.size and (c == c[0]).all() else None


def integer_product(ctx, node, a, b, a_zp, b_zp, out) -> bool:
    """out (int32) = (A - a_zp) @ (B - b_zp) as one exact integer product (MatMul.int8,
    kernels/matmul_int8.py), where B is a constant [K, N] matrix of 8-bit integers, K a multiple
    of 4, b_zp a constant per tensor and a_zp a scalar: B' (B - 128 if unsigned) packed as words
    of 4 values of K, and the zero point of A applied in the epilogue through the columns' sums
    (sum (A' - za')(B' - zb') = [sum A'B' - zb' sum A'] - za' [sum B' - K zb'], the bracket the
    kernel's). Returns False (nothing emitted) where the product does not have that form."""
    w = ctx.const(b)
    sa = list(ctx.shape(a))
    if w is None or symbolic.is_symbolic(w) or np.asarray(w).dtype not in (np.int8, np.uint8) or w.ndim != 2:
        return False
    if onnx_type(ctx, a) not in (2, 3) or len(sa) < 2 or sa[-1] != w.shape[0] or w.shape[0] % 4:
        return False
    zb = _scalar_zero_point(ctx, b_zp)
    if zb is None or (a_zp and numel(ctx.shape(a_zp)) != 1):
        return False
    K, N = w.shape
    a_unsigned, b_unsigned = onnx_type(ctx, a) == 2, w.dtype == np.uint8
    wp = np.asarray(w).astype(np.int32) - (128 if b_unsigned else 0)
    zbp = zb - (128 if b_unsigned else 0)
    words, sums = ctx.temp("words"), ctx.temp("column_sums")
    ctx.set_const(words, _pack_bytes(wp, 0))
    ctx.set_const(sums, (wp.sum(axis=0) - K * zbp).astype(np.int32))
    ctx.tensors[ctx.buffer(words)].form = "u8" if b_unsigned else "i8"     # (as inspect reports the weights)
    rows = numel(sa[:-1])
    raw = ctx.temp("int_product")
    ctx.anchor(MatMul(name=node.name, out=raw, nodes=[node.name], a=_words_of(ctx, a, rows, K, a_unsigned),
                      b=ctx.buffer(words), m=rows, n=N, k=K, int8=True, a_words=True, b_zero=zbp), [rows, N], "i32")
    shape = sa[:-1] + [N]
    product = ctx.temp("int_product_view")
    ctx.view(product, raw, shape)
    shift = 128 if a_unsigned else 0

    def rule(cs):
        za = kir.cast(ctx.read_flat(a_zp, kir.i32(0)), "i32") - shift if a_zp else kir.i32(-shift)
        return ctx.read(product, cs) - za * ctx.read(sums, [cs[-1]])
    ctx.generic(out, shape, "i32", rule)
    ctx.onnx_types[out] = 6
    return True


def _pack_bytes(values: np.ndarray, axis: int) -> np.ndarray:
    """Signed bytes (int32 values in [-128, 127]) four to a u32 word along `axis` (its length a
    multiple of 4), the first in the lowest byte: the words dot4I8Packed reads."""
    v = np.moveaxis(values, axis, -1)
    lanes = (v.reshape(*v.shape[:-1], -1, 4) & 0xFF).astype(np.uint32) << (8 * np.arange(4, dtype=np.uint32))
    return np.ascontiguousarray(np.moveaxis(np.bitwise_or.reduce(lanes, axis=-1).astype(np.uint32), -1, axis))


def _words_of(ctx, a, rows, K, unsigned) -> str:
    """A [rows, K] of 8-bit integers as words [rows, K/4] of A' (A - 128 if unsigned) as signed
    bytes: one Generic, shared by every product of the same A (quantize_dynamic's Q, K and V). It
    stays a dispatch of its own (passes.fuse leaves an integer product's words stored): computed
    in each product's loads, A would be quantized again by every workgroup of output columns."""
    name = f"{ctx.root(a)}:words"
    if ctx.has(name):
        return name
    shift = 128 if unsigned else 0
    ctx.generic(name, (rows, K // 4), "u32", lambda cs: kir.pack4i8(
        *(ctx.read_flat(a, cs[0] * K + cs[1] * 4 + q) - shift for q in range(4))))
    return name


def integer_conv(ctx, node, x, x_zp, w, w_zp, out) -> bool:
    """out (int32) = Conv(x - x_zp, w - w_zp) for a pointwise convolution (1x1, stride 1, no pads,
    one group) of one image of 8-bit x with C % 4 == 0 channels and a constant 8-bit w whose zero
    point is 0 (128 for uint8 weights), as one exact integer product (MatMul.int8): A = w' [O, C]
    as words of four channels (packed at build time), B = x' [C/4, H*W] the image's words of four
    channels a pixel (`_channel_words`, packed once), x's zero point through the kernel's row sums
    (b_zero): sum_c w'(x' - zx') with x' = x - 128 for uint8 x. quantize_static's weights are
    symmetric; other zero points of w, several images or symbolic sizes return False (nothing
    emitted) and take the f32 sum."""
    wc, xs = ctx.const(w), list(ctx.shape(x))
    if wc is None or symbolic.is_symbolic(wc) or np.asarray(wc).dtype not in (np.int8, np.uint8):
        return False
    if ctx.const(x) is not None or onnx_type(ctx, x) not in (2, 3) or len(xs) < 3 or symbolic.is_symbolic(numel(xs)):
        return False
    ws, nd = wc.shape, len(xs) - 2
    if xs[0] != 1 or len(ws) != len(xs) or any(k != 1 for k in ws[2:]) or ws[1] != xs[1] or xs[1] % 4 \
            or list(node.attr("kernel_shape", ws[2:])) != list(ws[2:]):
        return False    # (a kernel_shape at odds with the weights is the f32 path's ShapeError)
    if int(node.attr("group", 1)) != 1 or any(s != 1 for s in node.attr("strides", [1] * nd)) \
            or any(window_pads(node, xs[2:], [1] * nd, [1] * nd, [1] * nd)):
        return False
    w_shift, x_shift = (128 if wc.dtype == np.uint8 else 0), (128 if onnx_type(ctx, x) == 2 else 0)
    zw, zx = _scalar_zero_point(ctx, w_zp), _scalar_zero_point(ctx, x_zp)
    if zw is None or zw != w_shift or zx is None:
        return False
    O, C, pixels = ws[0], ws[1], numel(xs[2:])
    wp = np.asarray(wc).reshape(O, C).astype(np.int32) - w_shift
    words = ctx.temp("weight_words")
    ctx.set_const(words, _pack_bytes(wp, 1))
    ctx.tensors[ctx.buffer(words)].form = "u8" if w_shift else "i8"     # (as inspect reports the weights)
    raw = ctx.temp("int_conv")
    ctx.anchor(MatMul(name=node.name, out=raw, nodes=[node.name], a=ctx.buffer(words),
                      b=_channel_words(ctx, x, C, pixels, x_shift), m=O, n=pixels, k=C, int8=True,
                      a_words=True, b_zero=zx - x_shift), [O, pixels], "i32")
    ctx.view(out, raw, [1, O] + xs[2:])
    ctx.onnx_types[out] = 6
    return True


def _channel_words(ctx, x, C, pixels, shift) -> str:
    """x [1, C, pixels] of 8-bit integers as words [C/4, pixels]: x' (x - shift) of four channels
    of a pixel as signed bytes, one Generic shared by the products that read x (stored, like
    `_words_of`: computed in a product's loads, x would be packed again by every row of tiles)."""
    name = f"{ctx.root(x)}:channel_words"
    if ctx.has(name):
        return name
    ctx.generic(name, (C // 4, pixels), "u32", lambda cs: kir.pack4i8(
        *(ctx.read_flat(x, (cs[0] * 4 + q) * pixels + cs[1]) - shift for q in range(4))))
    return name


def _qdq_pair(ctx, node):
    """(DequantizeLinear of the first input, of the second, x's scale, w's scales as f32 [n] or [1])
    where both operands of `node` are dequantized with constant scales, the first per tensor and not
    blocked; None otherwise."""
    da, dw = ctx.producer(node.inputs[0]), ctx.producer(node.inputs[1])
    if da is None or dw is None or any(d.op != "DequantizeLinear" or d.domain not in ("", "ai.onnx") or
                                       int(d.attr("block_size", 0)) for d in (da, dw)):
        return None
    sa, sw = ctx.const(da.inputs[1]), ctx.const(dw.inputs[1])
    if sa is None or sw is None or symbolic.is_symbolic(sa) or symbolic.is_symbolic(sw) or np.asarray(sa).size != 1:
        return None
    return da, dw, np.float32(np.asarray(sa).reshape(-1)[0]), np.asarray(sw, np.float32).reshape(-1)


def qdq_conv(ctx, node) -> bool:
    """A Conv of DequantizeLinear(x8) and DequantizeLinear(w8) (a QDQ graph: quantize_static) as
    `integer_conv` of x8 and w8, scaled by x_scale * w_scale[o] and plus the bias (itself a
    dequantized int32 in such graphs), all in the product's epilogue: what onnxruntime's QDQ
    transformer makes of it (a QLinearConv), with the requantization left to the QuantizeLinear
    that follows. Scales must be constants, x's per tensor, w's per tensor or per output channel.
    False (nothing emitted) for any other Conv."""
    pair = _qdq_pair(ctx, node)
    if pair is None:
        return False
    dx, dw, sx, sw = pair
    O = ctx.shape(node.inputs[1])[0]
    axis = int(dw.attr("axis", 1))
    if sw.size != 1 and (sw.size != O or axis not in (0, -len(ctx.shape(dw.inputs[0])))):
        return False
    acc = ctx.temp("int_conv")
    if not integer_conv(ctx, node, dx.inputs[0], dx.input(2), dw.inputs[0], dw.input(2), acc):
        return False
    _scaled(ctx, node, acc, sx * np.broadcast_to(sw, (O,)), 1, node.input(2))
    return True


def qdq_matmul(ctx, node) -> bool:
    """A MatMul (or a Gemm with alpha = beta = 1 and A not transposed) of DequantizeLinear(a8) and
    DequantizeLinear(w8) with constant 8-bit weights, w's scale per tensor or per output column:
    `integer_product` of a8 and w8 (transposed at build time under transB), times a_scale *
    w_scale[n], plus a Gemm's C, in the product's epilogue. False (nothing emitted) otherwise."""
    gemm = node.op == "Gemm"
    if gemm and (node.attr("transA", 0) or float(node.attr("alpha", 1.0)) != 1.0 or float(node.attr("beta", 1.0)) != 1.0):
        return False
    pair = _qdq_pair(ctx, node)
    if pair is None:
        return False
    da, dw, sa, sw = pair
    w = ctx.const(dw.inputs[0])
    if w is None or symbolic.is_symbolic(w) or np.asarray(w).ndim != 2:
        return False
    trans = gemm and bool(node.attr("transB", 0))
    N = w.shape[0] if trans else w.shape[1]
    axis = int(dw.attr("axis", 1)) % 2
    if sw.size != 1 and (sw.size != N or axis != (0 if trans else 1)):
        return False
    b = dw.inputs[0]
    if trans:
        b = ctx.temp("weight_t")
        ctx.set_const(b, np.ascontiguousarray(np.asarray(w).T))
    acc = ctx.temp("int_product")
    if not integer_product(ctx, node, da.inputs[0], b, da.input(2), dw.input(2), acc):
        return False
    _scaled(ctx, node, acc, sa * np.broadcast_to(sw, (N,)), -1, node.input(2) if gemm else "")
    return True


def _scaled(ctx, node, acc, scale: np.ndarray, axis: int, bias: str) -> None:
    """node's output = f32(acc) * scale[index along axis] (+ bias, broadcast like a Gemm's C / a
    Conv's per-channel B): a QDQ contraction's dequantization, fused into its product's epilogue."""
    name = ctx.temp("qdq_scale")
    ctx.set_const(name, scale.astype(np.float32))
    shape = ctx.shape(acc)

    def rule(cs):
        v = kir.cast(ctx.read(acc, cs), "f32") * ctx.read(name, [cs[axis]])
        if not bias:
            return v
        return v + (ctx.read(bias, [cs[1]]) if node.op == "Conv" else ctx.read_bcast(bias, shape, cs))
    ctx.generic(node.outputs[0], shape, "f32", rule)


@register("MatMulInteger")
def matmul_integer(ctx, node):
    a, b = node.inputs[:2]
    if integer_product(ctx, node, a, b, node.input(2), node.input(3), node.outputs[0]):
        return
    a2 = _centered(ctx, a, node.input(2), -2)
    b2 = _centered(ctx, b, node.input(3), -1)
    prod = ctx.temp("prod")
    ctx.expand([_node(ctx, "MatMul", [a2, b2], [prod]),
                _node(ctx, "Round", [prod], [node.outputs[0] + ":f"]),
                _node(ctx, "Cast", [node.outputs[0] + ":f"], [node.outputs[0]], to=6)])


@register("ConvInteger")
def conv_integer(ctx, node):
    x, w = node.inputs[:2]
    if integer_conv(ctx, node, x, node.input(2), w, node.input(3), node.outputs[0]):
        return
    x2 = _centered(ctx, x, node.input(2), 1)
    w2 = _centered(ctx, w, node.input(3), 0)
    prod = ctx.temp("prod")
    attrs = {k: v for k, v in node.attrs.items()}
    ctx.expand([_node(ctx, "Conv", [x2, w2], [prod], **attrs),
                _node(ctx, "Round", [prod], [node.outputs[0] + ":f"]),
                _node(ctx, "Cast", [node.outputs[0] + ":f"], [node.outputs[0]], to=6)])


def _requantize(ctx, acc, scale_exprs, zp, to, out, channel_axis=None):
    """out = saturate(round(acc * scale) + zp) in ONNX type `to`."""
    lo, hi = QRANGE[to]
    s = ctx.shape(acc)

    def rule(cs):
        v = kir.cast(ctx.read(acc, cs), "f32") * scale_exprs(cs)
        if zp:
            v = v + kir.cast(ctx.read_flat(zp, kir.i32(0)), "f32")
        return kir.cast(kir.clamp(kir.unary("round", v), float(lo), float(hi)), "i32")
    ctx.generic(out, s, "i32", rule)
    ctx.onnx_types[out] = to


@register("QLinearMatMul")
def qlinear_matmul(ctx, node):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (list(node.inputs) + [""] * 8)[:8]
    to = onnx_type(ctx, y_zp) if y_zp else onnx_type(ctx, a)
    if to not in QRANGE:
        raise Unsupported(f"QLinearMatMul to ONNX type {to}")
    for sc in (a_s, b_s, y_s):
        if numel(ctx.shape(sc)) != 1:
            raise Unsupported("QLinearMatMul with per-axis scales")
    prod = ctx.temp("prod")
    out = node.outputs[0]
    requant = Node(f"{ctx.node.name}/requant", "Requantize", [prod, a_s, b_s, y_s, y_zp], [out],
                   {"to": to}, "webiree", None, ctx.node.opset)
    if integer_product(ctx, node, a, b, a_zp, b_zp, prod):
        ctx.expand([requant])
        return
    a2 = _centered(ctx, a, a_zp, -2)
    b2 = _centered(ctx, b, b_zp, -1)
    ctx.expand([_node(ctx, "MatMul", [a2, b2], [prod]), requant])


@register("QLinearConv")
def qlinear_conv(ctx, node):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = (list(node.inputs) + [""] * 8)[:8]
    bias = node.input(8)
    to = onnx_type(ctx, y_zp) if y_zp else onnx_type(ctx, x)
    if to not in QRANGE:
        raise Unsupported(f"QLinearConv to ONNX type {to}")
    prod = ctx.temp("prod")
    requant = Node(f"{ctx.node.name}/requant", "Requantize", [prod, x_s, w_s, y_s, y_zp, bias],
                   [node.outputs[0]], {"to": to, "channel_axis": 1}, "webiree", None, ctx.node.opset)
    if integer_conv(ctx, node, x, x_zp, w, w_zp, prod):
        ctx.expand([requant])
        return
    x2 = _centered(ctx, x, x_zp, 1)
    w2 = _centered(ctx, w, w_zp, 0)
    attrs = {k: v for k, v in node.attrs.items()}
    # (an int32 bias, in units of x_scale * w_scale, is added by the requantization)
    ctx.expand([_node(ctx, "Conv", [x2, w2], [prod], **attrs), requant])


@register("webiree.Requantize")
def requantize(ctx, node):
    acc, a_s, b_s, y_s, y_zp, bias = (list(node.inputs) + [""])[:6]
    ch = node.attrs.get("channel_axis")
    if bias:
        biased = ctx.temp("biased")
        ctx.generic(biased, ctx.shape(acc), "f32",
                    lambda cs: kir.cast(ctx.read(acc, cs), "f32") + kir.cast(ctx.read(bias, [cs[ch]]), "f32"))
        acc = biased

    def scale(cs):
        bs = ctx.read_flat(b_s, cs[ch] if ch is not None and numel(ctx.shape(b_s)) > 1 else kir.i32(0))
        return ctx.read_flat(a_s, kir.i32(0)) * bs / ctx.read_flat(y_s, kir.i32(0))
    _requantize(ctx, acc, scale, y_zp, node.attrs["to"], node.outputs[0])


@register("BitCast")
def bitcast(ctx, node):
    x = node.inputs[0]
    to = int(node.attr("to"))
    src_t = onnx_type(ctx, x)
    dt = internal_dtype(to)
    if dt is None:
        raise Unsupported(f"BitCast to ONNX type {to}")
    widths = {t: BY_ONNX[t].bits for t in (1, 6, 12, 2, 3, 9, 4, 5)}    # the types kernels hold in 32 bits
    if widths.get(src_t) is None or widths.get(to) is None or widths[src_t] != widths[to]:
        raise Unsupported(f"BitCast from ONNX type {src_t} to {to} (only same-width types up to 32 bits)")
    src_dt = ctx.dtype(x)

    def rule(cs):
        v = ctx.read(x, cs)
        if widths[to] == 32:
            return kir.bitcast(v, dt)
        # 8/16-bit types live in i32 (bool in u32): reinterpret the low bits in the target type
        v = kir.cast(v, "i32") if src_dt != "i32" else v
        bits, signed = INT_BITS.get(to, (8, False))
        if to == 9:
            return kir.binary("ne", v, kir.i32(0))
        v = kir.binary("shl", v, kir.i32(32 - bits))
        return kir.binary("shr", v, kir.i32(32 - bits)) if signed else \
            kir.cast(kir.binary("shr", kir.bitcast(v, "u32"), kir.const(32 - bits, "u32")), "i32")
    ctx.generic(node.outputs[0], ctx.shape(x), dt, rule)
    ctx.onnx_types[node.outputs[0]] = to

