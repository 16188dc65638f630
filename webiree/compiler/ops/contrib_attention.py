"""onnxruntime's attention family (domain com.microsoft): Attention, MultiHeadAttention,
RotaryEmbedding, GroupQueryAttention, with onnxruntime's semantics (docs/ContribOperators.md and its CPU kernels
under contrib_ops/cpu/bert/ are the reference for every corner).

An attention lowers onto the canonical ops: Q, K and V gathered per head ([B, N, L, H], with
the projection bias added and any past state concatenated) by Generic index maps; the scores
Q·Kᵀ·scale a batched MatMul (K read transposed); the additive terms (attention bias, padding
mask, causal mask) one broadcasting Generic that fusion folds into that MatMul's epilogue; the
Softmax anchor over the keys; probs·V a second batched MatMul; and the heads put back side by
side ([B, S, N*H_v]) by one more index map. RotaryEmbedding is one Generic op.

As in onnxruntime, a padding mask adds `mask_filter_value` where a key is masked, and the causal
mask adds -10000 above the diagonal (shifted by the past length); the sum is added to the scaled
scores, after the attention bias.

GroupQueryAttention lowers the same way, with its own masking: the G = num_heads / kv_num_heads
query heads that share a KV head are one matrix of G * S rows ([B, N, S, H] is [B, KV_N, G * S, H]
in memory), so both batched MatMuls read K and V once per KV head, never copied per query head;
masked keys get a score of -3e38 (no weight after the softmax, as onnxruntime leaves them out of
it); the present KV ([B, KV_N, past + S, H]) is one Generic per tensor that places the new,
rotated keys after each batch entry's past. Its past length may be a symbolic dim: one build
serves every decoding step, the first prompt (past length 0) included.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import f32, i32, select
from ...ir.program import MatMul, Softmax
from ...ir.sym import Dim, SymbolicDimError, bounds
from .. import symbolic
from .registry import Unsupported, register

MS = "com.microsoft."
CAUSAL_FILL = -10000.0      # onnxruntime's causal mask value (mask_filter_value is the padding mask's)


def _out(node, i: int) -> str:
    return node.outputs[i] if len(node.outputs) > i else ""


def _opt(node, i: int) -> str:
    return node.input(i) if len(node.inputs) > i else ""


def _refuse_attrs(node, names) -> None:
    """Attributes this lowering does not implement: refused when set to anything but their default."""
    for name, default in names:
        v = node.attr(name, default)
        if v != default:
            raise Unsupported(f"attribute {name}={v} (only {name}={default} is supported)")


def _refuse_inputs(node, indices: dict) -> None:
    for i, what in indices.items():
        if _opt(node, i):
            raise Unsupported(f"input {i} ({what}, {_opt(node, i)!r}) is not supported")


def _required_inputs(node, count: int) -> None:
    if len(node.inputs) < count or not all(node.inputs[:count]):
        raise ShapeError(f"{node.op} needs its first {count} inputs, got {list(node.inputs)}")


def _num_heads(node) -> int:
    n = node.attr("num_heads")
    if n is None or int(n) <= 0:
        raise ShapeError(f"{node.op} needs a positive num_heads attribute, got {n}")
    return int(n)


def _split(total: int, parts: int, what: str) -> int:
    if parts <= 0 or total % parts:
        raise ShapeError(f"{what} {total} is not divisible by {parts}")
    return total // parts


def _heads(ctx, name, B, N, L, H, read):
    """A [B, N, L, H] tensor: element (b, n, l, d) is read(b, n, l, d)."""
    out = ctx.temp(name)
    ctx.generic(out, [B, N, L, H], "f32", lambda cs: read(*cs))
    return out


def _with_past(ctx, node, cur, past, which, B, N, L, H):
    """past (its [B, N, P, H] slice `which` of a stacked past, or the whole tensor) then cur, along L."""
    ps = list(ctx.shape(past))
    lead = [] if which is None else [2]
    if len(ps) != len(lead) + 4 or ps[:len(lead)] != lead or ps[len(lead):len(lead) + 2] != [B, N] \
            or ps[-1] != H:
        raise ShapeError(f"past state {past!r} of shape {tuple(ps)} does not match "
                         f"{tuple(lead + [B, N])} + (past_length, {H})")
    P = ps[-2]
    if P == 0:
        return cur, 0
    pre = [] if which is None else [i32(which)]

    def read(b, n, t, d):
        old = ctx.read(past, pre + [b, n, kir.clamp(t, 0, P - 1), d])
        return select(t < P, old, ctx.read(cur, [b, n, kir.clamp(t - P, 0, L - 1), d]))
    return _heads(ctx, "kv_total", B, N, P + L, H, read), P


def _additive(ctx, node, mask, role, attn_bias, causal, dims, P, fill):
    """The term added to the scaled scores at (b, n, s, t), or None: attention bias + (padding
    mask + causal mask), in onnxruntime's order of summation."""
    B, N, S, T = dims
    terms = []
    if mask:
        ms = tuple(ctx.shape(mask))
        if ctx.dtype(mask) != "i32":
            raise Unsupported(f"input {role} of type {ctx.dtype(mask)} (onnxruntime takes int32)")
        masked, on = f32(fill), f32(0.0)
        if ms == (B,):      # key lengths (right padding)
            terms.append(lambda cs: select(cs[3] >= ctx.read(mask, [cs[0]]), masked, on))
        elif ms == (2 * B,):   # end positions, then start positions (left padding)
            terms.append(lambda cs: select(kir.binary("or", cs[3] >= ctx.read(mask, [cs[0]]),
                                                      cs[3] < ctx.read(mask, [cs[0] + B])), masked, on))
        elif ms == (B, T):  # 0/1 per key
            terms.append(lambda cs: select(ctx.read(mask, [cs[0], cs[3]]) > 0, on, masked))
        elif ms == (B, S, T):
            terms.append(lambda cs: select(ctx.read(mask, [cs[0], cs[2], cs[3]]) > 0, on, masked))
        else:
            raise Unsupported(f"input {role} of shape {ms} (supported: ({B},) key lengths, ({2 * B},) end and start "
                              f"positions, ({B}, {T}) or ({B}, {S}, {T}) 0/1 masks)")
    if causal and S > 1:
        terms.append(lambda cs: select(cs[3] > cs[2] + P, f32(CAUSAL_FILL), f32(0.0)))
    if attn_bias:
        bs = tuple(ctx.shape(attn_bias))
        if len(bs) != 4 or bs[0] not in (1, B) or bs[1] not in (1, N) or bs[2:] != (S, T):
            raise ShapeError(f"attention_bias of shape {bs} is not (1 or {B}, 1 or {N}, {S}, {T})")
    if not terms and not attn_bias:
        return None

    def rule(cs):
        m = None
        for t in terms:
            m = t(cs) if m is None else m + t(cs)
        if not attn_bias:
            return m
        ab = ctx.read_bcast(attn_bias, [B, N, S, T], cs)
        return ab if m is None else ab + m
    return rule


