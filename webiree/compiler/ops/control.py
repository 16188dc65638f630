"""Control flow, compiled away: If, Loop and Scan become straight-line nodes.

- If on a compile-time condition inlines the taken branch; on a run-time
  condition both branches are computed and an element-wise select picks
  (their outputs must have the same shapes: a shape that depends on the
  condition cannot be compiled).
- Loop is unrolled one iteration at a time: each iteration's body is inlined
  with its inputs bound to the previous iteration's outputs, then a
  continuation node decides (the trip count and the condition must be known
  at compile time by then). Scan outputs are stacked at the end.
- Scan is unrolled over its (static) sequence length, slicing the scan
  inputs and stacking the scan outputs.

Internal helper ops (domain "webiree"): Take (one index of an axis), Stack,
Select (a run-time If's merge) and LoopStep (the loop continuation).
"""

from __future__ import annotations

import itertools

import numpy as np
from onnx import helper

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import select
from ..expand import inline_graph
from ..graph import Node
from .registry import Unsupported, register
from .common import norm_axis

MAX_UNROLL = 4096
_ids = itertools.count()


def _internal(ctx, op: str, inputs, outputs, **attrs) -> Node:
    return Node(f"{ctx.node.name}/{op}_{next(_ids)}", op, list(inputs), list(outputs), attrs, "webiree", None,
                ctx.node.opset)


def _const_node(ctx, name: str, value) -> Node:
    proto = helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), np.asarray(value).shape,
        np.asarray(value).reshape(-1).tolist()))
    return Node(f"{ctx.node.name}/const_{next(_ids)}", "Constant", [], [name], {"value": np.asarray(value)}, "",
                proto, ctx.node.opset)


def _fresh(ctx, base: str) -> str:
    return ctx.fresh(f"{ctx.node.name}/{base}_{next(_ids)}")


# --- internal ops ----------------------------------------------------------------

@register("webiree.Take")
def take(ctx, node):
    x = node.inputs[0]
    axis, index = node.attrs["axis"], node.attrs["index"]
    s = list(ctx.shape(x))
    c = ctx.const(x)
    if c is not None:
        ctx.set_const(node.outputs[0], np.take(c, index, axis=axis))
        return
    out = s[:axis] + s[axis + 1:]
    ctx.generic(node.outputs[0], out, ctx.dtype(x),
                lambda cs: ctx.read(x, cs[:axis] + [kir.i32(index)] + cs[axis:]))
    if x in ctx.onnx_types:
        ctx.onnx_types[node.outputs[0]] = ctx.onnx_types[x]


@register("webiree.Stack")
def stack(ctx, node):
    names = node.inputs
    s = list(ctx.shape(names[0]))
    axis = norm_axis(node.attrs["axis"], len(s) + 1)
    for n in names:
        if list(ctx.shape(n)) != s:
            raise ShapeError(f"stacked values differ in shape: {[ctx.shape(n) for n in names]}")
    consts = [ctx.const(n) for n in names]
    if all(c is not None for c in consts):
        ctx.set_const(node.outputs[0], np.stack(consts, axis=axis))
        return
    out = s[:axis] + [len(names)] + s[axis:]

    def rule(cs):
        i = cs[axis]
        rest = cs[:axis] + cs[axis + 1:]
        value = ctx.read(names[-1], rest)
        for k in reversed(range(len(names) - 1)):
            value = select(kir.binary("eq", i, kir.i32(k)), ctx.read(names[k], rest), value)
        return value
    ctx.generic(node.outputs[0], out, ctx.dtype(names[0]), rule)


@register("webiree.Select")
def select_branch(ctx, node):
    cond, a, b = node.inputs
    sa, sb = tuple(ctx.shape(a)), tuple(ctx.shape(b))
    if sa != sb:
        raise Unsupported(f"If branches give shapes {sa} and {sb}: the output shape depends on the run-time "
                          "condition")
    if ctx.dtype(a) != ctx.dtype(b):
        raise Unsupported("If branches give different element types")
    ctx.generic(node.outputs[0], sa, ctx.dtype(a),
                lambda cs: select(ctx.read_flat(cond, kir.i32(0)), ctx.read(a, cs), ctx.read(b, cs)))


# --- If ---------------------------------------------------------------------------

