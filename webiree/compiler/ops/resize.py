"""Resize (and Upsample): nearest, linear and cubic, every coordinate mode.

A Generic op per Resize: each output coordinate is mapped back to a
fractional input coordinate, then the taps of the kernel (1 for nearest, 2
for linear, 4 for cubic, per resized axis) are read with clamped indices and
weighted. Axes that are not resized read straight through.
"""

from __future__ import annotations

import math

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import f32, select
from .registry import Unsupported, register
from .common import norm_axis
from ...ir.sym import is_dim


def _scaled(d, scale: float):
    """floor(d * scale); for a symbolic dim, a scale that is an integer or one's reciprocal."""
    if not is_dim(d):
        return int(math.floor(d * scale))
    if float(scale).is_integer():
        return d * int(scale)
    if scale > 0 and (1.0 / scale).is_integer():
        return d // int(round(1.0 / scale))
    raise Unsupported(f"Resize of the symbolic dim {d} by the scale {scale} (an integer or 1/integer is supported)")


def _ratio(out, n):
    """out / n as the scale of a resized axis: a float, or an f32 expression of symbolic sizes."""
    if not is_dim(out) and not is_dim(n):
        return out / n
    return kir.size_f32(out) / kir.size_f32(n)


def _params(ctx, node, shape):
    rank = len(shape)
    if node.op == "Upsample" or ctx.opset < 11:
        scales_name = node.input(1) if node.op == "Upsample" or ctx.opset >= 9 else ""
        scales = ctx.const(scales_name) if scales_name else np.array(node.attr("scales"), np.float32)
        if scales is None:
            raise Unsupported("scales must be a compile-time constant")
        return list(np.asarray(scales, np.float64)), None, None
    roi = ctx.const(node.input(1)) if node.input(1) else None
    scales = ctx.const(node.input(2)) if node.input(2) else None
    sizes = ctx.const(node.input(3)) if node.input(3) else None
    if (node.input(2) and scales is None) or (node.input(3) and sizes is None) or (node.input(1) and roi is None):
        raise Unsupported("roi, scales and sizes must be compile-time constants")
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    axes = node.attr("axes")
    axes = [norm_axis(a, rank) for a in axes] if axes else list(range(rank))
    full_scales, full_sizes = [1.0] * rank, list(shape)
    if sizes is not None:
        sizes = [s if is_dim(s) else int(s) for s in np.asarray(sizes).reshape(-1)]
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch" and (any(is_dim(v) for v in sizes) or any(is_dim(shape[a]) for a in axes)):
            raise Unsupported(f"keep_aspect_ratio_policy {policy!r} with symbolic sizes")
        if policy != "stretch":
            ratios = [sizes[i] / shape[a] for i, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(math.floor(r * shape[a] + 0.5)) for a in axes]
            for a in axes:
                full_scales[a] = r
        for i, a in enumerate(axes):
            full_sizes[a] = sizes[i]
            if policy == "stretch":
                full_scales[a] = _ratio(sizes[i], shape[a])
        out = full_sizes
    elif scales is not None:
        for i, a in enumerate(axes):
            full_scales[a] = float(scales[i])
        out = [_scaled(shape[a], full_scales[a]) for a in range(rank)]
    else:
        raise ShapeError("Resize needs scales or sizes")
    full_roi = None
    if roi is not None and roi.size:
        full_roi = [0.0] * rank + [1.0] * rank
        for i, a in enumerate(axes):
            full_roi[a] = float(roi[i])
            full_roi[rank + a] = float(roi[len(axes) + i])
    return full_scales, out, full_roi


