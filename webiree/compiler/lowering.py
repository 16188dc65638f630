"""Lowering: Graph IR (ONNX nodes) -> Program (canonical ops).

Walks the nodes in order. A node whose inputs are all constants is folded
with ONNX's reference evaluator (so shape subgraphs vanish), unless its value
would take more bytes than the constants it reads (`widens`: dequantizing int8
weights; a kernel computes those from the narrow constants); every other node
goes to its op's handler in `ops/`, found by name (DESIGN.md contract 1). A
handler computes its output shapes (the op's shape rule) and emits canonical
ops through the `Lowering` context below.

An op without a handler (or a variant its handler refuses) that ONNX defines
as a function of other ops (Attention, the losses, RMSNormalization, ...) is
replaced by that function's body, read at the function's own opset (see
`expand.py`), and its nodes are lowered in its place. A handler may do the
same with `ctx.expand(nodes)` (If on a constant condition inlines a branch).

Every unsupported node is collected and reported in one error.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import helper

from ..errors import CompilerBug, ModelError, ShapeError, UnsupportedOpError, WebireeError
from ..ir import kir, packing
from ..ir.kir import Expr
from .expand import expand_function
from ..ir.mapped import release
from ..dtypes import name_of, rounded_of
from .graph import Graph, Node, internal_dtype, internal_of_numpy
from ..ir.program import Conv, Generic, LayerNorm, MatMul, Op, Pool, Program, Softmax, Tensor, coords_of, flat_of, numel
from ..ir.program import O as OUT_INDEX
from ..ir.sym import SymbolicDimError, upper
from . import symbolic

MAX_ELEMENTS = (1 << 31) - 1         # i32 index math
MAX_FOLD_ELEMENTS = 1 << 25          # largest value constant folding may compute (32M elements)
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                    "Bernoulli"}


def to_internal_array(a: np.ndarray, what: str) -> np.ndarray:
    """Convert a constant to its runtime storage type (int64 narrowed with a range check)."""
    dt = internal_of_numpy(a.dtype)
    if dt is None:
        if a.dtype == np.float64 or a.dtype == np.float16 or a.dtype.name == "bfloat16":
            return a.astype(np.float32)    # float16 / bfloat16 widen exactly
        raise UnsupportedOpError(f"constant {what!r} has element type {a.dtype}, which WebGPU kernels cannot hold",
                                 hint="export the model with float32 / int32 / int64 / bool tensors")
    if dt == "i32" and a.dtype != np.int32:
        if a.size and (a.min() < -(1 << 31) or a.max() >= (1 << 31)):
            raise ShapeError(f"constant {what!r} holds int64 values outside the int32 range WGSL can hold",
                             hint="such values must only be used by ops that are folded at compile time")
        return a.astype(np.int32)
    if dt == "u32" and a.dtype != np.uint32:
        if a.size and int(a.max()) >= (1 << 32):
            raise ShapeError(f"constant {what!r} holds uint64 values outside the uint32 range WGSL can hold",
                             hint="such values must only be used by ops that are folded at compile time")
        return a.astype(np.uint32)
    if dt == "bool":
        return a.astype(np.bool_)
    return a


class Lowering:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.consts: dict[str, np.ndarray] = dict(graph.constants)   # ONNX-typed values
        self.tensors: dict[str, Tensor] = {}
        self.ops: list[Op] = []
        self.onnx_types: dict[str, int] = {}
        self._names: set[str] = set()
        self.node: Node | None = None
        self._op_names: set[str] = set()
        self.bad_inputs: list[tuple[str, str]] = []   # inputs of types WebGPU cannot hold
        self.pending: list[Node] = []     # nodes a handler asked to lower in its place (see `expand`)
        # run-time tensors held as f32 but rounded to a narrow float type ('f16' / 'bf16'), by name
        self.rounded: dict[str, str] = {}
        self._producers: dict[str, Node] | None = None
        self._consumers: dict[str, list[Node]] | None = None
        for name in graph.inputs:
            t = graph.types[name]
            dt = internal_dtype(t.elem_type)
            if dt is None:
                self.bad_inputs.append((name, name_of(t.elem_type)))
                continue
            self.tensors[name] = Tensor(name, tuple(t.shape), dt, kind="input")
            self.onnx_types[name] = t.elem_type
            if rounded_of(t.elem_type):
                self.rounded[name] = rounded_of(t.elem_type)

    # --- queries ---------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.consts or name in self.tensors

    def const(self, name: str):
        """The constant value of a tensor, or None if it is computed at run time."""
        if not name:
            return None
        return self.consts.get(name)

    def producer(self, name: str) -> Node | None:
        """The node of the imported graph that produces `name` (None for graph inputs, constants and
        the tensors of nodes a handler expanded): a pattern of the file (a QDQ pair) read as one."""
        if self._producers is None:
            self._producers = self.graph.producers()
        return self._producers.get(name)

    def readers(self, name: str) -> int:
        """How many nodes of the imported graph read `name` (a weight read by one node alone may be
        laid out anew for it without a copy staying behind)."""
        if self._consumers is None:
            self._consumers = self.graph.consumers()
        return len(self._consumers.get(name, ()))

    def shape(self, name: str) -> tuple:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        if name in self.tensors:
            return self.tensors[name].shape
        raise ModelError(f"tensor {name!r} is used before it is produced",
                         node=self.node.name if self.node else None, op=self.node.op if self.node else None,
                         hint="the graph is not topologically sorted or names a missing tensor")

    def dtype(self, name: str) -> str:
        if name in self.consts:
            c = self.consts[name]
            dt = internal_of_numpy(symbolic.value_dtype(c))
            return dt or "f32"
        self.shape(name)
        return self.tensors[name].dtype

    @property
    def opset(self) -> int:
        """The opset the current node is read at (its attributes and input forms)."""
        return (self.node.opset if self.node is not None and self.node.opset else None) or self.graph.opset

    def expand(self, nodes: list) -> None:
        """Lower these nodes in place of the current one (a decomposition, an inlined subgraph)."""
        self.pending.extend(nodes)

    def rank(self, name: str) -> int:
        return len(self.shape(name))

    def root(self, name: str) -> str:
        t = self.tensors[name]
        while t.alias_of is not None:
            t = self.tensors[t.alias_of]
        return t.name

    def fresh(self, base: str) -> str:
        """A tensor name not used yet."""
        i, name = 0, base
        while name in self._names or name in self.tensors or name in self.consts:
            i += 1
            name = f"{base}__{i}"
        self._names.add(name)
        return name

    def op_name(self, base: str) -> str:
        """A dispatch name not used yet (op names live apart from tensor names)."""
        i, name = 0, base
        while name in self._op_names:
            i += 1
            name = f"{base}__{i}"
        self._op_names.add(name)
        return name

    # --- reading tensors inside expressions --------------------------------
    def _const_tensor(self, name: str) -> str:
        if name not in self.tensors:
            raw = np.ascontiguousarray(self.consts[name])
            if raw.dtype == np.float16:
                # an f32 tensor to the kernels, kept as halves on the host: pack_constants stores it as
                # f16 (a half model's weights are not widened in memory, only in the kernels' loads)
                data, dtype = raw, "f32"
            else:
                data = to_internal_array(raw, name)
                dtype = internal_of_numpy(data.dtype)
                if data is not raw:
                    release(raw)   # a mapped weight converted (int64 narrowed): its pages are read
            self.tensors[name] = Tensor(name, tuple(data.shape), dtype, kind="const", data=data)
        return name

    def buffer(self, name: str) -> str:
        """The tensor whose buffer holds `name` (for anchors that bind it directly)."""
        c = self.const(name)
        if c is not None and symbolic.is_symbolic(c):
            out = self.fresh(f"{name}:value")
            self.generic(out, c.shape, self.dtype(name), lambda cs: self.read(name, cs))
            return out
        if self.const(name) is not None:
            return self._const_tensor(name)
        self.shape(name)
        return self.root(name)

    def read_flat(self, name: str, flat: Expr) -> Expr:
        c = self.const(name)
        if c is not None and symbolic.is_symbolic(c):
            # a shape value computed from symbolic dims: its elements, from the dims buffer
            return symbolic.read_value(c, flat, self.dtype(name))
        if c is not None:
            if c.size == 1:
                v = to_internal_array(np.asarray(c).reshape(-1), name)[0]   # checks type and int32 range
                dt = internal_of_numpy(v.dtype)
                return kir.const(bool(v) if dt == "bool" else (float(v) if dt == "f32" else int(v)), dt)
            self._const_tensor(name)
            return kir.load(name, flat, self.tensors[name].dtype)
        if name not in self.tensors:
            self.shape(name)  # raises the clear error
        root = self.root(name)
        return kir.load(root, flat, self.tensors[root].dtype)

    def read(self, name: str, coords: list[Expr]) -> Expr:
        return self.read_flat(name, flat_of(coords, self.shape(name)))

    def read_bcast(self, name: str, out_shape, coords: list[Expr]) -> Expr:
        """Read with numpy broadcasting of `name` against `out_shape`."""
        shape = self.shape(name)
        k = len(out_shape) - len(shape)
        if k < 0 or any(d != 1 and d != out_shape[k + i] for i, d in enumerate(shape)):
            raise ShapeError(f"{name!r} of shape {tuple(shape)} does not broadcast to {tuple(out_shape)}")
        cs = [kir.i32(0) if shape[i] == 1 else coords[k + i] for i in range(len(shape))]
        return self.read(name, cs)

    # --- producing tensors -------------------------------------------------
    def _new(self, name: str, shape, dtype: str) -> Tensor:
        shape = symbolic.as_shape(shape)
        if any(d < 0 for d in shape):
            raise ShapeError(f"negative dimension in output shape {shape}", node=self.node.name, op=self.node.op)
        if upper(numel(shape)) > MAX_ELEMENTS:
            raise ShapeError(f"tensor {name!r} of shape {shape} has more elements than 32-bit indexing allows",
                             node=self.node.name, op=self.node.op, hint="use a smaller input shape")
        t = Tensor(name, shape, dtype)
        self.tensors[name] = t
        self._names.add(name)
        return t

    def set_const(self, name: str, value) -> None:
        self.consts[name] = symbolic.as_value(value)

    def generic(self, out: str, shape, dtype: str, fn) -> Generic:
        """Emit out[coords] = fn(coords) as one Generic op (returned)."""
        t = self._new(out, shape, dtype)
        expr = fn(coords_of(OUT_INDEX, t.shape))
        if expr.dtype != dtype:
            expr = kir.cast(expr, dtype)
        op = Generic(name=self.op_name(self.node.name), out=out, nodes=[self.node.name], expr=expr)
        self.ops.append(op)
        return op

    def view(self, out: str, src: str, shape) -> None:
        """out is `src` with another shape (same elements, same order): no dispatch."""
        shape = symbolic.as_shape(shape)
        if numel(shape) != numel(self.shape(src)):
            raise ShapeError(f"cannot view {self.shape(src)} as {shape}", node=self.node.name, op=self.node.op)
        c = self.const(src)
        if c is not None:
            self.set_const(out, c.reshape(shape))
            return
        t = self._new(out, shape, self.dtype(src))
        t.alias_of = self.root(src)

    def anchor(self, op: Op, shape, dtype: str = "f32") -> None:
        """Register an anchor op (MatMul, Conv, ...) writing a new tensor."""
        from .ops import Unsupported
        float_only = {MatMul: ("a", "b"), Conv: ("x", "w"), Softmax: ("x",), LayerNorm: ("x", "scale", "bias")}
        fields = float_only.get(type(op), ("x",) if isinstance(op, Pool) and op.mode != "max" else ())
        if isinstance(op, MatMul) and op.int8:
            fields = ()          # an integer product (kernels/matmul_int8.py)
        for f in fields:
            t = getattr(op, f)
            if t and self.dtype(t) != "f32":
                raise Unsupported(f"{type(op).__name__} on {self.dtype(t)} tensors ({t!r}); its kernels compute "
                                  f"in float32 (insert a Cast to float)")
        self._new(op.out, shape, dtype)
        op.name = self.op_name(op.name or self.node.name)
        self.ops.append(op)

    def temp(self, base: str) -> str:
        return self.fresh(f"{self.node.outputs[0] if self.node.outputs else self.node.name}:{base}")


def folded_shapes(node: Node, values: list, opset: int) -> list:
    """The output shapes of folding `node`, by ONNX shape inference on the node alone (small
    constant inputs given as values, so shape-producing inputs are seen), without evaluating it.
    An entry is None where inference cannot tell."""
    inits, infos = [], []
    for name, v in zip(node.inputs, values):
        if not name or v is None:
            continue
        try:
            infos.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
            if v.size <= 4096:
                inits.append(onnx.numpy_helper.from_array(v, name))
        except Exception:
            return []
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.outputs if o]
    try:
        m = helper.make_model(helper.make_graph([node.proto], "fold", infos, outs, inits),
                              opset_imports=[helper.make_opsetid("", opset)])
        inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception:
        return []
    shapes = []
    for o in inferred.graph.output:
        t = o.type.tensor_type
        if not o.type.HasField("tensor_type") or not t.HasField("shape") or \
                any(not d.HasField("dim_value") for d in t.shape.dim):
            shapes.append(None)
        else:
            shapes.append(tuple(d.dim_value for d in t.shape.dim))
    return shapes


def check_fold_size(node: Node, values: list, opset: int, known: dict) -> None:
    """Refuse (before allocating it) a constant node whose value would be enormous."""
    shapes = [known[o].shape if o in known and all(isinstance(d, int) for d in known[o].shape) else None
              for o in node.outputs if o]
    if any(s is None for s in shapes):
        shapes = [a if a is not None else b for a, b in
                  zip(shapes, folded_shapes(node, values, opset) or [None] * len(shapes))]
    for o, s in zip([o for o in node.outputs if o], shapes):
        if s is not None and numel(s) > MAX_FOLD_ELEMENTS:
            raise ShapeError(f"constant {o!r} would have shape {tuple(s)} ({numel(s)} elements), more than "
                             f"webiree computes at compile time ({MAX_FOLD_ELEMENTS})",
                             node=node.name, op=node.op,
                             hint="the constant inputs of this node ask for an enormous tensor; check them")


WIDEN_MIN_BYTES = 64 << 10     # folds to values smaller than this are kept ...
WIDENING_OPS = {"DequantizeLinear", "Cast", "CastLike"}    # ... except an op that only widens its elements


def widens(args: list, values: list, op: str = "") -> bool:
    """Whether folding a node would store more bytes than its constant inputs take (each counted
    in its narrowest exact form, ir/packing.py), for a result of WIDEN_MIN_BYTES or more, or of any
    size for an op that only widens elements (a small int8 weight's DequantizeLinear stays int8)."""
    out = sum(packing.narrow_bytes(v) for v in values)
    floor = 4 * packing.MIN_ELEMENTS if op in WIDENING_OPS else WIDEN_MIN_BYTES
    return out >= floor and out > sum(packing.narrow_bytes(a) for a in args if a is not None)


FILL_MIN_ELEMENTS = WIDEN_MIN_BYTES // 4    # a fill this large is computed where it is read, not folded


def is_large_fill(node: Node, args: list) -> bool:
    """Whether `node` fills a tensor of FILL_MIN_ELEMENTS or more with one value: a ConstantOfShape,
    or an Expand of a one-element constant (onnx's light zoo graphs make every weight so, VGG-19's
    fc6 411 MB). Such a node is not folded (nor refused as too large to fold): its handler makes it
    an expression that the kernels reading it compute, so the build neither allocates it nor ships
    it in weights.bin."""
    if node.op == "ConstantOfShape" and args and args[0] is not None:
        shape = np.asarray(args[0]).reshape(-1)
    elif node.op == "Expand" and len(args) == 2 and args[0] is not None and args[0].size == 1 \
            and args[1] is not None:
        shape = np.asarray(args[1]).reshape(-1)
    else:
        return False
    if shape.dtype.kind not in "iu" or (shape < 0).any():
        return False
    return int(np.prod(shape.astype(object), initial=1)) >= FILL_MIN_ELEMENTS


def fold_node(node: Node, values: list, opset: int, domain: str = "") -> list[np.ndarray]:
    """Evaluate one node on constant inputs with onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    inputs = []
    for name, v in zip(node.inputs, values):
        if name:
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
    outputs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.outputs if o]
    g = helper.make_graph([node.proto], "fold", inputs, outputs)
    imports = [helper.make_opsetid("", opset)]
    if domain not in ("", "ai.onnx"):
        imports.append(helper.make_opsetid(domain, 1))
    m = helper.make_model(g, opset_imports=imports)
    feeds = {n: v for n, v in zip(node.inputs, values) if n}
    import re
    import warnings
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # inf from a folded Exp is the value, not a warning
        try:
            res = ReferenceEvaluator(m).run(None, feeds)
        except RuntimeError as e:
            # onnx.reference implements some ops only from a later version (DequantizeLinear: 19);
            # where the node's form is the same there (one that changed differs in its attributes or
            # inputs, which the later version then rejects), evaluate it at that version
            later = [int(v) for v in re.findall(r"\d+", str(e).split("found", 1)[-1]) if int(v) > opset]
            if "No implementation for operator" not in str(e) or not later or domain not in ("", "ai.onnx"):
                raise
            m.opset_import[0].version = min(later)
            res = ReferenceEvaluator(m).run(None, feeds)
    return [np.asarray(r) for r in res]


def lower(graph: Graph) -> Program:
    from . import ops as registry

    ctx = Lowering(graph)
    constraints, token = symbolic.collect_constraints()
    try:
        prog = _lower(ctx, graph, registry)
    finally:
        symbolic.end_constraints(token)
    prog.constraints = constraints
    return prog


def _lower(ctx, graph, registry) -> Program:
    unsupported: list[tuple[str, str, str]] = [
        (name, "graph input", f"element type {type_name} (use float32, int32, int64 or bool)")
        for name, type_name in ctx.bad_inputs]
    blocked: set[str] = {name for name, _ in ctx.bad_inputs}
    queue = collections.deque(graph.nodes)
    while queue:
        node = queue.popleft()
        ctx.node = node
        ctx.pending = []
        if node.domain not in ("", "ai.onnx", "webiree") and not registry.OPS.get(f"{node.domain}.{node.op}"):
            body = expand_function(ctx, node)    # an op of another domain ONNX defines as a function
            if body is not None:
                queue.extendleft(reversed(body))
                continue
            unsupported.append((node.name, f"{node.domain}.{node.op}", "custom domain"))
            blocked.update(node.outputs)
            continue
        if any(i in blocked for i in node.inputs if i):
            blocked.update(node.outputs)
            continue
        for i in node.inputs:
            if i and not ctx.has(i):
                raise ModelError(f"input {i!r} is not produced by any earlier node, initializer or graph input",
                                 node=node.name, op=node.op, hint="the graph is malformed; re-export it")
        handler = registry.OPS.get(node.op if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op}")
        all_const = all(ctx.const(i) is not None for i in node.inputs if i)
        try:
            args = [ctx.const(i) if i else None for i in node.inputs] if all_const else []
            if all_const and any(a is not None and symbolic.is_symbolic(a) for a in args):
                # shape arithmetic on symbolic dims: evaluated on Dims where it can be, else a kernel
                values = symbolic.fold(node, args, ctx)
                if values is not None:
                    for o, v in zip([o for o in node.outputs if o], values):
                        ctx.set_const(o, v)
                    continue
                all_const = False      # a kernel computes it (its handler reads the values from the dims)
            if all_const and node.op not in NONDETERMINISTIC and not is_large_fill(node, args) \
                    and node.domain != "webiree":     # webiree's own internal ops are lowered by their handlers
                check_fold_size(node, args, ctx.opset, graph.types)
                try:
                    values = fold_node(node, args, ctx.opset, node.domain)
                except Exception as e:
                    if handler is None:
                        raise ModelError(f"cannot evaluate constant node: {str(e).splitlines()[0][:200]}",
                                         node=node.name, op=node.op) from None
                    handler(ctx, node)
                    if ctx.pending:
                        queue.extendleft(reversed(ctx.pending))
                    continue
                if handler is None or not widens(args, values, node.op):
                    for o, v in zip([o for o in node.outputs if o], values):
                        ctx.set_const(o, v)
                    continue
                # folding would store a larger constant than the ones it reads (a DequantizeLinear of
                # int8 weights, a Cast of halves, a fill): a kernel computes it from them each run,
                # fused into its reader where it can be, and the weights keep their shipped size
            if handler is None:
                body = expand_function(ctx, node)
                if body is None:
                    unsupported.append((node.name, node.op, "not implemented"))
                    blocked.update(node.outputs)
                    continue
                queue.extendleft(reversed(body))
                continue
            first_op = len(ctx.ops)
            handler(ctx, node)
            if ctx.pending:
                queue.extendleft(reversed(ctx.pending))
                continue
            round_narrow_outputs(ctx, node, first_op)
        except registry.Unsupported as e:
            # a variant the handler cannot do may still have an ONNX function decomposition
            body = expand_function(ctx, node) if not any(ctx.has(o) for o in node.outputs if o) else None
            if body is None:
                unsupported.append((node.name, node.op, str(e)))
                blocked.update(node.outputs)
                continue
            queue.extendleft(reversed(body))
            continue
        except SymbolicDimError as e:
            raise UnsupportedOpError(f"{node.op} does not take a symbolic size here yet: {e}", node=node.name,
                                     op=node.op, hint="pin the dim it depends on with --input-shape (or a "
                                                      "single-value --dim NAME=N)") from e
        except WebireeError as e:
            if e.node is None:
                e.node, e.op = node.name, node.op
                e.args = (e._format(),)
            raise
        except Exception as e:
            # not a check that failed but a handler that broke: say so (the traceback stays chained
            # for --debug). The fuzz test (tests/test_fuzz.py) keeps these at zero.
            raise CompilerBug(f"the {node.op} handler failed unexpectedly ({type(e).__name__}: {str(e)[:200]})",
                              node=node.name, op=node.op,
                              hint="a webiree bug, or a malformed node its checks miss; if onnxruntime runs the "
                                   "model, please report it (webiree --debug shows the traceback)") from e
        for o in node.outputs:
            if o and not ctx.has(o):
                raise CompilerBug(f"handler for {node.op} did not produce output {o!r}", node=node.name, op=node.op)
    if unsupported:
        listing = "; ".join(f"{op} ({name}): {why}" for name, op, why in unsupported)
        ops = sorted({op for _, op, _ in unsupported})
        raise UnsupportedOpError(f"{len(unsupported)} node(s) use unsupported ops {ops}: {listing}",
                                 hint="see docs/conformance.md for the supported op set")
    ctx.node = Node("outputs", "Output", [], [], {})
    outputs = []
    for name in graph.outputs:
        if not ctx.has(name):
            raise ModelError(f"graph output {name!r} is never produced")
        # every output owns its buffer: constants, inputs and views of them are copied
        needs_copy = name in ctx.consts or ctx.tensors[name].kind == "input" or \
            ctx.tensors[ctx.root(name)].kind in ("input", "const") or name in outputs
        if needs_copy:
            src = name
            copy = ctx.fresh(f"{name}:out")
            ctx.generic(copy, ctx.shape(src), ctx.dtype(src), lambda cs, s=src: ctx.read(s, cs))
            name_out = copy
        else:
            name_out = name
        outputs.append(name_out)
        ctx.onnx_types[name_out] = graph.types[name].elem_type if name in graph.types else _default_onnx_type(ctx, name)
    prog = Program(graph.name, ctx.tensors, ctx.ops, list(graph.inputs), outputs, list(graph.outputs))
    for name, kind in ctx.rounded.items():
        if name in prog.tensors:
            prog.tensors[name].rounded = kind
    if graph.symbols:
        from ..ir.sym import DIMS_BUFFER
        prog.symbols = sorted((d.symbols()[0] for d in graph.symbols.values()), key=lambda s: s.index)
        prog.tensors[DIMS_BUFFER] = Tensor(DIMS_BUFFER, (len(prog.symbols),), "i32", kind="params")
    for name, out in zip(graph.outputs, outputs):
        prog.tensors[ctx.root(out)].kind = "output"
    prog.io_types = {n: ctx.onnx_types[n] for n in list(graph.inputs) + outputs}
    return prog


def _narrow_type_of(ctx: Lowering, node: Node, out: str) -> str | None:
    """'f16' / 'bf16' when the node's output `out` is a float16 / bfloat16 tensor in the graph."""
    t = ctx.graph.types.get(out)
    if t is not None:
        return rounded_of(t.elem_type)
    if node.op == "Cast":
        return rounded_of(node.attr("to"))
    if node.op == "CastLike" or ctx.dtype(out) != "f32":
        return rounded_of(ctx.onnx_types.get(out, 0))
    # an intermediate ONNX type inference did not record (inside an expanded function body):
    # a float output of an op on narrow floats is narrow too
    for i in node.inputs:
        if i and i in ctx.rounded:
            return ctx.rounded[i]
        if i and ctx.const(i) is not None and ctx.const(i).dtype.name in ("float16", "bfloat16"):
            return {"float16": "f16", "bfloat16": "bf16"}[ctx.const(i).dtype.name]
    return None


_EXACT_F32_OPS = {"select", "neg", "abs", "min", "max"}   # give back one of their operands' values


def _keeps_narrow(ctx: Lowering, expr, kind: str) -> bool:
    """Whether `expr` can only produce values of the narrow type `kind` (data movement: loads of
    tensors already rounded to it, selections among them, constants of it), so rounding is a no-op."""
    if expr.dtype != "f32":
        return True         # (a select's condition, an index)
    if expr.op == "const":
        return packing.is_exact(np.float32(expr.attr), kind)
    if expr.op == "load":
        t = ctx.tensors.get(expr.attr)
        return ctx.rounded.get(expr.attr) == kind or (
            t is not None and t.kind == "const" and packing.is_exact(t.data, kind))
    if expr.op in _EXACT_F32_OPS:
        return all(_keeps_narrow(ctx, a, kind) for a in expr.args)
    return False


def round_narrow_outputs(ctx: Lowering, node: Node, first_op: int) -> None:
    """Round every float16 / bfloat16 output of `node` to its type where it is produced (the values are
    computed in f32, as onnxruntime's CPU kernels mostly do before they round the result): wrap the
    producing op's expression or epilogue; a view of a tensor rounded alike is already rounded."""
    for out in node.outputs:
        if not out or out in ctx.consts or out not in ctx.tensors or ctx.dtype(out) != "f32":
            continue
        kind = _narrow_type_of(ctx, node, out)
        if kind is None:
            continue
        fn = "round_" + kind
        root = ctx.root(out)
        producer = next((op for op in reversed(ctx.ops[first_op:]) if op.out == root), None)
        if producer is None or root in ctx.rounded and ctx.rounded[root] != kind:
            if ctx.rounded.get(root) != kind:   # a view of a tensor not rounded alike: copy it rounded
                shape = ctx.shape(out)
                del ctx.tensors[out]
                ctx.generic(out, shape, "f32", lambda cs, r=root:
                            kir.unary(fn, kir.load(r, flat_of(cs, shape), "f32")))
        elif isinstance(producer, Generic):
            if not _keeps_narrow(ctx, producer.expr, kind):
                producer.expr = kir.unary(fn, producer.expr)
        else:
            from ..ir.program import acc_var
            acc = producer.epilogue if producer.epilogue is not None else acc_var("f32")
            producer.epilogue = kir.unary(fn, acc)
        ctx.rounded[root] = kind
        ctx.rounded[out] = kind


def _default_onnx_type(ctx: Lowering, name: str) -> int:
    dt = ctx.dtype(name)
    return {"f32": onnx.TensorProto.FLOAT, "i32": onnx.TensorProto.INT64, "u32": onnx.TensorProto.UINT32,
            "bool": onnx.TensorProto.BOOL}[dt]
