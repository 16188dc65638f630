"""Shape and data-movement ops.

Reshape-like ops become views (no dispatch). Everything else here is an index
map: a Generic op whose expression reads the input at coordinates computed
from the output coordinates. Index reads are clamped into range so a bad
index can never read outside a buffer.
"""

from __future__ import annotations

from ...ir.program import numel

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import select
from .registry import Unsupported, register
from ..symbolic import as_value
from ..graph import internal_of_numpy
from ...ir.sym import SymbolicDimError, ceildiv, dmax, fmt, is_dim, upper
from ..symbolic import assume_equal
from .common import broadcast_shapes, const_ints, norm_axis, required_ints


@register("Reshape")
def reshape(ctx, node):
    x = node.inputs[0]
    shape = required_ints(ctx, node, 1, "the target shape must be a compile-time constant")
    src = ctx.shape(x)
    allowzero = node.attr("allowzero", 0)
    out = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            if i >= len(src):
                raise ShapeError(f"Reshape copies dim {i} but the input has rank {len(src)}")
            out.append(src[i])
        else:
            out.append(d)
    if out.count(-1) > 1:
        raise ShapeError(f"Reshape target {shape} has more than one -1")
    if -1 in out:
        known = numel([d for d in out if d != -1])
        total = numel(src)
        if known == 0 or total % known:
            raise ShapeError(f"cannot reshape {tuple(src)} to {shape}")
        out[out.index(-1)] = total // known
    ctx.view(node.outputs[0], x, out)