@register("If")
def if_op(ctx, node):
    cond = node.inputs[0]
    then_g, else_g = node.attrs["then_branch"], node.attrs["else_branch"]
    c = ctx.const(cond)
    if c is not None:
        g = then_g if bool(np.asarray(c).reshape(-1)[0]) else else_g
        ctx.expand(inline_graph(ctx, g, {}, node.outputs))
        return
    if ctx.dtype(cond) != "bool":
        raise ShapeError("If's condition must be a bool tensor")
    outs_t = [_fresh(ctx, f"then{i}") for i in range(len(node.outputs))]
    outs_e = [_fresh(ctx, f"else{i}") for i in range(len(node.outputs))]
    nodes = inline_graph(ctx, then_g, {}, outs_t) + inline_graph(ctx, else_g, {}, outs_e)
    for o, t, e in zip(node.outputs, outs_t, outs_e):
        if o:
            nodes.append(_internal(ctx, "Select", [cond, t, e], [o]))
    ctx.expand(nodes)


# --- Loop -------------------------------------------------------------------------

@register("Loop")
def loop(ctx, node):
    body = node.attrs["body"]
    n_state = len(node.inputs) - 2
    state = list(node.inputs[2:])
    _loop_step(ctx, node, body, 0, state, [[] for _ in range(len(body.output) - 1 - n_state)], node.input(1))


@register("webiree.LoopStep")
def loop_step(ctx, node):
    a = node.attrs
    _loop_step(ctx, a["loop"], a["loop"].attrs["body"], a["k"], list(node.inputs[:a["n_state"]]),
               a["scans"], a["cond"])


def _known_scalar(ctx, name: str, what: str):
    """The value of a scalar the unrolling depends on; it must be known when compiling."""
    v = ctx.const(name)
    if v is None:
        raise Unsupported(f"{what} must be known at compile time")
    return np.asarray(v).reshape(-1)[0].item()


def _loop_step(ctx, loop_node, body, k, state, scans, cond):
    m = loop_node.input(0)
    trip = int(_known_scalar(ctx, m, "the trip count")) if m else None
    go = bool(_known_scalar(ctx, cond, "the loop condition")) if cond else True
    if trip is not None and k >= trip:
        go = False
    if go and k >= MAX_UNROLL:
        raise Unsupported(f"more than {MAX_UNROLL} iterations")
    if not go:
        nodes = []
        n_state = len(state)
        for o, v in zip(loop_node.outputs[:n_state], state):
            if o:
                nodes.append(Node(f"{loop_node.name}/out_{next(_ids)}", "Identity", [v], [o], {}, "",
                                  helper.make_node("Identity", [v], [o]), ctx.node.opset))
        for o, parts in zip(loop_node.outputs[n_state:], scans):
            if not o:
                continue
            if not parts:
                raise Unsupported("a Loop with zero iterations has scan outputs of unknown shape")
            nodes.append(_internal(ctx, "Stack", parts, [o], axis=0))
        ctx.expand(nodes)
        return
    g_in = [i.name for i in body.input]
    g_out = [o.name for o in body.output]
    it = _fresh(ctx, "iter")
    cond_in = _fresh(ctx, "cond_in")
    nodes = [_const_node(ctx, it, np.array(k, np.int64)), _const_node(ctx, cond_in, np.array(True))]
    bindings = {g_in[0]: it, g_in[1]: cond_in}
    bindings.update({name: v for name, v in zip(g_in[2:], state)})
    outs = [_fresh(ctx, "out") for _ in g_out]
    nodes += inline_graph(ctx, body, bindings, outs)
    n_state = len(state)
    new_state = outs[1:1 + n_state]
    new_scans = [parts + [o] for parts, o in zip(scans, outs[1 + n_state:])]
    # (the continuation "produces" the loop's outputs: if a body node is unsupported, they are blocked)
    step = _internal(ctx, "LoopStep", new_state, [o for o in loop_node.outputs], loop=loop_node, k=k + 1, n_state=n_state,
                     scans=new_scans, cond=outs[0])
    nodes.append(step)
    ctx.expand(nodes)


# --- Scan -------------------------------------------------------------------------

@register("Scan")
def scan(ctx, node):
    body = node.attrs["body"]
    n_scan = int(node.attrs["num_scan_inputs"])
    if ctx.opset < 9:
        _scan8(ctx, node, body, n_scan)
        return
    inputs = list(node.inputs)
    n_state = len(inputs) - n_scan
    _scan_nodes(ctx, node, body, inputs[:n_state], inputs[n_state:], list(node.outputs), batch=None)


