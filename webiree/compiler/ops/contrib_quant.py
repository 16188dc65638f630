"""onnxruntime's block-quantized weight operators (com.microsoft): MatMulNBits and
GatherBlockQuantized.

Weights keep the size they were shipped in (DESIGN.md, "Precision"): nothing is dequantized at
compile time. The packed bytes stay a uint8 constant that kernels read like any other (an i32
value 0..255); the bits of one element are taken out of it with integer shifts and masks where
the value is used.

MatMulNBits lowers onto a Generic that dequantizes B into the [N, K] float matrix (element, minus
the block's zero point, times the block's scale) and a MatMul anchor reading it transposed
(trans_b: B is stored [N, K]); the optional bias is a Generic add. Fusion then computes the
dequantization inside the matmul's own loads of B (passes.py rule 3, prologues) and the bias in
its epilogue (rule 2): one dispatch, reading the packed bytes. A 4-bit B with N % 4 == 0 and no
padded block is laid out anew instead, the same bytes as u32 words along K ([K/8, N]) and its
scales and zero points as [K/block, N]: the product reads B untransposed, and the kernels that
can (the subgroup-broadcast product of CPU adapters) load four columns' eight values of K with
one vec4<u32> load (ir/program.py Nibbles). GatherBlockQuantized is one Generic that gathers and
dequantizes.

Semantics follow onnxruntime's CPU kernels (contrib_ops/cpu/quantization/matmul_nbits.cc,
gather_block_quantized.cc) and the contrib-op documentation of onnxruntime 1.31: elements are
packed low bits first; a block's zero point defaults to 2^(bits-1) for uint8 data and to 0 for
int4 / uint4 data; MatMulNBits' accuracy_level (how onnxruntime may quantize A internally) is a
precision hint only: webiree computes in float32 at every level.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import select
from ...ir.program import Nibbles, flat_of, nibble_dequant, nibble_value, numel
from .. import symbolic
from .common import norm_axis, onnx_type, require_float
from .contraction import emit_matmul
from .registry import Unsupported, register

MS = "com.microsoft."
UINT8, UINT4, INT4 = 2, 21, 22


def _log2(v: int) -> int:
    return v.bit_length() - 1


def _field(byte: kir.Expr, index: kir.Expr, bits: int) -> kir.Expr:
    """Element `index` (i32, >= 0) of the elements packed `bits` wide, low bits first, in `byte`:
    an i32 in [0, 2^bits)."""
    if bits == 8:
        return byte
    per = 8 // bits
    shift = kir.binary("shl", kir.binary("band", index, kir.i32(per - 1)), kir.i32(_log2(bits)))
    return kir.binary("band", kir.binary("shr", byte, shift), kir.i32((1 << bits) - 1))


def _packed(ctx, name: str, flat: kir.Expr, bits: int) -> kir.Expr:
    """Element `flat` of the elements packed `bits` wide in the uint8 tensor `name`, read flat."""
    per = 8 // bits
    byte = ctx.read_flat(name, kir.binary("shr", flat, kir.i32(_log2(per))) if per > 1 else flat)
    return _field(byte, flat, bits)


def _block_size(node, default=None) -> int:
    bs = node.attr("block_size", default)
    if bs is None:
        raise ShapeError(f"{node.op} needs its block_size attribute")
    bs = int(bs)
    if bs < 16 or bs & (bs - 1):
        raise Unsupported(f"block_size={bs} (a power of 2, at least 16)")
    return bs


def _require_uint8(ctx, node, name: str, what: str) -> None:
    t = onnx_type(ctx, name)
    if t != UINT8:
        raise Unsupported(f"{what} {name!r} of ONNX type {t} (uint8 holding packed elements)")


def _shape_is(ctx, name: str, what: str, *forms) -> None:
    s = tuple(ctx.shape(name))
    if s not in [tuple(f) for f in forms]:
        raise ShapeError(f"{what} {name!r} has shape {s}; expected " + " or ".join(str(tuple(f)) for f in forms))


# --- MatMulNBits --------------------------------------------------------------------

def _default_g_idx(ctx, node, g_idx: str, K: int, bs: int, k_blocks: int) -> None:
    """g_idx (act-order group of each row of B) is accepted only when it is the default k // block_size."""
    v = ctx.const(g_idx)
    if v is None:
        raise Unsupported(f"g_idx {g_idx!r} computed at run time (only a constant g_idx equal to k // block_size)")
    v = np.asarray(v).reshape(-1)
    if v.size not in (K, k_blocks * bs) or not np.array_equal(v, np.arange(v.size) // bs):
        raise Unsupported(f"g_idx {g_idx!r} that reorders the rows of B (act-order); only g_idx = k // block_size")


def _zero_point_values(ctx, zp: str, N: int, k_blocks: int, bits: int) -> np.ndarray:
    """The constant packed zero points as their elements, uint8 [N, k_blocks]."""
    per = 8 // bits
    rows = np.asarray(ctx.const(zp), np.uint8).reshape(N, -1)
    shifts = (np.arange(rows.shape[1] * per) % per * bits).astype(np.uint8)
    return ((np.repeat(rows, per, axis=1) >> shifts) & ((1 << bits) - 1))[:, :k_blocks]


def _dense_zero_points(ctx, zp: str, N: int, k_blocks: int, bits: int) -> str:
    """Packed zero points whose rows end in a padded byte, repacked without the padding (the same
    elements, as many bits each): element (n, block) is then element n * k_blocks + block, the
    index of its scale, so the dequantization computes one index for both."""
    dense = f"{zp}:dense"
    if ctx.const(dense) is None:
        per = 8 // bits
        flat = _zero_point_values(ctx, zp, N, k_blocks, bits).reshape(-1)
        flat = np.concatenate([flat, np.zeros(-len(flat) % per, np.uint8)]).reshape(-1, per)
        ctx.set_const(dense, np.bitwise_or.reduce(flat << (np.arange(per) * bits).astype(np.uint8), axis=1)
                      .astype(np.uint8))
    return dense


@register(MS + "MatMulNBits")
def matmul_nbits(ctx, node):
    """Y = A @ dequantize(B)^T (+ bias): B [N, k_blocks, blob_size] uint8 holds each row of the
    [N, K] weight in blocks of block_size elements packed `bits` wide (a last block padded);
    each block has a scale and a zero point (packed uint8 like B, or float; 2^(bits-1) if absent)."""
    a, b, scales = node.inputs[:3]
    zp, g_idx, bias = node.input(3), node.input(4), node.input(5)
    if node.attr("K") is None or node.attr("N") is None:
        raise ShapeError("MatMulNBits needs its K and N attributes")
    K, N = int(node.attr("K")), int(node.attr("N"))
    bits = int(node.attr("bits", 4))
    if bits not in (2, 4, 8):
        raise Unsupported(f"bits={bits} (2, 4 or 8)")
    bs = _block_size(node)
    prepacked = int(node.attr("weight_prepacked", 0))
    if prepacked:
        raise Unsupported(f"weight_prepacked={prepacked} (B in an execution provider's own layout; only 0)")
    # accuracy_level: how onnxruntime may compute (A quantized to int8 at 4): webiree computes in f32
    if K <= 0 or N <= 0:
        raise ShapeError(f"MatMulNBits needs positive K and N, got K={K}, N={N}")
    k_blocks = -(-K // bs)
    blob = bs * bits // 8

    require_float(ctx, node, a)
    if not ctx.shape(a) or ctx.shape(a)[-1] != K:
        raise ShapeError(f"MatMulNBits: A {a!r} of shape {tuple(ctx.shape(a))} must end in K={K}")
    _require_uint8(ctx, node, b, "B")
    _shape_is(ctx, b, "B", (N, k_blocks, blob))
    require_float(ctx, node, scales)
    _shape_is(ctx, scales, "scales", (N * k_blocks,), (N, k_blocks))
    zp_packed, zb = False, 0
    if zp:
        if onnx_type(ctx, zp) == UINT8:
            zp_packed, zb = True, -(-k_blocks * bits // 8)
            _shape_is(ctx, zp, "zero_points", (N * zb,), (N, zb))
        else:
            require_float(ctx, node, zp)
            _shape_is(ctx, zp, "zero_points", (N * k_blocks,), (N, k_blocks))
    if g_idx:
        _default_g_idx(ctx, node, g_idx, K, bs, k_blocks)
    if bias:
        require_float(ctx, node, bias)
        _shape_is(ctx, bias, "bias", (N,))

    nib = _nibble_words(ctx, b, scales, zp, zp_packed, K, N, bits, bs)
    w, nibbles = nib if nib is not None else (_dequantized_rows(ctx, b, scales, zp, zp_packed, zb, K, N, bits, bs), None)
    out = node.outputs[0] if not bias else ctx.temp("matmul")
    emit_matmul(ctx, node, a, w, out, trans_b=nibbles is None).nibbles = nibbles
    if bias:
        ctx.generic(node.outputs[0], ctx.shape(out), "f32", lambda cs: ctx.read(out, cs) + ctx.read(bias, [cs[-1]]))


def _dequantized_rows(ctx, b, scales, zp, zp_packed, zb, K, N, bits, bs) -> str:
    """The Generic that dequantizes B as shipped into its [N, K] float rows (the product reads it
    transposed), from the packed bytes, per-block scales and zero points; returns its tensor."""
    per, k_blocks = 8 // bits, -(-K // bs)
    zp_rows = zb * per            # elements a row of packed zero points holds (its last byte padded)
    if zp_packed and zp_rows != k_blocks and ctx.const(zp) is not None:
        zp, zp_rows = _dense_zero_points(ctx, zp, N, k_blocks, bits), k_blocks

    def dequantize(cs):
        n, k = cs
        # element (n, k) of B, whose rows are k_blocks * block_size elements (the last block padded);
        # without padding, the flat index of (n, k) itself
        q = _packed(ctx, b, flat_of(cs, (N, K)) if K == k_blocks * bs else n * (k_blocks * bs) + k, bits)
        blk = kir.binary("shr", k, kir.i32(_log2(bs)))
        s = n * k_blocks + blk
        scale = ctx.read_flat(scales, s)
        if zp_packed:
            z = _packed(ctx, zp, n * zp_rows + blk, bits)     # (the scale's index when rows are not padded)
        elif zp:
            return nibble_value(q, ctx.read_flat(zp, s), scale)
        else:
            z = kir.i32(1 << (bits - 1))
        return nibble_value(q, z, scale)
    w = ctx.temp("dequantized_b")
    ctx.generic(w, [N, K], "f32", dequantize)
    return w


def _nibble_words(ctx, b, scales, zp, zp_packed, K, N, bits, bs):
    """A 4-bit B laid out for products that read it as words (ir/program.py Nibbles): B's bytes
    as u32 words [K/8, N] (four bytes of a row of B along K are one word of eight values: the
    same bytes, in another order), the scales and zero points [K/block, N], and the Generic that
    dequantizes element (k, n) of the [K, N] matrix from them, which fusion makes the product's
    prologue. Returns (that Generic's tensor, the Nibbles), or None where B keeps its own layout
    (the path below): not 4 bits, a padded last block, N % 4 != 0, or a B, scales or zero points
    computed at run time or read by another node as well (a tied weight is not copied)."""
    params = [t for t in (b, scales, zp) if t]
    if bits != 4 or K % bs or N % 4 or any(ctx.const(t) is None or symbolic.is_symbolic(ctx.const(t)) or
                                          ctx.readers(t) != 1 for t in params):
        return None
    k_blocks = K // bs
    words, scales_t = f"{b}:words", f"{scales}:blocks"
    ctx.set_const(words, np.ascontiguousarray(
        np.asarray(ctx.const(b), np.uint8).reshape(N, K // 8, 4).view("<u4").reshape(N, K // 8).T).astype(np.uint32))
    ctx.set_const(scales_t, np.ascontiguousarray(np.asarray(ctx.const(scales)).reshape(N, k_blocks).T))
    zp_t = ""
    if zp:
        zp_t = f"{zp}:blocks"
        v = _zero_point_values(ctx, zp, N, k_blocks, bits) if zp_packed else np.asarray(ctx.const(zp)).reshape(N, k_blocks)
        ctx.set_const(zp_t, np.ascontiguousarray(v.T))
    ctx.tensors[ctx.buffer(words)].form = "u4"      # (as inspect reports the weights)
    nib = Nibbles(ctx.buffer(words), ctx.buffer(scales_t), ctx.buffer(zp_t) if zp else "", 1 << (bits - 1), bs)
    w = ctx.temp("dequantized_b")
    ctx.generic(w, [K, N], "f32", lambda cs: nibble_dequant(nib, N, *cs, ctx.dtype(zp_t) if zp else "i32"))
    return w, nib


# --- GatherBlockQuantized -----------------------------------------------------------

def _nibbles(ctx, name: str) -> str:
    """An int4 / uint4 constant as the uint8 tensor of its elements' low 4 bits, two to a byte, low
    nibble first, over its flat index (ONNX's own packing of such tensors: the same size, not widened)."""
    packed = f"{name}:nibbles"
    if ctx.const(packed) is None:
        v = np.asarray(ctx.const(name)).reshape(-1).astype(np.int8).view(np.uint8) & 0x0F
        if v.size % 2:
            v = np.concatenate([v, np.zeros(1, np.uint8)])
        ctx.set_const(packed, (v[0::2] | (v[1::2] << 4)).astype(np.uint8))
    return packed


def _sign_extend4(v: kir.Expr) -> kir.Expr:
    return kir.binary("shr", kir.binary("shl", v, kir.i32(28)), kir.i32(28))


@register(MS + "GatherBlockQuantized")
def gather_block_quantized(ctx, node):
    """output = (data[gathered] - zero_point) * scale, blocks of block_size along quantize_axis.
    uint8 data holds 8 / bits elements a byte along its last dim (gather_axis 0, quantize_axis the
    last); int4 / uint4 data (any axes) are ONNX's 4-bit types. An index out of range gives zeros."""
    data, indices, scales = node.inputs[:3]
    zp = node.input(3)
    dt = onnx_type(ctx, data)
    rank = len(ctx.shape(data))
    if rank < 1:
        raise ShapeError(f"GatherBlockQuantized data {data!r} is a scalar; it must have rank >= 1")
    g = norm_axis(int(node.attr("gather_axis", 0)), rank)
    qa = norm_axis(int(node.attr("quantize_axis", 1)), rank)
    bs = _block_size(node, 128)
    bits = int(node.attr("bits", 4))
    require_float(ctx, node, scales)
    if ctx.dtype(indices) != "i32":
        raise Unsupported(f"indices {indices!r} of {ctx.dtype(indices)} elements (int32 or int64)")
    if zp and onnx_type(ctx, zp) != dt:
        raise ShapeError(f"GatherBlockQuantized: zero_points {zp!r} must have data's type ({dt}), "
                         f"got {onnx_type(ctx, zp)}")
    ds = list(ctx.shape(data))
    if dt == UINT8:
        if bits not in (2, 4, 8):
            raise Unsupported(f"bits={bits} (2, 4 or 8 for uint8 data)")
        if g != 0:
            raise Unsupported(f"gather_axis={node.attr('gather_axis')} with uint8 data (only 0)")
        if qa != rank - 1 or qa == g:
            raise Unsupported(f"quantize_axis={node.attr('quantize_axis', 1)} with uint8 data (only the last "
                              f"axis, and not the gather axis)")
        comp = 8 // bits
        signed, src = False, data
    elif dt in (INT4, UINT4):
        if bits != 4:
            raise Unsupported(f"bits={bits} with {'int4' if dt == INT4 else 'uint4'} data (only 4)")
        if ctx.const(data) is None or (zp and ctx.const(zp) is None):
            raise Unsupported(f"{'int4' if dt == INT4 else 'uint4'} data or zero_points computed at run time "
                              f"(only constants)")
        comp, signed, src = 1, dt == INT4, _nibbles(ctx, data)
    else:
        raise Unsupported(f"data {data!r} of ONNX type {dt} (uint8, int4 or uint4)")

    logical = ds[:-1] + [ds[-1] * comp] if comp > 1 else ds
    n_blocks = -(-logical[qa] // bs)
    ss = list(ctx.shape(scales))
    expect = logical[:qa] + [n_blocks] + logical[qa + 1:]
    if ss != expect:
        raise ShapeError(f"GatherBlockQuantized: scales {scales!r} of shape {tuple(ss)} must be {tuple(expect)}")
    if zp:
        zexp = expect[:qa] + [-(-n_blocks // comp)] + expect[qa + 1:]
        if list(ctx.shape(zp)) != zexp:
            raise ShapeError(f"GatherBlockQuantized: zero_points {zp!r} of shape {tuple(ctx.shape(zp))} must be "
                             f"{tuple(zexp)}")
    zsrc = _nibbles(ctx, zp) if zp and dt != UINT8 else zp
    js = list(ctx.shape(indices))
    out_shape = logical[:g] + js + logical[g + 1:]
    n = logical[g]

    def rule(cs):
        i = ctx.read(indices, cs[g:g + len(js)])
        i = select(i < 0, i + n, i)
        valid = kir.binary("and", i >= 0, i < n)
        dc = cs[:g] + [kir.clamp(i, 0, max(n - 1, 0))] + cs[g + len(js):]
        sc = dc[:qa] + [kir.binary("shr", dc[qa], kir.i32(_log2(bs)))] + dc[qa + 1:]
        scale = ctx.read(scales, sc)
        if dt == UINT8:
            byte = ctx.read(data, dc[:-1] + [kir.binary("shr", dc[-1], kir.i32(_log2(comp)))] if comp > 1 else dc)
            q = _field(byte, dc[-1], bits)
            if zp:
                zc = sc[:-1] + [kir.binary("shr", sc[-1], kir.i32(_log2(comp)))] if comp > 1 else sc
                z = _field(ctx.read(zp, zc), sc[-1], bits)
            else:
                z = kir.i32(1 << (bits - 1))
        else:
            q = _packed(ctx, src, flat_of(dc, logical), 4)
            z = _packed(ctx, zsrc, flat_of(sc, ss), 4) if zp else kir.i32(0)
            if signed:
                q = _sign_extend4(q)
                z = _sign_extend4(z) if zp else z
        return select(valid, kir.cast(q - z, "f32") * scale, kir.f32(0.0))
    if numel(out_shape) == 0:
        ctx.set_const(node.outputs[0], np.zeros(out_shape, np.float32))
        return
    ctx.generic(node.outputs[0], out_shape, "f32", rule)
