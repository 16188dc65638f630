"""webiree as an ONNX backend (`onnx.backend.base.Backend`).

    from webiree.onnx_backend import WebireeBackend
    rep = WebireeBackend.prepare(model)          # compiles ahead of time
    outputs = rep.run([x, y])                    # runs natively through wgpu-py

This is what the ONNX backend test suite drives (`onnx.backend.test.BackendTest
(WebireeBackend, __name__)`, or tests/conformance_report.py, which runs every
node test case). `prepare` compiles the model in memory (`compile_model`, shaders
validated as `webiree.compile` validates them) and opens an `InferenceSession` on
the module and weights without writing a build folder. Errors
from webiree (`UnsupportedOpError`, `ShapeError`, ...) propagate unchanged.

webiree compiles static shapes. An input that only *parameterizes a shape*
(Reshape's `shape`, Slice's `starts`/`ends`, TopK's `k`, Expand's `shape`,
... see `SHAPE_PARAMETERS`) must be known when compiling; when a model takes
such a value as a graph input, compilation is deferred to the first `run`
and the value is baked into the model as a constant (one compiled session per
distinct value). A graph input from which such a parameter is *computed*
(through any ops but Shape/Size, subgraphs included) counts too, if it is an
integer tensor or a scalar; float data tensors always stay run-time inputs.
`WebireeRep.deferred` lists the inputs a model compiles in. After a run,
`WebireeRep.last_run.folded` says whether no kernel read a run-time input: every
output was computed at compile time (when all inputs were compiled in, or the
outputs do not depend on their values), and no webiree kernel computed it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from .compiler.importer import node_reads
from .module.format import OP_DISPATCH, OP_DISPATCH_DYN

# op type -> positions of inputs that only determine an output *shape* (or axes)
SHAPE_PARAMETERS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "ConstantOfShape": (0,),
    "Pad": (1, 3), "TopK": (1,), "Resize": (1, 2, 3), "Upsample": (1,), "Split": (1,), "Squeeze": (1,),
    "Unsqueeze": (1,), "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,), "OneHot": (1,), "CumSum": (1,), "CumProd": (1,), "Range": (0, 1, 2),
    "CenterCropPad": (1,), "Col2Im": (1, 2), "DFT": (1, 2), "AffineGrid": (1,),
    "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,), "MelWeightMatrix": (0, 1, 2, 3, 4),
    "STFT": (1, 3), "MaxUnpool": (2,),
    "Loop": (0, 1),          # the trip count and the initial condition decide how many iterations (and outputs)
}
# ops that read only the *shape* of their input: a shape computed from them does not depend on its values
SHAPE_ONLY = {"Shape", "Size"}


def shape_parameter_inputs(model: onnx.ModelProto) -> list[str]:
    """Graph inputs that determine a shape: used as a shape parameter directly, or computed into one
    (then only integer tensors and scalars qualify: data tensors are never frozen)."""
    inits = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in inits}
    producer = {o: n for n in model.graph.node for o in n.output if o}
    direct, reached, todo = [], set(), []
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        for pos in SHAPE_PARAMETERS.get(node.op_type, ()):
            if pos < len(node.input) and node.input[pos]:
                name = node.input[pos]
                if name in inputs and name not in direct:
                    direct.append(name)
                todo.append(name)
    while todo:
        t = todo.pop()
        if t in reached:
            continue
        reached.add(t)
        n = producer.get(t)
        if n is not None and n.op_type not in SHAPE_ONLY:
            todo.extend(node_reads(n))
    found = list(direct)
    for name, vi in inputs.items():
        if name in found or name not in reached or not vi.type.HasField("tensor_type"):
            continue
        t = vi.type.tensor_type
        dims = [d.dim_value for d in t.shape.dim] if t.HasField("shape") else None
        integer = t.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
        if integer or (dims is not None and int(np.prod(dims)) == 1):
            found.append(name)
    return found


def freeze_inputs(model: onnx.ModelProto, values: dict) -> onnx.ModelProto:
    """A copy of `model` in which the given graph inputs are initializers."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [vi for vi in m.graph.input if vi.name not in values]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    for name, v in values.items():
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(v), name))
    return m


def _static_input_shapes(model: onnx.ModelProto) -> dict:
    inits = {t.name for t in model.graph.initializer}
    shapes = {}
    for vi in model.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [d.dim_value for d in dims]
    return shapes