def _scan8(ctx, node, body, n_scan):
    """Scan-8: a leading batch axis on every input and output, scanning axis 1."""
    seq_lens = node.input(0)
    inputs = list(node.inputs[1:])
    n_state = len(inputs) - n_scan
    if node.attrs.get("directions") and any(node.attrs["directions"]):
        dirs = node.attrs["directions"]
    else:
        dirs = [0] * n_scan
    batch = ctx.shape(inputs[0])[0]
    if seq_lens:
        lens = ctx.const(seq_lens)
        full = ctx.shape(inputs[n_state])[1]
        if lens is None or any(int(v) != full for v in np.asarray(lens).reshape(-1)):
            raise Unsupported("Scan-8 with sequence_lens shorter than the sequence")
    nodes = []
    per_batch_outs = [[] for _ in node.outputs]
    for b in range(batch):
        sl = []
        for x in inputs:
            t = _fresh(ctx, f"b{b}")
            nodes.append(_internal(ctx, "Take", [x], [t], axis=0, index=b))
            sl.append(t)
        outs = [_fresh(ctx, f"b{b}_out") for _ in node.outputs]
        shapes = [list(ctx.shape(x))[1:] for x in inputs[n_state:]]
        nodes += _scan_body_nodes(ctx, body, sl[:n_state], sl[n_state:], outs, [0] * n_scan, dirs,
                                  [0] * (len(outs) - n_state), [0] * (len(outs) - n_state), shapes)
        for i, o in enumerate(outs):
            per_batch_outs[i].append(o)
    for o, parts in zip(node.outputs, per_batch_outs):
        if o:
            nodes.append(_internal(ctx, "Stack", parts, [o], axis=0))
    ctx.expand(nodes)


def _scan_nodes(ctx, node, body, state, xs, outputs, batch):
    n_scan = len(xs)
    n_out_scan = len(body.output) - len(state)
    in_axes = list(node.attrs.get("scan_input_axes", [0] * n_scan))
    in_dirs = list(node.attrs.get("scan_input_directions", [0] * n_scan))
    out_axes = list(node.attrs.get("scan_output_axes", [0] * n_out_scan))
    out_dirs = list(node.attrs.get("scan_output_directions", [0] * n_out_scan))
    ctx.expand(_scan_body_nodes(ctx, body, state, xs, outputs, in_axes, in_dirs, out_axes, out_dirs,
                                [list(ctx.shape(x)) for x in xs]))


def _scan_body_nodes(ctx, body, state, xs, outputs, in_axes, in_dirs, out_axes, out_dirs, x_shapes):
    n_state = len(state)
    in_axes = [norm_axis(a, len(s)) for a, s in zip(in_axes, x_shapes)]
    lengths = {s[a] for s, a in zip(x_shapes, in_axes)}
    if len(lengths) != 1:
        raise ShapeError(f"Scan inputs have different sequence lengths {sorted(lengths)}")
    T = lengths.pop()
    if T > MAX_UNROLL:
        raise Unsupported(f"a sequence of {T} steps (more than {MAX_UNROLL})")
    g_in = [i.name for i in body.input]
    g_out = [o.name for o in body.output]
    nodes = []
    cur = list(state)
    scans = [[] for _ in range(len(g_out) - n_state)]
    for t in range(T):
        bindings = dict(zip(g_in[:n_state], cur))
        for j, (x, a, d) in enumerate(zip(xs, in_axes, in_dirs)):
            sl = _fresh(ctx, f"x{j}_t{t}")
            nodes.append(_internal(ctx, "Take", [x], [sl], axis=a, index=(T - 1 - t) if d else t))
            bindings[g_in[n_state + j]] = sl
        outs = [_fresh(ctx, f"t{t}_out") for _ in g_out]
        nodes += inline_graph(ctx, body, bindings, outs)
        cur = outs[:n_state]
        for parts, o in zip(scans, outs[n_state:]):
            parts.append(o)
    for o, v in zip(outputs[:n_state], cur):
        if o:
            nodes.append(Node(f"{ctx.node.name}/final_{next(_ids)}", "Identity", [v], [o], {}, "",
                              helper.make_node("Identity", [v], [o]), ctx.node.opset))
    for j, (o, parts) in enumerate(zip(outputs[n_state:], scans)):
        if not o:
            continue
        if not parts:
            raise Unsupported("a Scan over zero steps has scan outputs of unknown shape")
        axis = out_axes[j] if j < len(out_axes) else 0
        if j < len(out_dirs) and out_dirs[j]:
            parts = parts[::-1]
        nodes.append(_internal(ctx, "Stack", parts, [o], axis=axis))
    return nodes
