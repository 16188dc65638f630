"""Import: ONNX ModelProto (path, bytes or proto) -> Graph IR.

Resolves symbolic input dims from user-pinned shapes, runs ONNX shape
inference, and turns initializers into numpy constants. Every problem with
the file itself is a `ModelError`; a dim that cannot be resolved is a
`ShapeError` that names the `--input-shape` to pass.
"""

from __future__ import annotations

import heapq
import os
import re
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ModelError, ShapeError
from . import onnx_file
from ..ir.sym import Dim, symbol
from .graph import Graph, Node, TensorType

MIN_OPSET, MAX_OPSET = 1, 28   # what onnx 1.23 defines; handlers reject legacy forms they cannot honour


def _model_file(model) -> Path:
    path = Path(os.fspath(model))
    if not path.exists():
        raise ModelError(f"no such file: {path}", hint="check the path of the .onnx model")
    if path.is_dir():
        raise ModelError(f"{path} is a folder, not an ONNX file", hint="give the path of a .onnx file")
    return path


def _not_onnx(path: Path, e: Exception) -> ModelError:
    return ModelError(f"{path.name} is not an ONNX model ({type(e).__name__}: {str(e)[:120]})",
                      hint="the file must be a serialized onnx.ModelProto")


def load_model_proto(model) -> onnx.ModelProto:
    """Accept a path, raw bytes or a ModelProto; external data is loaded from
    beside the file."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as e:  # protobuf DecodeError and friends
            raise ModelError(f"these bytes are not an ONNX model ({type(e).__name__})",
                             hint="pass the bytes of a .onnx file") from None
        _check_external(proto, None)
        return proto
    path = _model_file(model)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise _not_onnx(path, e) from None
    _check_external(proto, path.parent)
    try:
        onnx.load_external_data_for_model(proto, str(path.parent))
    except Exception as e:
        raise ModelError(f"cannot load the external data of {path.name}: {e}",
                         hint="keep the .data file(s) beside the model, as exported") from None
    return proto


def open_model(model) -> tuple[onnx.ModelProto, Path | None]:
    """What the compiler imports: a file's ModelProto holding no large weights (onnx_file.open_model:
    they stay in the file, and in its external data files, until tensor_array maps them) and the
    folder they are found in; bytes or a ModelProto as load_model_proto gives them (no folder)."""
    if isinstance(model, (onnx.ModelProto, bytes, bytearray, memoryview)):
        return load_model_proto(model), None
    path = _model_file(model)
    try:
        proto = onnx_file.open_model(path)
    except Exception as e:
        raise _not_onnx(path, e) from None
    _check_external(proto, path.parent)
    for t in proto.graph.initializer:   # small external tensors inline: shape inference reads their values
        if t.data_location == onnx.TensorProto.EXTERNAL and _nbytes(t) < onnx_file.OFFLOAD_MIN_BYTES:
            a = tensor_array(t, path.parent)
            t.raw_data = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
    return proto, path.parent


def _nbytes(t: onnx.TensorProto) -> int:
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:   # UNDEFINED, or a type numpy has no dtype for
        return 0
    return 0 if t.data_type == onnx.TensorProto.STRING else int(np.prod(t.dims, dtype=np.int64)) * itemsize


def tensor_array(t: onnx.TensorProto, base: Path | None) -> np.ndarray:
    """An initializer's values: mapped from its file when it keeps them there (open_model)."""
    if t.data_location == onnx.TensorProto.EXTERNAL and base is not None:
        return onnx_file.tensor_array(t, base)
    return numpy_helper.to_array(t)


def _check_external(proto: onnx.ModelProto, base: Path | None):
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = {e.key: e.value for e in t.external_data}.get("location", "")
            if base is None:
                raise ModelError(f"initializer {t.name!r} keeps its data in an external file ({loc})",
                                 hint="compile from the file path so its external data can be found")
            target = (base / loc).resolve()
            if not str(target).startswith(str(base.resolve())) or not target.exists():
                raise ModelError(f"external data file {loc!r} of initializer {t.name!r} is missing or outside the model's folder",
                                 hint="keep the .data file(s) beside the model, as exported")


def _attr_value(a: onnx.AttributeProto):
    v = helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", "replace") for x in v]
    return v


def _dims(vi: onnx.ValueInfoProto):
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]