class _Compiled:
    """One compiled model: its session and the numpy types of its outputs."""

    def __init__(self, model: onnx.ModelProto, **compile_kw):
        from .bundler.site import resolve_target, shader_validator
        from .compiler.driver import compile_model
        from .session import InferenceSession

        shapes = compile_kw.get("input_shapes")
        if shapes is None:
            # the model's own static dims, given explicitly so that 0 (an empty tensor) is taken as meant
            shapes = _static_input_shapes(model)
        result = compile_model(model, shapes, resolve_target(compile_kw.get("limits", "default")),
                               validate=shader_validator)
        self.session = InferenceSession.from_module(result.module, result.weights)
        self.inputs = [i.name for i in self.session.get_inputs()]
        module = self.session.module
        kinds = [b.kind for b in module.buffers]
        dispatches = [c for c in module.commands if c[0] in (OP_DISPATCH, OP_DISPATCH_DYN)]
        # folded: no kernel reads a run-time input, so every output was computed at compile time
        # (the module only copies constants into the outputs)
        self.folded = not any(kinds[b[1]] == "input" for c in dispatches for b in c[5]) and \
            not any(kinds[o.buffer] == "input" for o in module.outputs)
        self.out_types = {}
        for o in model.graph.output:
            t = o.type.tensor_type.elem_type if o.type.HasField("tensor_type") else 0
            if t:
                self.out_types[o.name] = onnx.helper.tensor_dtype_to_np_dtype(t)

    def run(self, feeds: dict) -> list:
        outs = self.session.run(None, {k: v for k, v in feeds.items() if k in self.inputs})
        names = [o.name for o in self.session.get_outputs()]
        res = []
        for name, a in zip(names, outs):
            want = self.out_types.get(name)
            res.append(a.astype(want) if want is not None and a.dtype != want else a)
        return res


class WebireeRep(BackendRep):
    def __init__(self, model: onnx.ModelProto, **compile_kw):
        self.model = model
        self.compile_kw = compile_kw
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self.deferred = shape_parameter_inputs(model)
        self.last_run: _Compiled | None = None    # the compiled model the last `run` used
        self._compiled: dict = {}
        if not self.deferred:
            self._compiled[()] = _Compiled(model, **compile_kw)

    def _feeds(self, inputs) -> dict:
        if isinstance(inputs, dict):
            return dict(inputs)
        if isinstance(inputs, np.ndarray) or not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        if len(inputs) > len(self.input_names):
            raise ValueError(f"{len(inputs)} inputs given, the model takes {len(self.input_names)}")
        return {n: np.asarray(v) for n, v in zip(self.input_names, inputs)}

    def run(self, inputs, **kwargs):
        feeds = self._feeds(inputs)
        key = tuple((n, np.asarray(feeds[n]).dtype.str, np.asarray(feeds[n]).shape,
                     np.asarray(feeds[n]).tobytes()) for n in self.deferred if n in feeds)
        compiled = self._compiled.get(key)
        if compiled is None:
            frozen = {n: np.asarray(feeds[n]) for n in self.deferred if n in feeds}
            compiled = _Compiled(freeze_inputs(self.model, frozen), **self.compile_kw)
            self._compiled[key] = compiled
        self.last_run = compiled
        outs = compiled.run(feeds)
        return namedtupledict("Outputs", self.output_names)(*outs)


class WebireeBackend(Backend):
    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return True

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> WebireeRep:
        if not isinstance(model, onnx.ModelProto):
            from .compiler.importer import load_model_proto
            model = load_model_proto(model)
        compile_kw = {k: kwargs[k] for k in ("input_shapes", "limits") if k in kwargs}
        return WebireeRep(model, **compile_kw)

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        raise NotImplementedError("webiree compiles whole models; build a one-node model and use run_model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        # webiree runs on a WebGPU adapter; the backend API's 'CPU' is the only device the suite asks for
        return Device(device).type == DeviceType.CPU


prepare = WebireeBackend.prepare
run_model = WebireeBackend.run_model
supports_device = WebireeBackend.supports_device

__all__ = ["WebireeBackend", "WebireeRep", "prepare", "run_model", "supports_device", "SHAPE_PARAMETERS"]