def _attend(ctx, node, q, k, v, dims, scale, extra, out, qk_out=""):
    """out [B, S, N*Hv] = softmax(q·kᵀ·scale + extra)·v for q [B, N, S, H], k [B, N, T, H], v [B, N, T, Hv]."""
    B, N, S, T, H, Hv = dims
    scores = ctx.temp("scores")
    ctx.anchor(MatMul(name=node.name, out=scores, nodes=[node.name], a=ctx.buffer(q), b=ctx.buffer(k),
                      batch=(B, N), a_batch=(B, N), b_batch=(B, N), m=S, n=T, k=H, trans_b=True, alpha=scale),
               [B, N, S, T])
    if extra is not None:
        biased = ctx.temp("biased")
        ctx.generic(biased, [B, N, S, T], "f32", lambda cs: ctx.read(scores, cs) + extra(cs))
        scores = biased
    if qk_out:
        ctx.view(qk_out, scores, [B, N, S, T])
    probs = ctx.temp("probs")
    ctx.anchor(Softmax(name=node.name, out=probs, nodes=[node.name], x=ctx.buffer(scores),
                       outer=B * N * S, r=T, inner=1), [B, N, S, T])
    heads = ctx.temp("heads")
    ctx.anchor(MatMul(name=node.name, out=heads, nodes=[node.name], a=ctx.buffer(probs), b=ctx.buffer(v),
                      batch=(B, N), a_batch=(B, N), b_batch=(B, N), m=S, n=Hv, k=T), [B, N, S, Hv])
    ctx.generic(out, [B, S, N * Hv], "f32",
                lambda cs: ctx.read(heads, [cs[0], cs[2] // Hv, cs[1], cs[2] % Hv]))


def _scale(node, H: int) -> float:
    s = float(node.attr("scale", 0.0))
    return s if s != 0.0 else 1.0 / float(H) ** 0.5


def _float_inputs(ctx, node, names) -> None:
    for n in names:
        if n and ctx.dtype(n) != "f32":
            raise Unsupported(f"{node.op} on {ctx.dtype(n)} tensors ({n!r}); its kernels compute in float32")


# --- Attention: packed QKV projection ----------------------------------------------

@register(MS + "Attention")
def attention(ctx, node):
    _required_inputs(node, 2)
    x, w = node.inputs[0], node.inputs[1]
    bias, mask, past, attn_bias = (_opt(node, i) for i in range(2, 6))
    _refuse_attrs(node, [("do_rotary", 0), ("past_present_share_buffer", 0)])
    _refuse_inputs(node, {6: "past_sequence_length"})
    _float_inputs(ctx, node, [x, w, bias, past, attn_bias])
    N = _num_heads(node)
    xs, ws = tuple(ctx.shape(x)), tuple(ctx.shape(w))
    if len(xs) != 3 or len(ws) != 2 or ws[0] != xs[2]:
        raise ShapeError(f"Attention needs input (batch, sequence, hidden) and weights (hidden, 3 * hidden); "
                         f"got {xs} and {ws}")
    B, S, Hin = xs
    sizes = node.attr("qkv_hidden_sizes")
    if sizes:
        sizes = [int(v) for v in sizes]
        if len(sizes) != 3 or sum(sizes) != ws[1] or sizes[0] != sizes[1]:
            raise ShapeError(f"qkv_hidden_sizes {sizes} must be (D, D, D_v) summing to the weights' {ws[1]} columns")
    else:
        sizes = [_split(ws[1], 3, "the weights' column count")] * 3
    D, _, Dv = sizes
    H, Hv = _split(D, N, "hidden size"), _split(Dv, N, "v hidden size")
    if bias and tuple(ctx.shape(bias)) != (ws[1],):
        raise ShapeError(f"bias of shape {tuple(ctx.shape(bias))} is not ({ws[1]},)")
    x2 = ctx.temp("rows")
    ctx.view(x2, x, [B * S, Hin])
    qkv = ctx.temp("qkv")
    ctx.anchor(MatMul(name=node.name, out=qkv, nodes=[node.name], a=ctx.buffer(x2), b=ctx.buffer(w),
                      m=B * S, n=ws[1], k=Hin), [B * S, ws[1]])

    def part(name, off, h):
        def read(b, n, s, d):
            col = n * h + d + off
            v = ctx.read(qkv, [b * S + s, col])
            return v + ctx.read(bias, [col]) if bias else v
        return _heads(ctx, name, B, N, S, h, read)
    q, k, v = part("q", 0, H), part("k", D, H), part("v", 2 * D, Hv)
    P = 0
    if past:
        if H != Hv:
            raise ShapeError(f"a past state needs equal Q, K and V hidden sizes, got {sizes}")
        k, P = _with_past(ctx, node, k, past, 0, B, N, S, H)
        v, _ = _with_past(ctx, node, v, past, 1, B, N, S, H)
    T = P + S
    if _out(node, 1):
        if H != Hv:
            raise ShapeError(f"the present output needs equal K and V hidden sizes, got {sizes}")
        ctx.generic(_out(node, 1), [2, B, N, T, H], "f32",
                    lambda cs: select(kir.binary("eq", cs[0], i32(0)), ctx.read(k, cs[1:]), ctx.read(v, cs[1:])))
    extra = _additive(ctx, node, mask, "mask_index", attn_bias, bool(node.attr("unidirectional", 0)),
                      (B, N, S, T), P, float(node.attr("mask_filter_value", -10000.0)))
    _attend(ctx, node, q, k, v, (B, N, S, T, H, Hv), _scale(node, H), extra, node.outputs[0])


# --- MultiHeadAttention: separate (or packed) Q, K, V ----------------------------------

@register(MS + "MultiHeadAttention")
def multi_head_attention(ctx, node):
    _required_inputs(node, 1)
    query, key, value, bias, kpm, attn_bias, past_k, past_v = (_opt(node, i) for i in range(8))
    _refuse_inputs(node, {8: "past_sequence_length", 9: "cache_indirection"})
    _float_inputs(ctx, node, [query, key, value, bias, attn_bias, past_k, past_v])
    N = _num_heads(node)
    qs = tuple(ctx.shape(query))
    if len(qs) == 5:            # packed QKV (B, S, N, 3, H)
        if key or value:
            raise Unsupported("packed QKV query together with a key or value input")
        B, S, n, three, H = qs
        if n != N or three != 3:
            raise ShapeError(f"packed QKV query of shape {qs} is not (batch, sequence, {N}, 3, head_size)")
        L, Hv = S, H
        src = {j: (lambda b, n, l, d, j=j: ctx.read(query, [b, l, n, i32(j), d])) for j in range(3)}
    elif len(qs) == 3:
        B, S, D = qs
        H = _split(D, N, "query hidden size")
        src = {0: lambda b, n, l, d: ctx.read(query, [b, l, n * H + d])}
        if not key:
            raise Unsupported("MultiHeadAttention without a key input (only packed QKV queries omit it)")
        ks = tuple(ctx.shape(key))
        if len(ks) == 5:        # packed KV (B, L, N, 2, H)
            if value:
                raise Unsupported("packed KV key together with a value input")
            if ks[0] != B or ks[2:] != (N, 2, H):
                raise ShapeError(f"packed KV key of shape {ks} is not ({B}, kv_sequence, {N}, 2, {H})")
            L, Hv = ks[1], H
            src.update({j + 1: (lambda b, n, l, d, j=j: ctx.read(key, [b, l, n, i32(j), d])) for j in range(2)})
        elif len(ks) == 3:
            vs = tuple(ctx.shape(value)) if value else ()
            if len(vs) != 3 or ks[0] != B or ks[2] != D or vs[:2] != ks[:2]:
                raise ShapeError(f"key {ks} and value {vs} are not ({B}, kv_sequence, {D}) and "
                                 f"({B}, kv_sequence, v_hidden)")
            L, Hv = ks[1], _split(vs[2], N, "value hidden size")
            src[1] = lambda b, n, l, d: ctx.read(key, [b, l, n * H + d])
            src[2] = lambda b, n, l, d: ctx.read(value, [b, l, n * Hv + d])
        elif len(ks) == 4:      # K and V already split into heads (batch, num_heads, kv_sequence, head_size)
            vs = tuple(ctx.shape(value)) if value else ()
            if ks[:2] != (B, N) or ks[3] != H or vs != ks:
                raise ShapeError(f"key {ks} and value {vs} are not both ({B}, {N}, kv_sequence, {H})")
            L, Hv = ks[2], H
            src[1] = lambda b, n, l, d: ctx.read(key, [b, n, l, d])
            src[2] = lambda b, n, l, d: ctx.read(value, [b, n, l, d])
        else:
            raise Unsupported(f"key of rank {len(ks)} (supported: 3-D, 4-D per head, and packed KV)")
    else:
        raise ShapeError(f"query of shape {qs} is neither (batch, sequence, hidden) nor packed QKV")
    if bias:
        if tuple(ctx.shape(bias)) != (2 * N * H + N * Hv,):
            raise ShapeError(f"bias of shape {tuple(ctx.shape(bias))} is not ({2 * N * H + N * Hv},)")
        widths = (H, H, Hv)
        biased = (0,) if len(ctx.shape(key or query)) == 4 else (0, 1, 2)   # per-head K, V come projected
        src = {j: (lambda b, n, l, d, j=j, f=f: f(b, n, l, d) + ctx.read(bias, [j * N * H + n * widths[j] + d]))
               if j in biased else f for j, f in src.items()}
    q = _heads(ctx, "q", B, N, S, H, src[0])
    k = _heads(ctx, "k", B, N, L, H, src[1])
    v = _heads(ctx, "v", B, N, L, Hv, src[2])
    P = 0
    if past_k or past_v:
        if not (past_k and past_v):
            raise Unsupported("past_key without past_value (or the reverse)")
        k, P = _with_past(ctx, node, k, past_k, None, B, N, L, H)
        v, _ = _with_past(ctx, node, v, past_v, None, B, N, L, Hv)
    T = P + L
    for i, t, h in ((1, k, H), (2, v, Hv)):
        if _out(node, i):
            ctx.generic(_out(node, i), [B, N, T, h], "f32", lambda cs, t=t: ctx.read(t, cs))
    extra = _additive(ctx, node, kpm, "key_padding_mask", attn_bias, bool(node.attr("unidirectional", 0)),
                      (B, N, S, T), P, float(node.attr("mask_filter_value", -10000.0)))
    _attend(ctx, node, q, k, v, (B, N, S, T, H, Hv), _scale(node, H), extra, node.outputs[0], _out(node, 3))


# --- RotaryEmbedding ---------------------------------------------------------------

@register(MS + "RotaryEmbedding")
def rotary_embedding(ctx, node):
    """`scale` only matters where onnxruntime would update the caches (positions past their end),
    which its CPU kernel does not implement either; positions are clamped to the cache here."""
    _required_inputs(node, 4)
    x, pos, cos, sin = node.inputs[:4]
    _refuse_attrs(node, [("is_packed_batching", 0)])
    _float_inputs(ctx, node, [x, cos, sin])
    xs, cs_shape = tuple(ctx.shape(x)), tuple(ctx.shape(cos))
    if len(xs) not in (3, 4):
        raise ShapeError(f"RotaryEmbedding input of shape {xs} is neither 3-D nor 4-D")
    if len(cs_shape) != 2 or tuple(ctx.shape(sin)) != cs_shape:
        raise ShapeError(f"cos_cache {cs_shape} and sin_cache {tuple(ctx.shape(sin))} must be equal 2-D shapes")
    M, half_cache = cs_shape
    R, N = int(node.attr("rotary_embedding_dim", 0)), int(node.attr("num_heads", 0))
    if R > 0 and N <= 0:
        raise ShapeError("RotaryEmbedding: num_heads must be given with rotary_embedding_dim")
    B, S = (xs[0], xs[2]) if len(xs) == 4 else xs[:2]
    hidden = xs[1] * xs[3] if len(xs) == 4 else xs[2]
    if len(xs) == 4:
        H = xs[3]
    else:
        H = 2 * half_cache if R == 0 else _split(hidden, N, "hidden size")
        _split(hidden, H, "hidden size")
    R = R or H
    half = R // 2
    if R > H or R % 2 or half_cache not in (half, H // 2):
        raise ShapeError(f"rotary dimension {R} does not fit head size {H} and cache width {half_cache}")
    ps = tuple(ctx.shape(pos))
    if ps not in ((), (1,), (B, S)):
        raise ShapeError(f"position_ids of shape {ps} is neither (1) nor ({B}, {S})")
    interleaved = bool(node.attr("interleaved", 0))

    def rule(c):
        b, s = c[0], (c[2] if len(xs) == 4 else c[1])
        i = c[3] if len(xs) == 4 else c[2] % H

        def at(j):   # coordinates of element j of the same head
            return c[:3] + [j] if len(xs) == 4 else [c[0], c[1], c[2] - i + j]
        p = ctx.read(pos, [b, s]) if ps == (B, S) else ctx.read_flat(pos, i32(0)) + s
        return rotate(ctx, lambda j: ctx.read(x, at(j)), i, p, cos, sin, H, R, interleaved)
    ctx.generic(node.outputs[0], xs, "f32", rule)


def rotate(ctx, read, i, p, cos, sin, H: int, R: int, interleaved: bool):
    """Element i of one head of H elements (read(j): element j of that head) rotated by position p
    with the caches cos, sin [M, half_cache] (onnxruntime's RotaryEmbedding): the first R elements
    rotate as R/2 pairs, interleaved ((0, 1), (2, 3), ...) or in halves ((0, R/2), (1, R/2 + 1), ...);
    the rest pass through. p is clamped to the cache's rows."""
    M, half_cache = ctx.shape(cos)
    half = R // 2
    p = kir.clamp(kir.cast(p, "i32"), 0, M - 1)
    if interleaved:
        even = kir.binary("eq", i % 2, i32(0))
        ci, j, sign = i // 2, select(even, i + 1, i - 1), select(even, f32(-1.0), f32(1.0))
    else:
        low = i < half
        ci, j, sign = select(low, i, i - half), select(low, i + half, i - half), select(low, f32(-1.0), f32(1.0))
    ci, j = kir.clamp(ci, 0, half_cache - 1), kir.clamp(j, 0, H - 1)
    xi = read(i)
    rot = xi * ctx.read(cos, [p, ci]) + sign * read(j) * ctx.read(sin, [p, ci])
    return select(i < R, rot, xi) if R < H else rot


# --- GroupQueryAttention -------------------------------------------------------------

MASKED = -3.0e38        # a score that no key of the row keeps: exp(MASKED - max) is 0


def _gqa_refusals(node) -> None:
    _refuse_attrs(node, [("causal", 1), ("qk_output", 0), ("sliding_window_cache", 0), ("kv_cache_bit_width", 0),
                         ("k_quant_type", "NONE"), ("v_quant_type", "NONE")])
    w = int(node.attr("local_window_size", -1))
    if w == 0 or w < -1:
        raise Unsupported(f"attribute local_window_size={w} (-1, or a window of at least one key)")
    smooth = int(node.attr("smooth_softmax", -1))
    if smooth not in (-1, 0, 1):
        raise Unsupported(f"attribute smooth_softmax={smooth} (0 or 1)")
    _refuse_inputs(node, {12: "k_scale: a quantized KV cache", 13: "v_scale: a quantized KV cache",
                          14: "q_norm_weight", 15: "k_norm_weight"})
    if _out(node, 3):
        raise Unsupported(f"output 3 (output_qk, {_out(node, 3)!r}) is not supported")


def _agrees(shape, want, what: str) -> bool:
    """Whether `shape` is `want`; symbolic dims of different names that may be equal (an attention
    bias [B, N, seq, total] against S and past + S) are checked at run time."""
    if len(shape) != len(want):
        return False
    for i, (a, b) in enumerate(zip(shape, want)):
        if a == b:
            continue
        if not (isinstance(a, Dim) or isinstance(b, Dim)):
            return False
        try:
            symbolic.assume_equal(a, b, f"{what}, dim {i}")
        except SymbolicDimError:
            return False
    return True


def _gqa_total(ctx, node, total, T) -> None:
    """total_sequence_length where its value is known at build (a constant, or a size computed from
    the inputs' shapes, as Shape(attention_mask)[1] is): it must equal past length + sequence length,
    checked now or, for symbolic sizes, by the module before any dispatch."""
    v = ctx.const(total)
    if v is None:
        return
    flat = np.asarray(v, dtype=object).reshape(-1)
    if flat.size != 1:
        raise ShapeError(f"total_sequence_length {total!r} has {flat.size} elements; it must be a scalar")
    value = flat[0] if isinstance(flat[0], Dim) else int(flat[0])
    if not isinstance(value, Dim) and not isinstance(T, Dim):
        if value != T:
            raise ShapeError(f"total_sequence_length is {value}, but the past length + sequence length is {T} "
                             f"(the present outputs hold past and new keys, onnxruntime's layout without a "
                             f"shared past/present buffer)")
        return
    symbolic.assume_equal(T, value, f"{node.op} {node.name}: total_sequence_length == past length + sequence "
                                     f"length")


@register(MS + "GroupQueryAttention")
def group_query_attention(ctx, node):
    """onnxruntime's GroupQueryAttention (contrib_ops/cpu/bert/group_query_attention.cc and
    gqa_attention_base.h of onnxruntime 1.31): N query heads share KV_N key/value heads (head n reads
    KV head n // (N / KV_N)), a KV cache in BNSH, causal masking by position, rotary embedding
    inside, a local window, softcap, attention bias, head sinks (smooth softmax).

    Sizes come from shapes: the past length P is past_key's dim 2 (a symbolic dim in a dynamic
    build: one module decodes every step) and present_key / present_value hold T = P + S positions
    (the layout without a shared past/present buffer); total_sequence_length must equal T (checked
    where it is known at build or from shapes). seqlens_k is read at run time, per batch entry, as
    onnxruntime reads it: entry b holds t_b = seqlens_k[b] + 1 tokens (right padding inside a batch
    is implemented). When P is 0 (the first prompt) the new keys sit at 0..S-1; otherwise at
    p_b = t_b - S .. t_b - 1, after the first p_b rows of the past, the rest of the present zero.
    Query s of entry b sees keys up to min(p_b + s, t_b - 1) and, with local_window_size W > 0,
    the last W of them; rotary positions are p_b + s (position_ids[b, s] where given; at the first
    prompt position_ids[0, 0] + s). Scores are Q·Kᵀ·scale, softcapped (softcap * tanh(x / softcap)),
    plus attention_bias, then a softmax over the keys seen (with a head sink: exp(sink) joins the
    denominator)."""
    _required_inputs(node, 1)
    query, key, value, past_k, past_v, seqlens, total, cos, sin, pos_ids, attn_bias, sink = \
        (_opt(node, i) for i in range(12))
    _gqa_refusals(node)
    for i, what in ((5, "seqlens_k"), (6, "total_sequence_length")):
        if not _opt(node, i):
            raise ShapeError(f"GroupQueryAttention needs input {i} ({what})")
    _float_inputs(ctx, node, [query, key, value, past_k, past_v, cos, sin, attn_bias, sink])
    N = _num_heads(node)
    KVN = node.attr("kv_num_heads")
    if KVN is None or int(KVN) <= 0 or N % int(KVN):
        raise ShapeError(f"kv_num_heads={KVN} must be positive and divide num_heads={N}")
    KVN = int(KVN)
    G = N // KVN
    qs = tuple(ctx.shape(query))
    if len(qs) != 3:
        raise ShapeError(f"query of shape {qs} is not (batch, sequence, hidden)")
    B, S, D = qs
    if not key:     # packed QKV (batch, sequence, (num_heads + 2 * kv_num_heads) * head_size)
        if value:
            raise ShapeError("GroupQueryAttention: value given without key (a packed QKV query has neither)")
        H = _split(D, N + 2 * KVN, "packed QKV hidden size")

        def raw(j):
            return lambda b, n, s, d: ctx.read(query, [b, s, (j + n) * H + d])
        rq, rk, rv = raw(0), raw(N), raw(N + KVN)
    else:
        H = _split(D, N, "query hidden size")
        ks, vs = tuple(ctx.shape(key)), tuple(ctx.shape(value)) if value else ()
        if not (_agrees(ks, (B, S, KVN * H), f"{node.op} key") and _agrees(vs, ks, f"{node.op} value")):
            raise ShapeError(f"key {ks} and value {vs} must both be ({B}, {S}, {KVN * H}) (batch, sequence, "
                             f"kv_num_heads * head_size)")
        rq = lambda b, n, s, d: ctx.read(query, [b, s, n * H + d])     # noqa: E731
        rk = lambda b, n, s, d: ctx.read(key, [b, s, n * H + d])       # noqa: E731
        rv = lambda b, n, s, d: ctx.read(value, [b, s, n * H + d])     # noqa: E731
    P = 0
    if past_k or past_v:
        if not (past_k and past_v):
            raise ShapeError("GroupQueryAttention needs past_key and past_value together")
        pk, pv = tuple(ctx.shape(past_k)), tuple(ctx.shape(past_v))
        if len(pk) != 4 or not (_agrees(pk, (B, KVN, pk[2], H), f"{node.op} past_key")
                                and _agrees(pv, pk, f"{node.op} past_value")):
            raise ShapeError(f"past_key {pk} and past_value {pv} must both be ({B}, {KVN}, past_length, {H}) (BNSH)")
        P = pk[2]
    T = P + S
    _gqa_total(ctx, node, total, T)
    ss = tuple(ctx.shape(seqlens))
    if ctx.dtype(seqlens) != "i32" or not _agrees(ss[:1], (B,), f"{node.op} seqlens_k") or ss[1:] not in ((), (1,)):
        raise ShapeError(f"seqlens_k {seqlens!r} must be int32 of shape ({B},), got {ctx.dtype(seqlens)} {ss}")

    # the first prompt (no past): decided at build where the past length is fixed or cannot be 0
    first = P == 0 if not isinstance(P, Dim) else False if bounds(P)[0] > 0 else kir.binary("eq", i32(P), i32(0))

    def t_len(b):       # t_b: tokens of entry b (past + new)
        return ctx.read_flat(seqlens, b) + 1

    def past_len(b):    # p_b: where entry b's new tokens start
        if first is True:
            return i32(0)
        p = t_len(b) - S
        return p if first is False else select(first, i32(0), p)

    rotary = bool(node.attr("do_rotary", 0))
    interleaved = bool(node.attr("rotary_interleaved", 0))
    if rotary:
        if not (cos and sin):
            raise ShapeError("GroupQueryAttention with do_rotary=1 needs cos_cache and sin_cache")
        cs = tuple(ctx.shape(cos))
        if len(cs) != 2 or tuple(ctx.shape(sin)) != cs or 2 * cs[1] > H or cs[1] <= 0:
            raise ShapeError(f"cos_cache {cs} and sin_cache {tuple(ctx.shape(sin))} must be equal "
                             f"(max_sequence, rotary_dim / 2) with rotary_dim <= head_size {H}")
        R = 2 * cs[1]
        if pos_ids:
            if not _agrees(tuple(ctx.shape(pos_ids)), (B, S), f"{node.op} position_ids"):
                raise ShapeError(f"position_ids of shape {tuple(ctx.shape(pos_ids))} is not ({B}, {S})")
            if ctx.dtype(pos_ids) != "i32":
                raise Unsupported(f"position_ids {pos_ids!r} of {ctx.dtype(pos_ids)} elements (int64)")

        def position(b, s):
            if not pos_ids:
                return past_len(b) + s
            at_first = ctx.read(pos_ids, [i32(0), i32(0)]) + s
            given = ctx.read(pos_ids, [b, s])
            return at_first if first is True else given if first is False else select(first, at_first, given)

        def rotated(read):
            return lambda b, n, s, d: rotate(ctx, lambda j: read(b, n, s, j), d, position(b, s), cos, sin, H, R,
                                             interleaved)
        rq, rk = rotated(rq), rotated(rk)
    elif pos_ids:
        raise Unsupported(f"input 9 (position_ids, {pos_ids!r}) without do_rotary=1")

    # queries [B, N, S, H]: as [B, KVN, G * S, H] (the same memory), the G heads of one KV head
    # are one matrix of G * S rows against that head's keys
    q = _heads(ctx, "q", B, N, S, H, rq)

    # present K, V [B, KVN, T, H]: entry b's past rows 0..p_b-1, its new rows p_b..p_b+S-1, zeros after
    def present(new, past):
        def rule(cs):
            b, m, t, d = cs
            p = past_len(b)
            fresh = new(b, m, kir.clamp(t - p, 0, S - 1), d)
            fresh = select(t < p + S, fresh, f32(0.0)) if first is not True else fresh
            if not past or first is True:      # (a past of length 0 has nothing to read)
                return fresh
            old = ctx.read(past, [b, m, kir.clamp(t, 0, kir.maximum(i32(P) - 1, i32(0))), d])
            return select(t < p, old, fresh)
        return rule
    k_all, v_all = (_out(node, 1) or ctx.temp("present_key")), (_out(node, 2) or ctx.temp("present_value"))
    ctx.generic(k_all, [B, KVN, T, H], "f32", present(rk, past_k))
    ctx.generic(v_all, [B, KVN, T, H], "f32", present(rv, past_v))

    if attn_bias:
        bs = tuple(ctx.shape(attn_bias))
        if len(bs) != 4 or not _agrees(bs, (bs[0] if bs[0] == 1 else B, bs[1] if bs[1] == 1 else N, S, T),
                                       f"{node.op} attention_bias"):
            raise ShapeError(f"attention_bias of shape {bs} is not (1 or {B}, 1 or {N}, {S}, {T})")
    if sink and tuple(ctx.shape(sink)) != (N,):
        raise ShapeError(f"head_sink of shape {tuple(ctx.shape(sink))} is not ({N},)")
    smooth = bool(sink) or int(node.attr("smooth_softmax", -1)) == 1
    softcap = float(node.attr("softcap", 0.0))
    window = int(node.attr("local_window_size", -1))

    raw_scores = ctx.temp("scores")
    ctx.anchor(MatMul(name=node.name, out=raw_scores, nodes=[node.name], a=ctx.buffer(q), b=ctx.buffer(k_all),
                      batch=(B, KVN), a_batch=(B, KVN), b_batch=(B, KVN), m=G * S, n=T, k=H, trans_b=True,
                      alpha=_scale(node, H)), [B, KVN, G * S, T])
    scores = ctx.temp("scores_heads")
    ctx.view(scores, raw_scores, [B, N, S, T])
    width = T + 1 if smooth else T      # with a sink: one more column, the sink's logit

    def masked(cs):
        b, n, s, t = cs
        x = ctx.read(scores, [b, n, s, kir.clamp(t, 0, T - 1) if smooth else t])
        if softcap > 0.0:
            x = kir.unary("tanh", x * (1.0 / softcap)) * softcap
        if attn_bias:
            bs = ctx.shape(attn_bias)
            x = x + ctx.read(attn_bias, [i32(0) if bs[0] == 1 else b, i32(0) if bs[1] == 1 else n, s,
                                         kir.clamp(t, 0, T - 1) if smooth else t])
        last = kir.minimum(past_len(b) + s, t_len(b) - 1)
        seen = t <= last
        if window > 0:
            seen = kir.binary("and", seen, t > last - window)
        x = select(seen, x, f32(MASKED))
        if smooth:
            x = select(t < T, x, ctx.read(sink, [n]) if sink else f32(0.0))
        return x
    logits = ctx.temp("logits")
    ctx.generic(logits, [B, N, S, width], "f32", masked)
    probs = ctx.temp("probs")
    ctx.anchor(Softmax(name=node.name, out=probs, nodes=[node.name], x=ctx.buffer(logits),
                       outer=B * N * S, r=width, inner=1), [B, N, S, width])
    if smooth:      # the sink's column dropped
        kept = ctx.temp("probs_keys")
        ctx.generic(kept, [B, KVN, G * S, T], "f32", lambda cs: ctx.read_flat(probs, (cs[0] * KVN + cs[1]) *
                                                                               (G * S * width) + cs[2] * width + cs[3]))
        probs = kept
    else:
        flat = ctx.temp("probs_rows")
        ctx.view(flat, probs, [B, KVN, G * S, T])
        probs = flat
    heads = ctx.temp("heads")
    ctx.anchor(MatMul(name=node.name, out=heads, nodes=[node.name], a=ctx.buffer(probs), b=ctx.buffer(v_all),
                      batch=(B, KVN), a_batch=(B, KVN), b_batch=(B, KVN), m=G * S, n=H, k=T), [B, KVN, G * S, H])
    by_head = ctx.temp("heads_bnsh")
    ctx.view(by_head, heads, [B, N, S, H])
    ctx.generic(node.outputs[0], [B, S, N * H], "f32",
                lambda cs: ctx.read(by_head, [cs[0], cs[2] // H, cs[1], cs[2] % H]))
