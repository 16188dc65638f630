"""Spectral ops: DFT and STFT.

Each output bin sums its input samples times the twiddle factors (exact at
multiples of pi/2): a fold per output element, the Loop kind. Complex values
are a trailing dim of 2 (real, imaginary).
"""

from __future__ import annotations

import math

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import f32, select
from .registry import Unsupported, register
from .common import const_ints, const_scalar, require_float
from .loops import emit_loop


@register("DFT")
def dft(ctx, node):
    x = node.inputs[0]
    s = list(ctx.shape(x))
    require_float(ctx, node, x)
    if ctx.opset < 20:
        axis = node.attr("axis", 1)
    else:
        a = const_ints(ctx, node, 2)
        axis = a[0] if a is not None else (-2 if node.input(2) == "" else None)
        if axis is None:
            raise Unsupported("the axis must be a compile-time constant")
    axis = axis + len(s) if axis < 0 else axis
    if not 0 < axis < len(s) - 1:
        raise ShapeError(f"DFT axis {axis} is not a signal axis of {tuple(s)}")
    n_in = s[axis]
    length = const_scalar(ctx, node, 1)
    if node.input(1) and length is None:
        raise Unsupported("dft_length must be a compile-time constant")
    n = int(length) if length is not None else n_in
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    complex_in = s[-1] == 2
    if inverse and onesided:
        # the input is the first n//2+1 bins of a Hermitian spectrum; the output is real
        n = int(length) if length is not None else 2 * (n_in - 1)
        out_shape = s[:-1] + [1]
        out_shape[axis] = n
    else:
        n = int(length) if length is not None else n_in
        n_out = n // 2 + 1 if onesided else n
        out_shape = s[:-1] + [2]
        out_shape[axis] = n_out
    sign = 1.0 if inverse else -1.0
    hermitian = inverse and onesided

    def step(cs, j, accs):
        m = (cs[axis] * j) % n            # the twiddle exp(sign 2 pi i m / n)
        c, sn = _twiddle(m, n, sign)
        base = cs[:-1]
        if hermitian:   # bin j of the full spectrum: X[j], or conj(X[n - j]) past the stored half
            stored = j < n_in
            jj = kir.clamp(select(stored, j, n - j), 0, n_in - 1)
            inside = kir.binary("or", stored, n - j < n_in)
            conj = select(stored, f32(1.0), f32(-1.0))
        else:
            inside = j < n_in
            jj = kir.clamp(j, 0, n_in - 1)
            conj = f32(1.0)
        base = base[:axis] + [jj] + base[axis + 1:]
        re = select(inside, ctx.read(x, base + [kir.i32(0)]), f32(0.0))
        im = select(inside, ctx.read(x, base + [kir.i32(1)]) * conj, f32(0.0)) if complex_in else f32(0.0)
        return [accs[0] + re * c - im * sn, accs[1] + re * sn + im * c]

    def result(cs, accs):
        v = accs[0] if hermitian else select(kir.binary("eq", cs[-1], kir.i32(0)), accs[0], accs[1])
        return v * (1.0 / n) if inverse else v
    emit_loop(ctx, node.outputs[0], out_shape, "f32", n, ["f32", "f32"], lambda cs: [f32(0.0), f32(0.0)],
              step, result)


def _twiddle(m, n: int, sign: float):
    """(cos, sin) of sign * 2 pi m / n for an integer 0 <= m < n, exact at multiples of pi/2."""
    q4 = m * 4
    exact = kir.binary("eq", q4 % n, kir.i32(0))
    q = q4 // n
    ce = select(kir.binary("eq", q, kir.i32(0)), f32(1.0), select(kir.binary("eq", q, kir.i32(2)), f32(-1.0), f32(0.0)))
    se = select(kir.binary("eq", q, kir.i32(1)), f32(sign), select(kir.binary("eq", q, kir.i32(3)), f32(-sign), f32(0.0)))
    centered = select(m * 2 > n, m - n, m)          # the angle in [-pi, pi]: accurate sin/cos
    ang = kir.cast(centered, "f32") * (sign * 2.0 * math.pi / n)
    return select(exact, ce, kir.unary("cos", ang)), select(exact, se, kir.unary("sin", ang))


@register("STFT")
def stft(ctx, node):
    x = node.inputs[0]
    step_c, window, length_c = const_scalar(ctx, node, 1), node.input(2), const_scalar(ctx, node, 3)
    if step_c is None or (node.input(3) and length_c is None):
        raise Unsupported("frame_step and frame_length must be compile-time constants")
    xs = ctx.shape(x)
    require_float(ctx, node, x)
    frame_len = int(length_c) if length_c is not None else ctx.shape(window)[0]
    hop = int(step_c)
    onesided = bool(node.attr("onesided", 1))
    complex_in = xs[-1] == 2
    frames = (xs[1] - frame_len) // hop + 1
    bins = frame_len // 2 + 1 if onesided else frame_len
    out_shape = [xs[0], frames, bins, 2]

    def step(cs, j, accs):
        b, f, kb = cs[0], cs[1], cs[2]
        c, sn = _twiddle((kb * j) % frame_len, frame_len, -1.0)
        pos = f * hop + j
        wv = ctx.read(window, [j]) if window else f32(1.0)
        re = ctx.read(x, [b, pos, kir.i32(0)]) * wv
        im = ctx.read(x, [b, pos, kir.i32(1)]) * wv if complex_in else f32(0.0)
        return [accs[0] + re * c - im * sn, accs[1] + re * sn + im * c]
    emit_loop(ctx, node.outputs[0], out_shape, "f32", frame_len, ["f32", "f32"], lambda cs: [f32(0.0), f32(0.0)],
              step, lambda cs, accs: select(kir.binary("eq", cs[3], kir.i32(0)), accs[0], accs[1]))