@register("Flatten")
def flatten(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    axis = node.attr("axis", 1)
    axis = axis + len(s) if axis < 0 else axis
    if not 0 <= axis <= len(s):
        raise ShapeError(f"Flatten axis {node.attr('axis')} is out of range for rank {len(s)}")
    ctx.view(node.outputs[0], x, (numel(s[:axis]), numel(s[axis:])))


@register("Squeeze")
def squeeze(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    axes = const_ints(ctx, node, 1, "axes")
    if axes is None:
        out = [d for d in s if d != 1]
    else:
        axes = {norm_axis(a, len(s)) for a in axes}
        for a in axes:
            if s[a] != 1:
                raise ShapeError(f"Squeeze axis {a} has size {s[a]}, not 1")
        out = [d for i, d in enumerate(s) if i not in axes]
    ctx.view(node.outputs[0], x, out)


@register("Unsqueeze")
def unsqueeze(ctx, node):
    x = node.inputs[0]
    s = list(ctx.shape(x))
    axes = const_ints(ctx, node, 1, "axes")
    if axes is None:
        raise Unsupported("Unsqueeze needs axes")
    rank = len(s) + len(axes)
    axes = sorted(norm_axis(a, rank) for a in axes)
    for a in axes:
        s.insert(a, 1)
    ctx.view(node.outputs[0], x, s)


@register("Shape")
def shape_op(ctx, node):
    s = ctx.shape(node.inputs[0])
    r = len(s)
    start = node.attr("start", 0)
    end = node.attr("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    ctx.set_const(node.outputs[0], as_value(list(s[start:end]), np.int64))


@register("Size")
def size_op(ctx, node):
    ctx.set_const(node.outputs[0], as_value(numel(ctx.shape(node.inputs[0])), np.int64))


@register("Transpose")
def transpose(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    perm = node.attr("perm") or list(range(len(s)))[::-1]
    perm = [norm_axis(p, len(s)) for p in perm]
    if sorted(perm) != list(range(len(s))):
        raise ShapeError(f"Transpose perm {perm} is not a permutation of rank {len(s)}")
    out_shape = [s[p] for p in perm]
    if [p for p in perm if s[p] != 1] == sorted(p for p in perm if s[p] != 1):
        ctx.view(node.outputs[0], x, out_shape)   # moves only size-1 dims: same memory order
        return

    def rule(cs):
        src = [None] * len(s)
        for i, p in enumerate(perm):
            src[p] = cs[i]
        return ctx.read(x, src)
    ctx.generic(node.outputs[0], out_shape, ctx.dtype(x), rule)


@register("Concat")
def concat(ctx, node):
    # inputs that are empty at every size are dropped; one empty only at some sizes (a KV cache's
    # past of length 0..N) stays: its range of the axis is then empty and never selected
    names = [i for i in node.inputs if i and upper(numel(ctx.shape(i))) > 0] or [node.inputs[0]]
    s0 = ctx.shape(names[0])
    axis = norm_axis(node.attr("axis"), len(s0))
    for n in names:
        s = ctx.shape(n)
        if len(s) != len(s0):
            raise ShapeError(f"Concat inputs {[ctx.shape(n) for n in names]} differ in rank")
        for i, (a, b) in enumerate(zip(s, s0)):
            if i != axis and a != b:
                try:        # symbolic sizes that must agree: checked at run time where not provable
                    assume_equal(b, a, f"Concat of {n!r} along axis {axis} (dim {i})")
                except SymbolicDimError:
                    raise ShapeError(f"Concat inputs {[fmt(ctx.shape(n)) for n in names]} differ off axis "
                                     f"{axis}") from None
    sizes = [ctx.shape(n)[axis] for n in names]
    out_shape = list(s0)
    out_shape[axis] = sum(sizes)

    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + n)     # symbolic where a size is

    def rule(cs):
        c = cs[axis]
        value = None
        for k in reversed(range(len(names))):
            local = kir.clamp(c - offsets[k], 0, dmax(sizes[k] - 1, 0))
            v = ctx.read(names[k], cs[:axis] + [local] + cs[axis + 1:])
            value = v if value is None else select(c < offsets[k + 1], v, value)
        return value
    ctx.generic(node.outputs[0], out_shape, ctx.dtype(names[0]), rule)


def _slice_params(ctx, node, shape):
    if ctx.opset < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes, steps = node.attr("axes"), None
    else:
        starts, ends = const_ints(ctx, node, 1), const_ints(ctx, node, 2)
        axes, steps = const_ints(ctx, node, 3), const_ints(ctx, node, 4)
    if starts is None or ends is None:
        raise Unsupported("Slice starts/ends must be compile-time constants")
    rank = len(shape)
    axes = [norm_axis(a, rank) for a in (axes if axes is not None else range(len(starts)))]
    steps = steps if steps is not None else [1] * len(starts)
    begin, step, out = [0] * rank, [1] * rank, list(shape)
    for a, st, en, sp in zip(axes, starts, ends, steps):
        d = shape[a]
        if sp == 0:
            raise ShapeError("Slice step 0")
        st = st + d if st < 0 else st
        en = en + d if en < 0 else en
        if sp > 0:
            st, en = min(max(st, 0), d), min(max(en, 0), d)
            n = max(0, (en - st + sp - 1) // sp)
        else:
            st, en = min(max(st, -1), d - 1), min(max(en, -1), d - 1)
            n = max(0, (st - en + (-sp) - 1) // (-sp))
        begin[a], step[a], out[a] = st, sp, n
    return begin, step, out


@register("Slice")
def slice_op(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    begin, step, out_shape = _slice_params(ctx, node, s)
    ctx.generic(node.outputs[0], out_shape, ctx.dtype(x),
                lambda cs: ctx.read(x, [b + c * st for b, c, st in zip(begin, cs, step)]))


@register("Gather")
def gather(ctx, node):
    data, idx = node.inputs[0], node.inputs[1]
    ds, js = ctx.shape(data), ctx.shape(idx)
    if not ds:
        raise ShapeError(f"Gather data {data!r} is a scalar; it must have rank >= 1")
    axis = norm_axis(node.attr("axis", 0), len(ds))
    out_shape = list(ds[:axis]) + list(js) + list(ds[axis + 1:])
    n = ds[axis]

    def rule(cs):
        j = cs[axis:axis + len(js)]
        i = ctx.read(idx, j)
        i = select(i < 0, i + n, i)
        i = kir.clamp(i, 0, max(n - 1, 0))
        return ctx.read(data, cs[:axis] + [i] + cs[axis + len(js):])
    ctx.generic(node.outputs[0], out_shape, ctx.dtype(data), rule)


@register("Expand")
def expand(ctx, node):
    x = node.inputs[0]
    shape = required_ints(ctx, node, 1, "Expand shape must be a compile-time constant")
    out_shape = broadcast_shapes(ctx.shape(x), tuple(shape))
    if tuple(out_shape) == tuple(ctx.shape(x)):
        ctx.view(node.outputs[0], x, out_shape)
        return
    ctx.generic(node.outputs[0], out_shape, ctx.dtype(x), lambda cs: ctx.read_bcast(x, out_shape, cs))


@register("Tile")
def tile(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    reps = required_ints(ctx, node, 1, "Tile repeats must be a compile-time constant")
    out_shape = [d * r for d, r in zip(s, reps)]
    ctx.generic(node.outputs[0], out_shape, ctx.dtype(x), lambda cs: ctx.read(x, [c % d for c, d in zip(cs, s)]))


def pad_params(ctx, node, rank):
    if ctx.opset < 11:
        pads = list(node.attr("pads"))
        value = node.attr("value", 0.0)
    else:
        pads = required_ints(ctx, node, 1, "Pad pads must be a compile-time constant")
        value = None
        if node.input(2):
            c = ctx.const(node.input(2))
            if c is None:
                value = node.input(2)     # read at run time (a tensor name)
            else:
                value = np.asarray(c).reshape(-1)[0].item() if c.size else 0
    axes = const_ints(ctx, node, 3)
    if axes is not None:
        full = [0] * (2 * rank)
        axes = [norm_axis(a, rank) for a in axes]
        for k, a in enumerate(axes):
            full[a], full[rank + a] = pads[k], pads[len(axes) + k]
        pads = full
    if len(pads) != 2 * rank:
        raise ShapeError(f"Pad has {len(pads)} pads for rank {rank}")
    return pads, (0 if value is None else value), node.attr("mode", "constant")


@register("Pad")
def pad(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    rank = len(s)
    pads, value, mode = pad_params(ctx, node, rank)
    if not any(pads):
        ctx.view(node.outputs[0], x, s)
        return
    out_shape = [d + pads[i] + pads[rank + i] for i, d in enumerate(s)]
    dt = ctx.dtype(x)

    def rule(cs):
        src, inside = [], kir.const(True, "bool")
        for i, (c, d) in enumerate(zip(cs, s)):
            j = c - pads[i]
            if pads[i] == 0 and pads[rank + i] == 0:
                src.append(j)
                continue
            if mode == "constant":
                inside = kir.binary("and", inside, kir.binary("and", j >= 0, j < d))
                j = kir.clamp(j, 0, d - 1)
            elif mode == "edge":
                j = kir.clamp(j, 0, d - 1)
            elif mode == "reflect":
                if d == 1:
                    j = kir.i32(0)
                else:
                    period = 2 * (d - 1)
                    m = ((j % period) + period) % period
                    j = select(m >= d, period - m, m)
            elif mode == "wrap":
                j = ((j % d) + d) % d
            else:
                raise Unsupported(f"Pad mode {mode!r}")
            src.append(j)
        v = ctx.read(x, src)
        if mode == "constant":
            v = select(inside, v, ctx.read_flat(value, kir.i32(0)) if isinstance(value, str) else kir.const(value, dt))
        return v
    op = ctx.generic(node.outputs[0], out_shape, dt, rule)
    if mode == "constant" and not isinstance(value, str) and value == 0 and rank >= 3 \
            and not any(pads[:2] + pads[rank:rank + 2]):
        # zeros around the spatial dims only: a Conv reading it can take them as its own pads
        # (passes.fold_pad_into_conv)
        op.zero_pad = (x, tuple(pads[2:rank]) + tuple(pads[rank + 2:]))


@register("Split")
def split(ctx, node):
    x = node.inputs[0]
    s = ctx.shape(x)
    axis = norm_axis(node.attr("axis", 0), len(s))
    outs = [o for o in node.outputs]
    sizes = const_ints(ctx, node, 1, "split")
    if sizes is None:
        k = node.attr("num_outputs", len(outs))
        chunk = -(-s[axis] // k)
        sizes = [min(chunk, s[axis] - i * chunk) for i in range(k)]
    if sum(sizes) != s[axis] or len(sizes) != len(outs):
        raise ShapeError(f"Split sizes {sizes} do not cover axis {axis} of size {s[axis]} with {len(outs)} outputs")
    start = 0
    for o, n in zip(outs, sizes):
        shape = list(s)
        shape[axis] = n
        if o:
            ctx.generic(o, shape, ctx.dtype(x),
                        lambda cs, st=start: ctx.read(x, cs[:axis] + [cs[axis] + st] + cs[axis + 1:]))
        start += n


@register("GatherElements")
def gather_elements(ctx, node):
    data, idx = node.inputs[0], node.inputs[1]
    ds, js = ctx.shape(data), ctx.shape(idx)
    axis = norm_axis(node.attr("axis", 0), len(ds))
    if len(ds) != len(js):
        raise ShapeError(f"GatherElements data {ds} and indices {js} ranks differ")
    n = ds[axis]

    def rule(cs):
        i = ctx.read(idx, cs)
        i = kir.clamp(select(i < 0, i + n, i), 0, max(n - 1, 0))
        return ctx.read(data, cs[:axis] + [i] + cs[axis + 1:])
    ctx.generic(node.outputs[0], js, ctx.dtype(data), rule)


@register("GatherND")
def gather_nd(ctx, node):
    data, idx = node.inputs[0], node.inputs[1]
    ds, js = ctx.shape(data), ctx.shape(idx)
    b = node.attr("batch_dims", 0)
    k = js[-1]
    if k > len(ds) - b:
        raise ShapeError(f"GatherND index depth {k} exceeds data rank {len(ds)} - batch_dims {b}")
    out_shape = list(js[:-1]) + list(ds[b + k:])

    def rule(cs):
        lead = cs[:len(js) - 1]
        coords = list(lead[:b])
        for j in range(k):
            n = ds[b + j]
            i = ctx.read(idx, lead + [kir.i32(j)])
            coords.append(kir.clamp(select(i < 0, i + n, i), 0, max(n - 1, 0)))
        return ctx.read(data, coords + cs[len(js) - 1:])
    ctx.generic(node.outputs[0], out_shape, ctx.dtype(data), rule)


# --- generators whose size is a shape value (constant inputs fold before reaching these) -----

def _scalar_input(ctx, node, i, what):
    c = ctx.const(node.input(i))
    if c is None:
        raise Unsupported(f"{node.op}'s {what} is computed from data at run time; its output size would "
                          "depend on data (only sizes computed from the input shapes are supported)")
    v = np.asarray(c).reshape(-1)
    if v.size != 1:
        raise ShapeError(f"{node.op}'s {what} must be a scalar, got {v.size} values")
    return v[0]


@register("Range")
def range_op(ctx, node):
    """Range with a size computed from symbolic dims (e.g. position ids 0..seq-1)."""
    start, limit, delta = (_scalar_input(ctx, node, i, w) for i, w in enumerate(("start", "limit", "delta")))
    if any(isinstance(v, float) or (hasattr(v, "dtype") and v.dtype.kind == "f") for v in (start, limit, delta)):
        raise Unsupported("Range over floats with a symbolic size")
    if is_dim(delta) or int(delta) == 0:
        raise Unsupported("Range needs a fixed, non-zero delta")
    delta = int(delta)
    start = start if is_dim(start) else int(start)
    limit = limit if is_dim(limit) else int(limit)
    n = ceildiv(limit - start, delta) if delta > 0 else ceildiv(start - limit, -delta)
    n = dmax(n, 0)
    dt = ctx.dtype(node.inputs[0])
    ctx.generic(node.outputs[0], [n], dt, lambda cs: kir.cast(kir.as_expr(start, "i32") + cs[0] * delta, dt)
                if dt != "i32" else kir.as_expr(start, "i32") + cs[0] * delta)


@register("ConstantOfShape")
def constant_of_shape(ctx, node):
    """ConstantOfShape whose shape is computed from symbolic dims, or a large fill (a small fixed
    one folds: lowering.is_large_fill)."""
    shape = required_ints(ctx, node, 0, "ConstantOfShape's shape must be computed from the input shapes")
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    dt = internal_of_numpy(value.dtype) or "f32"      # float16 / float64 are held as f32
    ctx.onnx_types[node.outputs[0]] = onnx_type_of_numpy(value.dtype)
    v = value[0]
    c = kir.const(bool(v) if dt == "bool" else float(v) if dt == "f32" else int(v), dt)
    ctx.generic(node.outputs[0], shape, dt, lambda cs: c)


def onnx_type_of_numpy(dt) -> int:
    from onnx import helper
    return helper.np_dtype_to_tensor_dtype(np.dtype(dt))