_INFERENCE_ERROR = re.compile(r"\(op_type:(?P<op>[^,]*), node name: (?P<node>[^)]*)\): (?P<msg>.*)")
_TYPE_ERROR = ("inconsistent type", "unsupported type", "type mismatch", "Type Error", "elem type")


def _raise_type_error(text: str) -> None:
    """Raise the first element-type error ONNX's strict shape inference reported (a ModelError naming
    the node); other inference failures are left to our own shape rules, which are more permissive."""
    for line in text.splitlines():
        m = _INFERENCE_ERROR.search(line)
        if not m:
            continue
        msg = m.group("msg").replace("[TypeInferenceError] ", "").replace("[ShapeInferenceError] ", "").strip()
        if any(k in msg for k in _TYPE_ERROR) and "expected to have type but instead is null" not in msg:
            raise ModelError(f"element types do not fit the op: {msg[:300]}", node=m.group("node") or None,
                             op=m.group("op"), hint="the inputs' element types break the op's ONNX type "
                                                    "constraints; re-export the model or insert a Cast")


def _check_names(proto: onnx.ModelProto) -> None:
    """Names must be text: protobuf hands back bytes for a string field that is not valid UTF-8
    (a corrupt file the checker lets through)."""
    g = proto.graph
    for where, values in (("graph", [g.name]), ("graph input", [v.name for v in g.input]), ("graph output", [v.name for v in g.output]),
                          ("initializer", [t.name for t in g.initializer]),
                          ("value_info", [v.name for v in g.value_info]),
                          ("opset domain", [o.domain for o in proto.opset_import])):
        for v in values:
            if not isinstance(v, str):
                raise ModelError(f"a {where} name is not valid UTF-8 text ({bytes(v)[:40]!r})",
                                 hint="the file is corrupt; re-export the model")
    for n in g.node:
        for v in [n.name, n.op_type, n.domain, *n.input, *n.output, *(a.name for a in n.attribute)]:
            if not isinstance(v, str):
                raise ModelError(f"node {n.name if isinstance(n.name, str) else '?'!r} holds a name that is not "
                                 f"valid UTF-8 text ({bytes(v)[:40]!r})", hint="the file is corrupt; re-export the model")


