"""A seeded model fuzzer: mutate the test models, compile, run, classify.

Every mutated model must end in one of two ways within a time bound: it
compiles and runs, or webiree raises a `WebireeError` (at compile time or at
session creation / run time). Anything else is a bug in webiree: another
exception type, a hang, or a crash of the process that runs it.

- Compilation runs in this process (the compiler is pure Python; naga
  validation goes through the shared wgpu device), bounded by a SIGALRM
  deadline per case.
- Models that compile are run natively in one long-lived worker subprocess
  (`python -m webiree.testing.fuzz --worker`), fed one case at a time over a
  pipe while the next case compiles. A worker that dies (a driver crash) or
  misses its deadline (a GPU hang) is recorded and replaced by a fresh one.
  The worker also runs onnxruntime on the same model and feeds and reports
  whether the results agree, or that onnxruntime refuses the model (many
  mutations are invalid for it too). Running cases natively needs onnxruntime:
  without it the campaign stops with an ImportError rather than compare nothing.

    python -m webiree.testing.fuzz --cases 500 --seed 0     # prints the report
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from ..errors import CompilerBug, WebireeError
from . import models

COMPILE_DEADLINE_S = 20.0
RUN_DEADLINE_S = 60.0
HUGE = [100_000, 65_536, 46_341, 1 << 20, (1 << 31) - 1, 1 << 31, 1 << 40]

BASE_MODELS = {
    "mlp": lambda: models.mlp(),
    "small_cnn": lambda: models.small_cnn(size=16),
    "attention": lambda: models.tiny_attention(),
}

# op types a node may be swapped to: supported ones of every arity, and some that are not
SWAP_OPS = ["Relu", "Sigmoid", "Softmax", "Transpose", "Flatten", "Identity", "Neg", "Exp", "Log", "Sqrt",
            "Add", "Mul", "Sub", "Div", "Pow", "MatMul", "Gemm", "Conv", "MaxPool", "AveragePool",
            "GlobalAveragePool", "ReduceMean", "ReduceSum", "ReduceMax", "ArgMax", "Concat", "Gather",
            "Reshape", "Squeeze", "Unsqueeze", "Slice", "Tile", "Expand", "Where", "Equal", "Cast",
            "LayerNormalization", "BatchNormalization", "Clip", "Pad", "Resize", "Split", "Shape", "Size",
            "ConstantOfShape", "Range", "TopK", "NonZero", "Einsum", "CumSum", "Loop", "If", "Det",
            "NoSuchOp"]


# ----------------------------------------------------------------------------
# mutations: (model proto, rng) -> (description, model bytes)

def _ser(m: onnx.ModelProto) -> bytes:
    return m.SerializeToString()


def _pick_node(m, rng, pred=lambda n: True):
    nodes = [n for n in m.graph.node if pred(n)]
    return rng.choice(nodes) if nodes else rng.choice(list(m.graph.node))


def mut_truncate(m, rng):
    raw = _ser(m)
    k = rng.randrange(len(raw))
    return f"cut at byte {k} of {len(raw)}", raw[:k]


def mut_flip_bytes(m, rng):
    raw = bytearray(_ser(m))
    n = rng.choice([1, 1, 2, 4, 16])
    for _ in range(n):
        i = rng.randrange(len(raw))
        raw[i] ^= rng.randrange(1, 256)
    return f"{n} byte(s) flipped", bytes(raw)


def mut_delete_node(m, rng):
    i = rng.randrange(len(m.graph.node))
    name = m.graph.node[i].name
    del m.graph.node[i]
    return f"deleted node {name}", _ser(m)


def mut_duplicate_node(m, rng):
    i = rng.randrange(len(m.graph.node))
    dup = onnx.NodeProto()
    dup.CopyFrom(m.graph.node[i])
    if rng.random() < 0.5:       # same outputs again: not SSA
        desc = f"node {dup.name} duplicated (same outputs)"
    else:                          # renamed outputs: valid, dead code
        for j, o in enumerate(dup.output):
            dup.output[j] = f"{o}__dup"
        dup.name = f"{dup.name}__dup"
        desc = f"node {dup.name} duplicated (renamed outputs)"
    m.graph.node.insert(rng.randrange(len(m.graph.node) + 1), dup)
    return desc, _ser(m)


def mut_dangling_edge(m, rng):
    n = _pick_node(m, rng)
    choice = rng.random()
    if choice < 0.4 and len(n.input):
        j = rng.randrange(len(n.input))
        n.input[j] = "dangling_" + n.input[j]
        return f"input {j} of {n.name} renamed to a dangling name", _ser(m)
    if choice < 0.7:
        j = rng.randrange(len(n.output))
        n.output[j] = "orphan_" + n.output[j]
        return f"output {j} of {n.name} renamed (its consumers dangle)", _ser(m)
    if choice < 0.85:
        m.graph.output[rng.randrange(len(m.graph.output))].name = "never_produced"
        return "a graph output renamed to a name nothing produces", _ser(m)
    if len(n.input):
        n.input[rng.randrange(len(n.input))] = ""
    return f"an input of {n.name} made empty (omitted)", _ser(m)


def mut_reorder_nodes(m, rng):
    nodes = list(m.graph.node)
    i, j = rng.randrange(len(nodes)), rng.randrange(len(nodes))
    nodes[i], nodes[j] = nodes[j], nodes[i]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return f"nodes {i} and {j} swapped (not topological)", _ser(m)


def _make_attr(name, rng):
    kind = rng.choice(["float", "string", "ints", "floats", "int", "tensor", "graph"])
    value = {"float": 1.5, "string": b"bogus", "ints": [rng.randrange(-3, 4) for _ in range(rng.randrange(0, 5))],
             "floats": [0.5, float("nan")], "int": rng.choice([-1, 0, 7, 1 << 40]),
             "tensor": helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0]),
             "graph": helper.make_graph([], "g", [], [])}[kind]
    if kind == "ints":
        return kind, helper.make_attribute(name, value, attr_type=onnx.AttributeProto.INTS)
    return kind, helper.make_attribute(name, value)


def mut_attr_wrong_type(m, rng):
    n = _pick_node(m, rng, lambda n: len(n.attribute) > 0)
    if not n.attribute:
        kind, a = _make_attr("axis", rng)
        n.attribute.append(a)
        return f"{n.op_type} {n.name}: added attribute axis as {kind}", _ser(m)
    j = rng.randrange(len(n.attribute))
    name = n.attribute[j].name
    kind, a = _make_attr(name, rng)
    n.attribute[j].CopyFrom(a)
    return f"{n.op_type} {n.name}: attribute {name} replaced by a {kind}", _ser(m)


BAD_INTS = [0, -1, -3, 1 << 20, (1 << 31) - 1, 1 << 40, -(1 << 40)]


def mut_attr_bad_value(m, rng):
    """Type-correct but meaningless values: negative kernels, zero strides, huge pads, bad axes."""
    n = _pick_node(m, rng, lambda n: n.op_type in ("Conv", "MaxPool", "AveragePool", "Gemm", "Softmax",
                                                   "Transpose", "LayerNormalization", "Flatten", "Concat",
                                                   "Gather"))
    op = n.op_type
    attrs = {a.name: a for a in n.attribute}
    if op in ("Conv", "MaxPool", "AveragePool"):
        nd = 2
        key = rng.choice(["kernel_shape", "strides", "pads", "dilations", "group", "auto_pad", "ceil_mode"])
        if key == "group":
            value = rng.choice([0, -1, 3, 1 << 30])
        elif key == "auto_pad":
            value = rng.choice([b"SAME_UPPER", b"VALID", b"BOGUS"])
        elif key == "ceil_mode":
            value = rng.choice([1, 2, -1])
        elif key == "pads":
            value = [rng.choice(BAD_INTS + [1]) for _ in range(2 * nd)]
        else:
            value = [rng.choice(BAD_INTS + [1, 2]) for _ in range(rng.choice([nd, nd, 1, 3]))]
    elif op == "Gemm":
        key = rng.choice(["transA", "transB", "alpha", "beta"])
        value = rng.choice([2, -1]) if key.startswith("trans") else rng.choice([float("nan"), float("inf"), 0.0])
    elif op == "Transpose":
        key, value = "perm", rng.choice([[0, 0], [1, 2, 3, 0, 4], [5, 0], [-1, 0], []])
    else:
        key, value = "axis", rng.choice([-100, 99, 1 << 40, 3, -5])
    if key in attrs:
        n.attribute.remove(attrs[key])
    n.attribute.append(helper.make_attribute(key, value, attr_type=onnx.AttributeProto.INTS)
                       if isinstance(value, list) else helper.make_attribute(key, value))
    return f"{op} {n.name}: {key} = {value!r}", _ser(m)


def _inputs(m):
    init = {t.name for t in m.graph.initializer}
    return [vi for vi in m.graph.input if vi.name not in init]


def mut_huge_dims(m, rng):
    vi = rng.choice(_inputs(m))
    dims = vi.type.tensor_type.shape.dim
    how = rng.random()
    if how < 0.4 and len(dims) >= 2:     # e.g. 100000 x 100000 in the last two dims
        h = rng.choice(HUGE)
        dims[-1].dim_value = h
        dims[-2].dim_value = h
    else:
        d = dims[rng.randrange(len(dims))]
        d.dim_value = rng.choice(HUGE)
    return f"input {vi.name} dims -> {[d.dim_value for d in dims]}", _ser(m)


def mut_input_shape(m, rng):
    vi = rng.choice(_inputs(m))
    t = vi.type.tensor_type
    how = rng.choice(["zero", "one", "small", "rank+1", "rank-1", "symbolic", "no_shape", "negative"])
    if how == "rank+1":
        t.shape.dim.add().dim_value = rng.choice([1, 2])
    elif how == "rank-1" and len(t.shape.dim):
        del t.shape.dim[-1]
    elif how == "no_shape":
        t.ClearField("shape")
    elif len(t.shape.dim):
        d = t.shape.dim[rng.randrange(len(t.shape.dim))]
        if how == "symbolic":
            d.dim_param = "n"
        elif how == "negative":
            d.dim_value = -rng.choice([1, 2, 5])
        else:
            d.dim_value = {"zero": 0, "one": 1, "small": rng.choice([2, 3, 5, 7])}[how]
    return f"input {vi.name}: {how} -> {[d.dim_value or d.dim_param for d in t.shape.dim]}", _ser(m)


def mut_input_dtype(m, rng):
    vi = rng.choice(_inputs(m))
    dt = rng.choice([TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.STRING, TensorProto.INT8,
                     TensorProto.UINT64, TensorProto.BOOL, TensorProto.INT64, TensorProto.COMPLEX64, 0, 999])
    vi.type.tensor_type.elem_type = dt
    return f"input {vi.name} element type -> {dt}", _ser(m)


def mut_initializer_bytes(m, rng):
    inits = [t for t in m.graph.initializer if t.raw_data]
    if not inits:
        return mut_initializer_shape(m, rng)
    t = rng.choice(inits)
    n = len(t.raw_data)
    how = rng.choice(["short", "long", "empty", "odd"])
    if how == "short":
        t.raw_data = t.raw_data[: rng.randrange(n)]
    elif how == "long":
        t.raw_data = t.raw_data + bytes(rng.choice([1, 4, 64, n]))
    elif how == "empty":
        t.raw_data = b""
    else:
        t.raw_data = t.raw_data[:-1] if n else b"\x01"
    return f"initializer {t.name}: raw_data {how} ({n} -> {len(t.raw_data)} bytes)", _ser(m)


def mut_initializer_shape(m, rng):
    t = rng.choice(list(m.graph.initializer))
    how = rng.choice(["dims", "dtype", "huge", "both_data"])
    if how == "dims":
        if t.dims:
            t.dims[rng.randrange(len(t.dims))] += rng.choice([-1, 1, 7])
        else:
            t.dims.append(3)
    elif how == "huge":
        del t.dims[:]
        t.dims.extend([100_000, 100_000])
    elif how == "dtype":
        t.data_type = rng.choice([TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8, TensorProto.STRING,
                                  TensorProto.INT64, 0, 77])
    else:   # data in two places
        t.float_data.extend([1.0, 2.0])
    return f"initializer {t.name}: {how} -> dims {list(t.dims)} type {t.data_type}", _ser(m)


def mut_unknown_domain(m, rng):
    n = _pick_node(m, rng)
    how = rng.random()
    if how < 0.5:
        n.domain = rng.choice(["com.example", "com.microsoft", "ai.onnx.ml"])
        if rng.random() < 0.7:
            m.opset_import.append(helper.make_opsetid(n.domain, 1))
        return f"node {n.name} moved to domain {n.domain}", _ser(m)
    m.opset_import.append(helper.make_opsetid(rng.choice(["com.example", "x.y"]), rng.choice([1, 999])))
    return "an unknown domain imported", _ser(m)


def mut_opset(m, rng):
    how = rng.choice(["version", "remove", "duplicate", "ir_version"])
    if how == "version":
        v = rng.choice([0, 1, 6, 9, 13, 24, 99, 1 << 40])
        for o in m.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = v
        return f"default opset -> {v}", _ser(m)
    if how == "remove":
        del m.opset_import[:]
        return "no opset_import", _ser(m)
    if how == "duplicate":
        m.opset_import.append(helper.make_opsetid("", rng.choice([11, 17])))
        return "the default opset imported twice", _ser(m)
    m.ir_version = rng.choice([0, 1, 3, 99])
    return f"ir_version -> {m.ir_version}", _ser(m)


def mut_op_swap(m, rng):
    n = _pick_node(m, rng)
    old = n.op_type
    n.op_type = rng.choice(SWAP_OPS)
    if rng.random() < 0.5:
        del n.attribute[:]
    return f"node {n.name}: {old} -> {n.op_type}", _ser(m)


def mut_folding_bomb(m, rng):
    """A constant subgraph whose folded value would be enormous (compile-time folding must not allocate it)."""
    out = m.graph.output[0]
    dims = rng.choice([[100_000, 100_000], [1 << 16, 1 << 16], [1 << 31], [50_000, 50_000], [4096, 4096, 64]])
    shape = helper.make_tensor("bomb_shape", TensorProto.INT64, [len(dims)], dims)
    how = rng.choice(["ConstantOfShape", "Expand", "Tile", "Range"])
    nodes = [helper.make_node("Constant", [], ["bomb_dims"], value=shape, name="bomb_dims")]
    if how == "ConstantOfShape":
        nodes.append(helper.make_node("ConstantOfShape", ["bomb_dims"], ["bomb"], name="bomb",
                                      value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])))
    elif how == "Expand":
        nodes += [helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", TensorProto.FLOAT, [], [1.0])),
                  helper.make_node("Expand", ["one", "bomb_dims"], ["bomb"], name="bomb")]
    elif how == "Tile":
        nodes += [helper.make_node("Constant", [], ["one"],
                                   value=helper.make_tensor("o", TensorProto.FLOAT, [1] * len(dims), [1.0])),
                  helper.make_node("Tile", ["one", "bomb_dims"], ["bomb"], name="bomb")]
    else:
        nodes += [helper.make_node("Constant", [], ["lo"], value=helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0])),
                  helper.make_node("Constant", [], ["hi"], value=helper.make_tensor("hi", TensorProto.FLOAT, [], [3e9])),
                  helper.make_node("Constant", [], ["st"], value=helper.make_tensor("st", TensorProto.FLOAT, [], [1.0])),
                  helper.make_node("Range", ["lo", "hi", "st"], ["bomb"], name="bomb")]
    nodes += [helper.make_node("ReduceSum", ["bomb"], ["bomb_sum"], name="bomb_sum", keepdims=0),
              helper.make_node("Add", [out.name + "_pre", "bomb_sum"], [out.name], name="bomb_add")]
    for n in m.graph.node:
        for j, o in enumerate(n.output):
            if o == out.name:
                n.output[j] = out.name + "_pre"
    m.graph.node.extend(nodes)
    return f"{how} folding to {dims}", _ser(m)


def _available(m, before_node):
    """Tensor names usable as inputs of the node at position `before_node` (topological order kept)."""
    names = [vi.name for vi in m.graph.input] + [t.name for t in m.graph.initializer]
    for n in m.graph.node[:before_node]:
        names += [o for o in n.output if o]
    return names


def mut_rewire(m, rng):
    """Connect a node input to another existing tensor: valid ONNX syntax, wrong shapes or types."""
    candidates = [i for i, n in enumerate(m.graph.node) if len(n.input)]
    i = rng.choice(candidates)
    n = m.graph.node[i]
    j = rng.randrange(len(n.input))
    old = n.input[j]
    n.input[j] = rng.choice(_available(m, i))
    return f"input {j} of {n.op_type} {n.name}: {old} -> {n.input[j]}", _ser(m)


def _random_array(rng):
    import numpy as np
    shape = [rng.choice([0, 1, 1, 2, 3, 5, 16]) for _ in range(rng.choice([0, 1, 1, 2, 3, 4]))]
    dtype = rng.choice([np.float32, np.float32, np.int64, np.int32, np.bool_, np.float16, np.float64, np.uint8])
    a = np.random.default_rng(rng.randrange(1 << 30)).standard_normal(shape) * 4
    return a.astype(dtype)


def mut_initializer_replace(m, rng):
    """A well-formed initializer of another shape and element type under the same name."""
    from onnx import numpy_helper
    t = rng.choice(list(m.graph.initializer))
    a = _random_array(rng)
    t.CopyFrom(numpy_helper.from_array(a, t.name))
    return f"initializer {t.name} -> {a.dtype} {list(a.shape)}", _ser(m)


def mut_constant_input(m, rng):
    """Replace a node input by a Constant node of random shape and type (exercises folding)."""
    from onnx import numpy_helper
    i = rng.choice([i for i, n in enumerate(m.graph.node) if len(n.input)])
    n = m.graph.node[i]
    j = rng.randrange(len(n.input))
    a = _random_array(rng)
    c = helper.make_node("Constant", [], [f"fuzz_const_{i}_{j}"], name=f"fuzz_const_{i}_{j}",
                         value=numpy_helper.from_array(a))
    n.input[j] = c.output[0]
    m.graph.node.insert(i, c)
    return f"input {j} of {n.op_type} {n.name} -> Constant {a.dtype} {list(a.shape)}", _ser(m)


def mut_attr_remove(m, rng):
    n = _pick_node(m, rng, lambda n: len(n.attribute) > 0)
    if not n.attribute:
        return mut_attr_bad_value(m, rng)
    j = rng.randrange(len(n.attribute))
    name = n.attribute[j].name
    del n.attribute[j]
    return f"{n.op_type} {n.name}: attribute {name} removed", _ser(m)


def mut_outputs(m, rng):
    """Graph outputs that are intermediates, inputs, initializers, or listed twice."""
    how = rng.choice(["intermediate", "input", "initializer", "twice", "none"])
    if how == "none":
        del m.graph.output[:]
        return "no graph outputs", _ser(m)
    if how == "twice":
        o = onnx.ValueInfoProto()
        o.CopyFrom(m.graph.output[0])
        m.graph.output.append(o)
        return f"output {o.name} listed twice", _ser(m)
    if how == "intermediate":
        name = rng.choice([o for n in m.graph.node for o in n.output])
    elif how == "input":
        name = _inputs(m)[0].name
    else:
        name = rng.choice(list(m.graph.initializer)).name
    m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None)
                          if rng.random() < 0.5 else helper.make_empty_tensor_value_info(name))
    return f"{how} {name} made a graph output", _ser(m)


MUTATIONS = {
    "truncate": mut_truncate,
    "flip_bytes": mut_flip_bytes,
    "delete_node": mut_delete_node,
    "duplicate_node": mut_duplicate_node,
    "dangling_edge": mut_dangling_edge,
    "reorder_nodes": mut_reorder_nodes,
    "attr_wrong_type": mut_attr_wrong_type,
    "attr_bad_value": mut_attr_bad_value,
    "huge_dims": mut_huge_dims,
    "input_shape": mut_input_shape,
    "input_dtype": mut_input_dtype,
    "initializer_bytes": mut_initializer_bytes,
    "initializer_shape": mut_initializer_shape,
    "unknown_domain": mut_unknown_domain,
    "opset": mut_opset,
    "op_swap": mut_op_swap,
    "folding_bomb": mut_folding_bomb,
    "rewire": mut_rewire,
    "initializer_replace": mut_initializer_replace,
    "constant_input": mut_constant_input,
    "attr_remove": mut_attr_remove,
    "graph_outputs": mut_outputs,
}


@dataclass
class Case:
    index: int
    base: str
    kind: str
    desc: str
    model: bytes


def generate(n: int, seed: int = 0):
    """n cases, round-robin over mutation kinds and base models, each with its own seeded rng."""
    bases = {k: _ser(f()) for k, f in BASE_MODELS.items()}
    kinds, names = list(MUTATIONS), list(bases)
    for i in range(n):
        kind = kinds[i % len(kinds)]
        base = names[(i // len(kinds)) % len(names)]
        rng = random.Random(seed * 1_000_003 + i)
        m = onnx.ModelProto.FromString(bases[base])
        desc, raw = MUTATIONS[kind](m, rng)
        yield Case(i, base, kind, desc, raw)


# ----------------------------------------------------------------------------
# in-process compile with a deadline

class Deadline(BaseException):
    """Raised by SIGALRM when a case runs past its deadline (a BaseException so no handler swallows it)."""


@contextlib.contextmanager
def deadline(seconds: float):
    """SIGALRM after `seconds`; restores any timer already set (pytest-timeout's) afterwards."""
    def on_alarm(signum, frame):
        raise Deadline()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    t0 = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay:
            signal.setitimer(signal.ITIMER_REAL, max(old_delay - (time.monotonic() - t0), 0.001))


def classify(e: BaseException) -> str:
    if isinstance(e, Deadline):
        return "hang"
    if isinstance(e, CompilerBug):
        return "CompilerBug"
    if isinstance(e, WebireeError):
        return type(e).__name__
    return "BUG:" + type(e).__name__


# ----------------------------------------------------------------------------
# the native worker

def _worker_main():
    """Read one JSON request a line; answer one JSON line on the original stdout."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                     # stray prints from native libraries go to stderr
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    import numpy as np
    import onnxruntime as ort        # outside any handler: a missing onnxruntime kills the worker, loudly

    from ..session import InferenceSession

    for line in sys.stdin:
        req = json.loads(line)
        res = {"id": req["id"]}
        if req.get("selftest") == "crash":     # tests of the harness itself
            os._exit(70)
        if req.get("selftest") == "hang":
            time.sleep(3600)
        try:
            sess = InferenceSession(req["dir"])
            rng = np.random.default_rng(req["id"])
            feeds = {}
            from ..session import NUMPY_OF_ONNX
            for io in sess.module.inputs:
                dt = np.dtype(NUMPY_OF_ONNX[io.onnx_type])
                if dt.kind == "f":
                    feeds[io.name] = rng.standard_normal(io.shape).astype(dt)
                elif dt == np.bool_:
                    feeds[io.name] = rng.integers(0, 2, io.shape).astype(dt)
                else:
                    feeds[io.name] = rng.integers(0, 10, io.shape).astype(dt)
            got = sess.run(None, feeds)
            res["outcome"] = "ok"
            res["ort"], res["ort_detail"] = _compare_ort(ort, req["model"], feeds, got)
        except WebireeError as e:
            res["outcome"] = "CompilerBug" if isinstance(e, CompilerBug) else type(e).__name__
            res["message"] = str(e)[:300]
        except Exception as e:
            res["outcome"] = "BUG:" + type(e).__name__
            res["message"] = "".join(traceback.format_exception(e))[-2000:]
        out.write(json.dumps(res) + "\n")


def _ort_errors() -> tuple:
    """The exception types by which onnxruntime says it cannot load or run a model (Fail,
    InvalidGraph, InvalidArgument, NotImplemented, ...): those of its native module."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C
    return tuple(v for v in vars(C).values() if isinstance(v, type) and issubclass(v, Exception))


def _compare_ort(ort, model_path, feeds, got) -> tuple[str, str]:
    """Run onnxruntime on the model and feeds webiree ran; ("agree" | "differ" | "refused", details).

    Only onnxruntime's own failure to load or run the mutated model counts as "refused";
    any other exception propagates (the worker reports it as a bug)."""
    import numpy as np
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
    except _ort_errors() as e:
        return "refused", f"{type(e).__name__}: {str(e)[:300]}"
    # a different number of outputs is a disagreement, never a shorter zip
    if len(got) != len(ref):
        return "differ", f"webiree gives {len(got)} outputs, onnxruntime {len(ref)}"
    for i, (g, r) in enumerate(zip(got, ref)):
        why = _difference(np.asarray(g), np.asarray(r))
        if why:
            return "differ", f"output {i}: {why}"
    return "agree", ""


def _difference(g, r) -> str:
    """How webiree's output g differs from onnxruntime's r; "" when they agree (floats to 1e-4 of
    r's largest finite magnitude, with NaN and inf in the same places)."""
    import numpy as np
    if g.shape != r.shape:
        return f"shape {g.shape}, onnxruntime {r.shape}"
    if r.dtype.kind in "biu":
        return "" if np.array_equal(g, r) else f"{int((g != r).sum())} of {r.size} values differ"
    if not np.array_equal(np.isnan(g), np.isnan(r)):
        return "NaN in other places"
    inf = np.isinf(r)
    if not np.array_equal(g[inf], r[inf]):
        return "inf in other places"
    ok = np.isfinite(r)
    if ok.any():
        scale = max(float(np.abs(r[ok]).max()), 1e-30)
        err = float(np.abs(g[ok].astype(np.float64) - r[ok]).max()) / scale
        if err > 1e-4:
            return f"max |difference| / max |onnxruntime| = {err:.2e} > 1e-4"
    return ""


class Worker:
    """One long-lived subprocess that runs compiled cases natively; replaced when it dies or hangs."""

    def __init__(self):
        self.proc = None
        self.buf = b""
        self.pending = None     # (case index, start time)
        self.restarts = 0

    def _start(self):
        env = dict(os.environ)
        env.setdefault("XDG_RUNTIME_DIR", "/tmp")
        self.proc = subprocess.Popen([sys.executable, "-m", "webiree.testing.fuzz", "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env)
        self.buf = b""

    def submit(self, index: int, build_dir: str, model_path: str, **extra):
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        req = json.dumps({"id": index, "dir": build_dir, "model": model_path, **extra}) + "\n"
        try:
            self.proc.stdin.write(req.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass    # collect() sees the dead worker
        self.pending = (index, time.monotonic())

    def collect(self, timeout: float = RUN_DEADLINE_S) -> dict | None:
        if self.pending is None:
            return None
        index, t0 = self.pending
        self.pending = None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = timeout - (time.monotonic() - t0)
            if left <= 0:
                self._kill()
                return {"id": index, "outcome": "hang"}
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                rc = self.proc.wait()
                self.proc = None
                self.restarts += 1
                return {"id": index, "outcome": "crash", "message": f"worker exited with {rc}"}
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def _kill(self):
        if self.proc is not None:
            self.proc.kill()           # only the worker this object started
            self.proc.wait()
            self.proc = None
            self.restarts += 1

    def close(self):
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                self._kill()
            self.proc = None


# ----------------------------------------------------------------------------
# the campaign

@dataclass
class Result:
    case: Case
    compile: str = ""            # "ok" or the error class
    run: str = ""                # "", "ok" or the error class / hang / crash
    ort: str = ""                # cases that ran: onnxruntime "agree"s, "differ"s or "refused" the model
    ort_detail: str = ""         # how the outputs differ, or why onnxruntime refused
    folded: bool = False         # the whole graph was folded at compile time (no kernel computes)
    message: str = ""
    seconds: float = 0.0

    @property
    def outcome(self) -> str:
        if self.compile != "ok":
            return f"compile:{self.compile}"
        return f"run:{self.run}"

    @property
    def bad(self) -> bool:
        return any(s.startswith("BUG:") or s in ("hang", "crash") for s in (self.compile, self.run))


@dataclass
class Report:
    results: list = field(default_factory=list)
    seconds: float = 0.0
    worker_restarts: int = 0

    def bugs(self):
        return [r for r in self.results if r.bad]

    def compiler_bugs(self):
        return [r for r in self.results if "CompilerBug" in (r.compile, r.run)]

    def compared(self):
        """Cases that ran natively and whose outputs were compared with onnxruntime's."""
        return [r for r in self.results if r.ort in ("agree", "differ")]

    def agreed(self):
        return [r for r in self.results if r.ort == "agree"]

    def refused(self):
        """Cases that ran natively but that onnxruntime cannot load or run (not compared)."""
        return [r for r in self.results if r.ort == "refused"]

    def disagreements(self):
        """Cases whose kernels computed a result other than onnxruntime's."""
        return [r for r in self.results if r.ort == "differ" and not r.folded]

    def folded_disagreements(self):
        """Cases folded entirely at compile time (by onnx's reference evaluator) whose value differs
        from onnxruntime's: a difference between the two references, reported, not failed."""
        return [r for r in self.results if r.ort == "differ" and r.folded]

    def summary(self) -> str:
        """One line of counts: what ran, what was compared with onnxruntime and agreed."""
        ran = sum(r.run == "ok" for r in self.results)
        errors = sum(not r.bad and r.outcome not in ("run:ok", "run:skipped") for r in self.results)
        return (f"{len(self.results)} cases: {ran} ran natively, {len(self.compared())} compared with onnxruntime, "
                f"{len(self.agreed())} agreed, {len(self.disagreements())} differ "
                f"(+{len(self.folded_disagreements())} folded at compile time), "
                f"{len(self.refused())} refused by onnxruntime, {errors} WebireeErrors, "
                f"{len(self.bugs())} bugs")

    def table(self) -> dict:
        t: dict = collections.defaultdict(collections.Counter)
        for r in self.results:
            t[r.case.kind][r.outcome] += 1
        return {k: dict(sorted(v.items())) for k, v in sorted(t.items())}

    def text(self) -> str:
        lines = [f"{len(self.results)} cases in {self.seconds:.1f} s; worker restarts {self.worker_restarts}"]
        totals = collections.Counter(r.outcome for r in self.results)
        lines.append("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())))
        lines.append(self.summary())
        for kind, counts in self.table().items():
            lines.append(f"  {kind:<18} " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        for r in self.bugs() + self.compiler_bugs() + self.disagreements() + self.folded_disagreements():
            lines.append(f"  ! case {r.case.index} {r.case.base}/{r.case.kind} ({r.case.desc}): {r.outcome} "
                         f"onnxruntime {r.ort or '-'} {r.ort_detail} {r.message[-600:]}")
        slow = max(self.results, key=lambda r: r.seconds, default=None)
        if slow:
            lines.append(f"slowest compile: case {slow.case.index} {slow.case.kind} {slow.seconds:.2f} s")
        return "\n".join(lines)


def run_campaign(n: int = 500, seed: int = 0, workdir=None, run_native: bool = True,
                 compile_deadline: float = COMPILE_DEADLINE_S, run_deadline: float = RUN_DEADLINE_S) -> Report:
    from ..module.folder import MODULE_FILE, WEIGHTS_FILE
    from ..bundler.site import shader_validator
    from ..compiler.driver import compile_model
    from ..module import write_module

    if run_native:
        import onnxruntime  # noqa: F401 - the worker compares with it: a missing one fails here, loudly

    own_tmp = workdir is None
    root = Path(tempfile.mkdtemp(prefix="webiree-fuzz-") if own_tmp else workdir)
    report = Report()
    worker = Worker() if run_native else None
    in_flight: tuple | None = None     # (Result, case dir)
    t_start = time.monotonic()

    def finish_in_flight():
        nonlocal in_flight
        if in_flight is None:
            return
        res, cdir = in_flight
        in_flight = None
        got = worker.collect(run_deadline)
        res.run = got["outcome"]
        res.ort = got.get("ort", "")
        res.ort_detail = got.get("ort_detail", "")
        res.message = got.get("message", "")
        shutil.rmtree(cdir, ignore_errors=True)

    try:
        for case in generate(n, seed):
            res = Result(case)
            report.results.append(res)
            t0 = time.monotonic()
            try:
                with deadline(compile_deadline):
                    cr = compile_model(case.model, validate=shader_validator)
                    module_bytes = write_module(cr.module)
                res.compile = "ok"
                res.folded = all(d.nodes == ["outputs"] for d in cr.dispatches)
            except BaseException as e:  # noqa: B902 - the point is to classify everything
                if isinstance(e, KeyboardInterrupt):
                    raise
                res.compile = classify(e)
                if res.compile.startswith("BUG:") or res.compile in ("CompilerBug", "hang"):
                    res.message = "".join(traceback.format_exception(e))[-2000:]
                else:
                    res.message = str(e)[:300]
                cr = None
            res.seconds = time.monotonic() - t0
            if cr is None:
                continue
            if not run_native:
                res.run = "skipped"
                continue
            cdir = root / f"case{case.index:05d}"
            cdir.mkdir(parents=True, exist_ok=True)
            (cdir / MODULE_FILE).write_bytes(module_bytes)
            (cdir / WEIGHTS_FILE).write_bytes(cr.weights)
            (cdir / "model.onnx").write_bytes(case.model)
            finish_in_flight()
            worker.submit(case.index, str(cdir), str(cdir / "model.onnx"))
            in_flight = (res, cdir)
        if worker is not None:
            finish_in_flight()
    finally:
        if worker is not None:
            worker.close()
            report.worker_restarts = worker.restarts
        if own_tmp:
            shutil.rmtree(root, ignore_errors=True)
    report.seconds = time.monotonic() - t_start
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m webiree.testing.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-run", action="store_true", help="compile only")
    p.add_argument("--json", help="write per-case results to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker_main()
        return 0
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    rep = run_campaign(args.cases, args.seed, run_native=not args.no_run)
    print(rep.text())
    if args.json:
        Path(args.json).write_text(json.dumps([
            {"index": r.case.index, "base": r.case.base, "kind": r.case.kind, "desc": r.case.desc,
             "outcome": r.outcome, "ort": r.ort, "ort_detail": r.ort_detail, "folded": r.folded,
             "message": r.message,
             "seconds": round(r.seconds, 3)}
            for r in rep.results], indent=1))
    return 1 if rep.bugs() else 0


if __name__ == "__main__":
    sys.exit(main())