def _source_coord(mode, x, scale, in_len, out_len, roi_start, roi_end):
    """Fractional input coordinate (f32 expr) of output coordinate x (f32 expr).

    As the ONNX reference does, align_corners, pytorch_half_pixel and tf_crop_and_resize
    use the unrounded output length scale * in_len (it differs from out_len when scales
    are given). Symbolic lengths (and the scales computed from them) are f32 expressions; a
    branch on them is then a select."""
    if is_dim(in_len) or is_dim(out_len) or isinstance(scale, kir.Expr):
        if mode == "half_pixel_symmetric" or mode == "tf_crop_and_resize":
            raise Unsupported(f"coordinate_transformation_mode {mode!r} with symbolic sizes")
        in_f = kir.size_f32(in_len)
        out_f = in_f * scale
        not_one = kir.binary("ne", out_f, f32(1.0))
        if mode == "pytorch_half_pixel":
            return select(not_one, (x + 0.5) / scale - 0.5, f32(-0.5))
        if mode == "align_corners":
            return select(not_one, x * ((in_f - 1.0) / (out_f - 1.0)), f32(0.0))
        if mode == "half_pixel":
            return (x + 0.5) / scale - 0.5
        if mode == "asymmetric":
            return x / scale
        raise Unsupported(f"coordinate_transformation_mode {mode!r}")
    out_f = scale * in_len
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_f != 1 else f32(-0.5)
    if mode == "align_corners":
        return x * ((in_len - 1) / (out_f - 1)) if out_f != 1 else f32(0.0)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (scale * in_len)
        center = in_len / 2.0
        offset = center * (1.0 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if mode == "tf_crop_and_resize":
        if out_f != 1:
            return roi_start * (in_len - 1) + x * ((roi_end - roi_start) * (in_len - 1) / (out_f - 1))
        return f32(0.5 * (roi_start + roi_end) * (in_len - 1))
    raise Unsupported(f"coordinate_transformation_mode {mode!r}")


def _cubic_weights(t, a):
    """Keys cubic convolution weights of the 4 taps at offsets -1, 0, 1, 2 for fraction t."""
    def w(d):  # d = |distance|, an expr
        d2, d3 = d * d, d * d * d
        near = (a + 2.0) * d3 - (a + 3.0) * d2 + 1.0
        far = a * d3 - 5.0 * a * d2 + 8.0 * a * d - 4.0 * a
        return near, far
    return [w(t + 1.0)[1], w(t)[0], w(1.0 - t)[0], w(2.0 - t)[1]]


def _antialias_taps(xo, scale: float, n: int, mode: str, cubic_a: float, exclude: bool):
    """(index, weight) taps of an antialiased downsampling filter (the kernel stretched by 1/scale),
    as the ONNX reference picks them: a fixed footprint around xo, weights normalized."""
    fl = kir.unary("floor", xo)
    ratio = select(kir.binary("eq", xo, fl), f32(1.0), xo - fl)
    if mode == "linear":
        start = int(math.floor(-1.0 / scale)) + 1
    else:
        start = int(math.floor(-2.0 / scale)) + 1
    count = 2 - 2 * start
    pad = -(-count // 2)
    xp = xo + float(pad)
    p = kir.unary("floor", xp)
    frac = xp - p
    if count % 2 == 0:
        off = select(kir.binary("eq", frac, f32(0.0)), f32(-(count // 2)), f32(-(count // 2) + 1))
    else:
        base = -((count - 1) // 2)
        off = select(frac <= 0.5, f32(base), f32(base + 1))
    first = kir.cast(p + off, "i32") - pad
    taps, total = [], None
    for j in range(count):
        arg = kir.unary("abs", (float(start + j) - ratio) * scale)
        if mode == "linear":
            w = kir.clamp(1.0 - arg, 0.0, 1.0)
        else:
            a = cubic_a
            near = ((a + 2.0) * arg - (a + 3.0)) * arg * arg + 1.0
            far = ((a * arg - 5.0 * a) * arg + 8.0 * a) * arg - 4.0 * a
            w = select(arg <= 1.0, near, select(arg < 2.0, far, f32(0.0)))
        i = first + j
        if exclude:
            w = select(kir.binary("and", i >= 0, i < n), w, f32(0.0))
        taps.append((kir.clamp(i, 0, n - 1), w))
        total = w if total is None else total + w
    return [(i, w / total) for i, w in taps]


@register("Resize", "Upsample")
def resize(ctx, node):
    x = node.inputs[0]
    shape = ctx.shape(x)
    rank = len(shape)
    if ctx.dtype(x) != "f32":
        raise Unsupported("Resize of non-float tensors")
    scales, out_shape, roi = _params(ctx, node, shape)
    if out_shape is None:
        out_shape = [_scaled(d, s) for d, s in zip(shape, scales)]
    mode = node.attr("mode", "nearest")
    ctm = node.attr("coordinate_transformation_mode", "half_pixel" if node.op == "Resize" and ctx.opset >= 11
                    else "asymmetric")
    # Upsample's nearest mode repeats each element (floor), Resize's rounds
    nearest_mode = node.attr("nearest_mode", "floor" if node.op == "Upsample" else "round_prefer_floor")
    cubic_a = float(node.attr("cubic_coeff_a", -0.75))
    exclude = bool(node.attr("exclude_outside", 0))
    extrapolation = float(node.attr("extrapolation_value", 0.0))
    antialias = bool(node.attr("antialias", 0)) and mode != "nearest"
    if antialias and any(isinstance(v, kir.Expr) for v in scales):
        raise Unsupported("antialiased Resize with symbolic sizes")
    if mode not in ("nearest", "linear", "cubic"):
        raise Unsupported(f"mode {mode!r}")
    resized = [a for a in range(rank) if out_shape[a] != shape[a] or isinstance(scales[a], kir.Expr) or
               scales[a] != 1.0 or ctm == "tf_crop_and_resize"]

    def rule(cs):
        taps = [([], f32(1.0))]   # (coords so far, weight)
        inside = kir.const(True, "bool")
        for a in range(rank):
            if a not in resized:
                taps = [(c + [cs[a]], w) for c, w in taps]
                continue
            n = shape[a]
            xo = _source_coord(ctm, kir.cast(cs[a], "f32"), scales[a], n, out_shape[a],
                               roi[a] if roi else 0.0, roi[rank + a] if roi else 1.0)
            if ctm == "tf_crop_and_resize":
                inside = kir.binary("and", inside, kir.binary("and", xo >= 0.0, xo <= float(n - 1)))
            if mode == "nearest":
                r = {"round_prefer_floor": lambda v: kir.unary("ceil", v - 0.5),
                     "round_prefer_ceil": lambda v: kir.unary("floor", v + 0.5),
                     "floor": lambda v: kir.unary("floor", v),
                     "ceil": lambda v: kir.unary("ceil", v)}[nearest_mode](xo)
                idx = kir.clamp(kir.cast(r, "i32"), 0, n - 1)
                axis_taps = [(idx, f32(1.0))]
            elif antialias and scales[a] < 1.0:
                axis_taps = _antialias_taps(xo, scales[a], n, mode, cubic_a, exclude)
            elif mode == "linear":
                fl = kir.unary("floor", xo)
                t = xo - fl
                i0 = kir.cast(fl, "i32")
                axis_taps = [(kir.clamp(i0, 0, n - 1), 1.0 - t), (kir.clamp(i0 + 1, 0, n - 1), t)]
            else:
                fl = kir.unary("floor", xo)
                t = xo - fl
                i0 = kir.cast(fl, "i32")
                ws = _cubic_weights(t, cubic_a)
                idxs = [i0 + k for k in (-1, 0, 1, 2)]
                if exclude:
                    ws = [select(kir.binary("and", i >= 0, i < n), w, f32(0.0)) for i, w in zip(idxs, ws)]
                    total = ws[0] + ws[1] + ws[2] + ws[3]
                    ws = [w / total for w in ws]
                axis_taps = [(kir.clamp(i, 0, n - 1), w) for i, w in zip(idxs, ws)]
            taps = [(c + [i], wt * w) for c, wt in taps for i, w in axis_taps]
        value = None
        for c, w in taps:
            term = ctx.read(x, c) * w if not (w.is_const and w.attr == 1.0) else ctx.read(x, c)
            value = term if value is None else value + term
        if ctm == "tf_crop_and_resize":
            value = select(inside, value, f32(extrapolation))
        return value
    ctx.generic(node.outputs[0], out_shape, "f32", rule)