def node_reads(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads: its inputs and what its subgraphs read from the enclosing scope."""
    used = [i for i in node.input if i]
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                  list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            for n in g.node:
                local.update(n.output)
            for n in g.node:
                used.extend(x for x in node_reads(n) if x not in local)
            used.extend(o.name for o in g.output if o.name not in local)
    return used


def sort_nodes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its graph's nodes in topological order (a copy; the same object when they
    already are). Exporters and converters sometimes write a valid graph out of order, which
    onnxruntime runs; the order among independent nodes is kept. A cycle is a ModelError
    naming its nodes."""
    nodes = list(proto.graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [sorted({producer[x] for x in node_reads(n) if x in producer} - {i}) for i, n in enumerate(nodes)]
    if all(d < i for i, ds in enumerate(deps) for d in ds):
        return proto
    users = [[] for _ in nodes]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    waiting = [len(ds) for ds in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        stuck = [nodes[i].name or f"#{i} ({nodes[i].op_type})" for i in range(len(nodes)) if waiting[i]]
        raise ModelError(f"the graph has a cycle through nodes {stuck[:8]}{' ...' if len(stuck) > 8 else ''}",
                         hint="a node's output feeds back into its own inputs; re-export the model")
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.node[:]
    out.graph.node.extend(nodes[i] for i in order)
    return out


ORT_DEFAULT_DOMAIN = "webiree.onnxruntime_default"   # see _as_checked


def _as_checked(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model as ONNX's checker and shape inference should see it: a default-domain node of an
    op ONNX does not define at the model's opset but onnxruntime does (SimplifiedLayerNormalization,
    LayerNormalization before opset 17: ops/registry.ONNXRUNTIME_DEFAULT_DOMAIN) is checked as a
    custom-domain op. (The graph keeps its own domain.)"""
    from .ops.registry import ONNXRUNTIME_DEFAULT_DOMAIN

    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    moved = []
    for i, n in enumerate(proto.graph.node):
        if opset is None or n.domain not in ("", "ai.onnx") or n.op_type not in ONNXRUNTIME_DEFAULT_DOMAIN:
            continue
        try:
            onnx.defs.get_schema(n.op_type, opset, "")
        except Exception:   # SchemaError: ONNX has no such op at this opset
            moved.append(i)
    if not moved:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for i in moved:
        out.graph.node[i].domain = ORT_DEFAULT_DOMAIN
    out.opset_import.append(helper.make_opsetid(ORT_DEFAULT_DOMAIN, 1))
    return out


def import_model(model, input_shapes: dict | None = None, dims: dict | None = None,
                 base: Path | None = None) -> Graph:
    """The graph IR of `model`. A ModelProto passed in is left as it was: the input shapes this
    writes while resolving dims are put back (a build of several kernel variants imports it again).
    base: the folder of the file an open_model proto came from (its weights are mapped from there)."""
    if not isinstance(model, onnx.ModelProto):
        model, base = open_model(model)
    proto = sort_nodes(model)
    saved = [(vi, onnx.ValueInfoProto.FromString(vi.SerializeToString())) for vi in proto.graph.input]
    try:
        return _import(proto, input_shapes, dims, base)
    finally:
        for vi, original in saved:
            vi.CopyFrom(original)


SKELETON_MAX_BYTES = 1 << 16   # initializers this large are graph inputs in _skeleton (never shape data)


def _skeleton(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model as ONNX's checker and shape inference need it: every initializer larger than
    SKELETON_MAX_BYTES, or kept in a file (open_model), becomes a typed graph input instead. Both
    serialize the model they are given (and inference returns a copy), so handing them a 650 MB
    model cost three more copies of its weights in host memory; the small initializers (shapes,
    axes) stay for data propagation."""
    g = proto.graph
    big = [t for t in g.initializer
           if _nbytes(t) > SKELETON_MAX_BYTES or t.data_location == onnx.TensorProto.EXTERNAL]
    if not big:
        return proto
    out = onnx.ModelProto()
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(out, f, getattr(proto, f))
    out.opset_import.extend(proto.opset_import)
    out.functions.extend(proto.functions)
    og = out.graph
    og.name = g.name
    og.node.extend(g.node)
    og.input.extend(g.input)
    og.output.extend(g.output)
    og.value_info.extend(g.value_info)
    og.sparse_initializer.extend(g.sparse_initializer)
    big_names = {t.name for t in big}
    og.initializer.extend(t for t in g.initializer if t.name not in big_names)
    inputs = {vi.name for vi in g.input}
    og.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in big if t.name not in inputs)
    return out


def _import(proto: onnx.ModelProto, input_shapes: dict | None, dims: dict | None, base: Path | None) -> Graph:
    input_shapes = dict(input_shapes or {})
    checked = _as_checked(_skeleton(proto))
    try:
        onnx.checker.check_model(checked)
    except Exception as e:
        raise ModelError(f"the model is not valid ONNX: {str(e).splitlines()[0][:300]}",
                         hint="re-export the model, or run onnx.checker.check_model to see the problem") from None
    _check_names(proto)
    g = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None and proto.opset_import and all(n.domain not in ("", "ai.onnx") for n in g.node):
        opset = MAX_OPSET    # only other domains' ops (ai.onnx.ml, ...): the default opset is never read
    if opset is None:
        raise ModelError("the model imports no default ONNX opset", hint="re-export with a standard opset (11 to 21)")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ModelError(f"opset {opset} is outside the supported range {MIN_OPSET}..{MAX_OPSET}",
                         hint="convert with onnx.version_converter to opset 17")

    init_names = {t.name for t in g.initializer}
    real_inputs = [vi for vi in g.input if vi.name not in init_names]
    symbols, input_dims = resolve_input_dims(real_inputs, input_shapes, dims or {})
    for vi in real_inputs:
        shape = vi.type.tensor_type.shape
        del shape.dim[:]
        for d in input_dims[vi.name]:
            if isinstance(d, Dim):
                shape.dim.add().dim_param = str(d)
            else:
                shape.dim.add().dim_value = int(d)
    symbolic = {vi.name: _dims(vi) for vi in real_inputs}

    checked = _as_checked(_skeleton(proto))     # again: the input dims resolved above are in it now
    try:
        # strict first: it reports type errors (an Add of float and int64, bool Gather indices)
        inferred = onnx.shape_inference.infer_shapes(checked, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:
        _raise_type_error(str(e))
        try:
            inferred = onnx.shape_inference.infer_shapes(checked, check_type=False, strict_mode=False, data_prop=True)
        except Exception:
            inferred = proto  # our own shape rules still run during lowering
    types: dict[str, TensorType] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if not vi.type.HasField("tensor_type"):
            continue
        dims = _dims(vi)
        if dims is None:
            continue
        if vi.name in input_dims:
            dims = input_dims[vi.name]
        # a dim ONNX inference names after one of our symbols is that symbol; others are unknown (None)
        dims = [d if isinstance(d, (int, Dim)) else symbols.get(d) for d in dims]
        types[vi.name] = TensorType(tuple(dims), vi.type.tensor_type.elem_type)

    constants = {}
    for t in g.initializer:
        try:
            constants[t.name] = tensor_array(t, base)
        except ModelError:
            raise
        except Exception as e:
            raise ModelError(f"initializer {t.name!r} is corrupt: {str(e)[:160]}",
                             hint="its byte count must match its shape and type; re-export the model") from None
        types[t.name] = TensorType(tuple(constants[t.name].shape), t.data_type)

    nodes = []
    seen_names: set[str] = set()
    for i, n in enumerate(g.node):
        name = n.name or f"{n.op_type}_{i}"
        if name in seen_names:
            name = f"{name}_{i}"
        seen_names.add(name)
        try:
            attrs = {a.name: _attr_value(a) for a in n.attribute}
        except Exception as e:
            raise ModelError(f"an attribute is corrupt: {e}", node=name, op=n.op_type) from None
        nodes.append(Node(name, n.op_type, list(n.input), list(n.output), attrs, n.domain, n))

    outputs = [o.name for o in g.output]
    for o in outputs:
        if not o:
            raise ModelError("the graph has an output with an empty name")
    return Graph(name=g.name or "model", inputs=[vi.name for vi in real_inputs], outputs=outputs,
                 nodes=nodes, types=types, constants=constants, opset=opset, symbolic_inputs=symbolic,
                 symbols=symbols,
                 domain_opsets={o.domain: o.version for o in proto.opset_import if o.domain not in ("", "ai.onnx")})


def parse_dim(spec, what: str):
    """One dim of --input-shape / --dim: an int, (lo, hi), (lo, hi, opt), or 'lo..hi' / 'lo..hi@opt'
    -> int, (lo, hi) or (lo, hi, opt); opt, the size kernels are tuned for, must lie in the range."""
    if isinstance(spec, str):
        text = spec.strip()
        if ".." in text:
            lo, _, hi = text.partition("..")
            hi, at, opt = hi.partition("@")
            spec = (lo, hi, opt) if at else (lo, hi)
        else:
            spec = text
    try:
        if isinstance(spec, (tuple, list)):
            if len(spec) not in (2, 3):
                raise ValueError
            lo, hi = int(spec[0]), int(spec[1])
            if lo < 0 or hi < lo:
                raise ShapeError(f"{what}: the range {lo}..{hi} is empty or negative",
                                 hint="give a range min..max with 0 <= min <= max, e.g. 1..512")
            if len(spec) == 3:
                opt = int(spec[2])
                if not lo <= opt <= hi:
                    raise ShapeError(f"{what}: the tuning size {opt} lies outside {lo}..{hi}",
                                     hint="min..max@opt with min <= opt <= max, e.g. 1..512@128")
                return (lo, hi, opt) if lo != hi else lo
            return (lo, hi) if lo != hi else lo
        v = int(spec)
    except (TypeError, ValueError):
        raise ShapeError(f"{what}: {spec!r} is neither a size nor a range min..max",
                         hint="e.g. --input-shape input_ids=1,1..512 or --dim seq=1..512") from None
    if v < 0:
        raise ShapeError(f"{what}: negative size {v}")
    return v


def resolve_input_dims(real_inputs, input_shapes: dict, dims: dict):
    """Every input's shape as ints and symbolic Dims, and the symbols by name.

    Sources, in order: `input_shapes` (per input: ints and ranges), `dims` (a named dim_param
    -> int or range, wherever it appears); a range at a dim the model names (`seq`) bounds that
    name everywhere. A dim left unbounded is a ShapeError naming it and the flags that bound it."""
    by_param: dict[str, object] = {}
    for name, spec in dims.items():
        by_param[name] = parse_dim(spec, f"--dim {name}")
    declared = {vi.name: _dims(vi) for vi in real_inputs}
    unknown = set(input_shapes) - set(declared)
    if unknown:
        raise ShapeError(f"--input-shape names no input of the model: {sorted(unknown)}",
                         hint=f"the inputs are {list(declared)}")
    unused = set(by_param) - {d for ds in declared.values() if ds for d in ds if isinstance(d, str)}
    if unused:
        raise ShapeError(f"--dim names no symbolic dim of the model's inputs: {sorted(unused)}",
                         hint="the inputs' symbolic dims are " + (", ".join(sorted(
                             {d for ds in declared.values() if ds for d in ds if isinstance(d, str)})) or "(none)"))
    given: dict[tuple, object] = {}      # (input, axis) -> int | (lo, hi)
    for vi in real_inputs:
        ds = declared[vi.name]
        if vi.name not in input_shapes:
            continue
        want = [parse_dim(x, f"--input-shape {vi.name}") for x in input_shapes[vi.name]]
        if ds is None:
            declared[vi.name] = ds = [None] * len(want)
        if len(want) != len(ds):
            raise ShapeError(f"--input-shape {vi.name} gives {len(want)} dims, the model's input has {len(ds)}",
                             hint=f"the model declares {vi.name} as {ds}")
        for axis, (d, w) in enumerate(zip(ds, want)):
            if isinstance(d, int) and d > 0 and w != d:
                raise ShapeError(f"--input-shape {vi.name}: dim {w} contradicts the model's fixed dim {d}",
                                 hint=f"the model declares {vi.name} as {ds}")
            given[(vi.name, axis)] = w
            if isinstance(d, str):
                if d in by_param and by_param[d] != w:
                    raise ShapeError(f"dim {d!r} is given as {_show(by_param[d])} and as {_show(w)}",
                                     hint=f"bound {d!r} once (--dim {d}=...) or alike everywhere")
                by_param[d] = w
    symbols: dict[str, Dim] = {}

    def sym_for(name, rng):
        if name not in symbols:
            symbols[name] = symbol(name, len(symbols), *rng)
        return symbols[name]

    out, unresolved, zero = {}, [], []
    for vi in real_inputs:
        ds = declared[vi.name]
        if ds is None:
            unresolved.append((vi.name, "?", None))
            continue
        shape = []
        for axis, d in enumerate(ds):
            w = given.get((vi.name, axis), by_param.get(d) if isinstance(d, str) else None)
            if w is None:
                if isinstance(d, int) and d > 0:
                    w = d
                elif isinstance(d, int) and d == 0:
                    zero.append((vi.name, ds))
                    w = 0
                else:
                    unresolved.append((vi.name, ds, d))
                    w = 1
            if isinstance(w, tuple):
                w = sym_for(d if isinstance(d, str) else f"{vi.name}_{axis}", w)

            shape.append(w)
        out[vi.name] = shape
    if zero and not unresolved:
        parts = ", ".join(f"{n} {d}" for n, d in dict(zero).items())
        example = " ".join(f"--input-shape {n}=" + ",".join(str(x) for x in d) for n, d in dict(zero).items())
        raise ShapeError(f"input(s) declare a 0-sized dim: {parts} (some exporters write 0 for an unknown dim)",
                         hint=f"pin the real size, or confirm an empty input with {example}")
    if unresolved:
        named = sorted({d for _, _, d in unresolved if isinstance(d, str)})
        parts = ", ".join(f"{n} {d}" for n, d, _ in unresolved)
        pins = " ".join(f"--input-shape {n}=" + ",".join("1" if not isinstance(x, int) or x <= 0 else str(x)
                                                         for x in (d if isinstance(d, list) else [1]))
                        for n, d in dict((n, d) for n, d, _ in unresolved).items())
        flags = (" ".join(f"--dim {d}=1..N" for d in named) + f" (a range), or {pins} (fixed)") if named else pins
        what = f"symbolic dim(s) {named} have no bound" if named else "cannot resolve the shape of input(s)"
        raise ShapeError(f"{what}: {parts}",
                         hint=f"bound each symbolic dim with a range or pin it, e.g. {flags}")
    return symbols, out


def _show(w) -> str:
    if isinstance(w, tuple):
        return f"{w[0]}..{w[1]}" + (f"@{w[2]}" if len(w) > 2 else "")
    return str(w)


__all__ = ["import_model", "load_model_proto", "open_model", "np"]
