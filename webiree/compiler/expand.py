"""Decomposition of ONNX function ops, and inlining of subgraphs.

Many ONNX ops are defined as a *function* of simpler ops (the op schema holds
its body: Attention, SoftmaxCrossEntropyLoss, RMSNormalization, Swish, ...).
An op webiree has no handler for (or a variant its handler refuses) is
replaced by that body: its nodes get names unique to this use, attribute
references are resolved against the node's attributes (with the schema's
defaults), and each node keeps the opset the function was written for. The
lowering then lowers them like any other node (they may fold, or expand
further).

`inline_graph` does the same for a subgraph (an If branch, a loop body run a
known number of times): its nodes renamed, its inputs bound to given tensors,
names from the enclosing scope left alone.
"""

from __future__ import annotations

import itertools

import onnx
from onnx import helper

from .graph import Node

_counter = itertools.count()


def _attr_value(a):
    from .importer import _attr_value as value
    return value(a)


def to_node(proto: onnx.NodeProto, name: str, opset: int | None) -> Node:
    attrs = {a.name: _attr_value(a) for a in proto.attribute}
    return Node(name, proto.op_type, list(proto.input), list(proto.output), attrs, proto.domain, proto, opset)


def _rename_graph(g: onnx.GraphProto, rename) -> None:
    """Rename, in place, references inside a subgraph to names of the enclosing scope."""
    local = {i.name for i in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        local.update(o for o in n.output if o)
    for n in g.node:
        for i, x in enumerate(n.input):
            if x and x not in local:
                n.input[i] = rename(x)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename_graph(a.g, lambda x, local=local: x if x in local else rename(x))
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    _rename_graph(sg, lambda x, local=local: x if x in local else rename(x))
    for o in g.output:
        if o.name not in local:
            o.name = rename(o.name)


def _copy_nodes(nodes, rename, attr_values: dict | None) -> list[onnx.NodeProto]:
    out = []
    for src in nodes:
        n = onnx.NodeProto()
        n.CopyFrom(src)
        for i, x in enumerate(n.input):
            n.input[i] = rename(x) if x else ""
        for i, x in enumerate(n.output):
            n.output[i] = rename(x) if x else ""
        if attr_values is not None:
            kept = []
            for a in n.attribute:
                if a.ref_attr_name:
                    ref = attr_values.get(a.ref_attr_name)
                    if ref is None:
                        continue          # not given and no default: the inner op's own default applies
                    b = onnx.AttributeProto()
                    b.CopyFrom(ref)
                    b.name = a.name
                    kept.append(b)
                else:
                    kept.append(a)
            del n.attribute[:]
            n.attribute.extend(kept)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename_graph(a.g, rename)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _rename_graph(g, rename)
        out.append(n)
    return out


def _type_proto(ctx, name: str) -> onnx.TypeProto:
    """What ONNX knows of a tensor: its element type and (static) shape."""
    if not name:
        return onnx.TypeProto()
    elem = None
    if name in ctx.graph.types:
        elem = ctx.graph.types[name].elem_type
    elif name in ctx.onnx_types:
        elem = ctx.onnx_types[name]
    elif ctx.const(name) is not None:
        elem = helper.np_dtype_to_tensor_dtype(ctx.const(name).dtype)
    else:
        elem = {"f32": 1, "i32": 7, "u32": 12, "bool": 9}[ctx.dtype(name)]
    return helper.make_tensor_type_proto(elem, list(ctx.shape(name)))


def function_body(ctx, node: Node):
    """(function proto, opset of its body) for this node's op at the node's opset, or None."""
    opset = ctx.opset if node.domain in ("", "ai.onnx") else ctx.graph.domain_opsets.get(node.domain, 1)
    try:
        schema = onnx.defs.get_schema(node.op, opset, node.domain)
    except Exception:   # SchemaError: no such op at this opset
        return None
    plain = [v for v in schema.function_opset_versions if v <= opset]
    ctx_dep = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not plain and not ctx_dep:
        return None
    proto = onnx.NodeProto()
    proto.CopyFrom(node.proto)
    given = {a.name for a in proto.attribute}
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value and attr.default_value.type:
            proto.attribute.append(attr.default_value)
    fn = onnx.FunctionProto()
    try:
        if plain and (not ctx_dep or max(plain) >= max(ctx_dep)):
            fn.ParseFromString(schema.get_function_with_opset_version(max(plain)))
        else:
            types = [_type_proto(ctx, i).SerializeToString() for i in proto.input]
            fn.ParseFromString(schema.get_context_dependent_function_with_opset_version(
                max(ctx_dep), proto.SerializeToString(), types))
    except Exception:   # the function builder refused these input types
        return None
    if not fn.node:
        return None
    return fn, proto


def expand_function(ctx, node: Node):
    """The nodes of this node's ONNX function body, ready to lower in its place, or None."""
    if node.proto is None:
        return None
    found = function_body(ctx, node)
    if found is None:
        return None
    fn, proto = found
    tag = f"{node.name}/{next(_counter)}/"
    names = {}
    for i, x in enumerate(fn.input):
        names[x] = proto.input[i] if i < len(proto.input) else ""
    for i, x in enumerate(fn.output):
        if i < len(proto.output) and proto.output[i]:
            names[x] = proto.output[i]

    def rename(x):
        if x in names:
            return names[x]
        return tag + x
    attrs = {a.name: a for a in proto.attribute}
    body = _copy_nodes(fn.node, rename, attrs)
    opset = next((o.version for o in fn.opset_import if o.domain in ("", "ai.onnx")), ctx.opset)
    _infer_types(ctx, proto, body, fn.opset_import, opset)
    return [to_node(n, f"{tag}{n.op_type}_{k}", opset) for k, n in enumerate(body)]


def inline_graph(ctx, g: onnx.GraphProto, bindings: dict, outputs: list[str], tag: str | None = None) -> list[Node]:
    """Nodes computing `outputs` (names in the enclosing scope) from subgraph `g`, whose inputs
    are bound to the tensors in `bindings` (subgraph input name -> enclosing tensor name)."""
    tag = tag or f"{ctx.node.name}/{next(_counter)}/"
    local = {i.name for i in g.input} | {t.name for t in g.initializer}
    for n in g.node:
        local.update(o for o in n.output if o)

    def rename(x):
        if x in bindings:
            return bindings[x]
        return tag + x if x in local else x
    nodes = []
    for t in g.initializer:
        nodes.append(helper.make_node("Constant", [], [rename(t.name)], value=t))
    nodes += _copy_nodes(g.node, rename, None)
    for o, dst in zip(g.output, outputs):
        if dst:
            nodes.append(helper.make_node("Identity", [rename(o.name)], [dst]))
    return [to_node(n, f"{tag}{n.op_type}_{k}", ctx.node.opset) for k, n in enumerate(nodes)]


def _infer_types(ctx, proto, body, imports, opset) -> None:
    """Record ONNX's types for the body's new tensors (CastLike and nested functions read them)."""
    try:
        inputs = [helper.make_value_info(i, _type_proto(ctx, i)) for i in dict.fromkeys(x for x in proto.input if x)]
        outputs = [helper.make_value_info(o, onnx.TypeProto()) for o in proto.output if o]
        m = helper.make_model(helper.make_graph(body, "expand", inputs, outputs),
                              opset_imports=list(imports) or [helper.make_opsetid("", opset)])
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
    except Exception:
        return
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if t is not None and t.elem_type and vi.name not in ctx.onnx_types:
            ctx.onnx_types[vi.name] = t.elem_type
