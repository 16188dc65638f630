#!/usr/bin/env python
"""Export the four benchmark ("seed") models to ONNX with random seeded weights.

Usage::

    python tests/seed/export_seed_models.py --out DIR [--only NAME ...] [--describe]

For every model NAME this writes into DIR:

* ``NAME.onnx``        single-file ONNX model (opset 17, batch 1, fp32, static shapes)
* ``NAME.inputs.npz``  seeded sample inputs, keyed by ONNX graph input name
* ``NAME.ref.npz``     onnxruntime CPU outputs on those inputs, keyed by ONNX output name

A model whose three files already exist is skipped (so CI can cache DIR).  Files are
written under temporary names and renamed into place, ``NAME.ref.npz`` last, so an
interrupted run never leaves a set that looks complete.

Weights come from the Hugging Face ``transformers`` model classes constructed from a
config (no hub access) under ``torch.manual_seed``; every normalisation scale/bias and
batch-norm running statistic is then overwritten with non-trivial seeded values, and the
(HF-zero-initialised) Linear/Conv biases with 0.02*N(0,1), so a dropped term in a
compiled kernel changes the result.

Exporter: ``torch.onnx.export`` as users call it.  In torch 2.13 the default is the
dynamo (``torch.export`` + onnxscript) exporter, which works for all four models; the
script falls back to the TorchScript exporter (``dynamo=False``) only if the dynamo
export raises, and says so in the printed line (the ``exporter=`` field).  The dynamo
exporter's default ``external_data=True`` would write the weights to a side file
``NAME.onnx.data``; all four models are far below 2 GB, so we pass
``external_data=False`` and get one self-contained ``NAME.onnx``.

Pinned versions used to produce the committed README numbers:
torch==2.13.0 (CPU build), transformers==5.23.0 (5.24.0 gives byte-identical files),
onnxscript==0.7.2, onnx-ir==1.1.0, onnx==1.23.2, onnxruntime==1.31.1, numpy 2.4.6.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

OPSET = 17
SEED = 0
SEQ_LEN = 128
MASKED_TAIL = 20  # last positions of attention_mask set to 0


# --------------------------------------------------------------------------- models


def _randomize_norms(model, seed: int) -> None:
    """Give every norm scale/bias and batch-norm running stat a non-trivial value.

    weight ~ 1 + 0.1*N(0,1), bias ~ 0.1*N(0,1), running_mean ~ 0.1*N(0,1),
    running_var ~ U(0.5, 1.5).  Covers nn.BatchNorm*, nn.LayerNorm and MobileBERT's
    NoNorm (any module whose class name contains "Norm").
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
            if "Norm" not in type(mod).__name__:
                continue
            w = getattr(mod, "weight", None)
            b = getattr(mod, "bias", None)
            if isinstance(w, torch.Tensor):
                w.copy_(1.0 + 0.1 * torch.randn(w.shape, generator=g))
            if isinstance(b, torch.Tensor):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            rm = getattr(mod, "running_mean", None)
            rv = getattr(mod, "running_var", None)
            if isinstance(rm, torch.Tensor):
                rm.copy_(0.1 * torch.randn(rm.shape, generator=g))
            if isinstance(rv, torch.Tensor):
                rv.copy_(0.5 + torch.rand(rv.shape, generator=g))


def _randomize_biases(model, seed: int) -> None:
    """HF init zeroes every Linear/Conv bias; give them small seeded values (0.02*N(0,1))
    too, so a dropped bias add also shows up in the reference outputs."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
            if "Norm" in type(mod).__name__:
                continue
            b = mod._parameters.get("bias") if hasattr(mod, "_parameters") else None
            if isinstance(b, torch.Tensor):
                b.copy_(0.02 * torch.randn(b.shape, generator=g))


def _pixel_inputs(rng: np.random.Generator, size: int) -> dict[str, np.ndarray]:
    return {"pixel_values": rng.standard_normal((1, 3, size, size), dtype=np.float32)}


def _text_inputs(rng: np.random.Generator, vocab: int) -> dict[str, np.ndarray]:
    input_ids = rng.integers(0, vocab, size=(1, SEQ_LEN), dtype=np.int64)
    attention_mask = np.ones((1, SEQ_LEN), dtype=np.int64)
    attention_mask[:, SEQ_LEN - MASKED_TAIL :] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def build_mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    # Default config; 1001 labels like google/mobilenet_v2_1.0_224 (background + 1000).
    cfg = MobileNetV2Config(num_labels=1001, image_size=224)
    return MobileNetV2ForImageClassification(cfg), (lambda rng: _pixel_inputs(rng, 224)), ["logits"]


def build_deeplabv3():
    from transformers import MobileNetV2Config, MobileNetV2ForSemanticSegmentation

    # Shape of google/deeplabv3_mobilenet_v2_1.0_513: output_stride 8, 21 VOC labels.
    cfg = MobileNetV2Config(num_labels=21, image_size=513, output_stride=8)
    return MobileNetV2ForSemanticSegmentation(cfg), (lambda rng: _pixel_inputs(rng, 513)), ["logits"]


def build_minilm():
    from transformers import BertConfig, BertModel

    # Shape of sentence-transformers/all-MiniLM-L6-v2.
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        type_vocab_size=2,
        hidden_act="gelu",
    )
    return (
        BertModel(cfg),
        (lambda rng: _text_inputs(rng, cfg.vocab_size)),
        ["last_hidden_state", "pooler_output"],
    )


def build_mobilebert():
    from transformers import MobileBertConfig, MobileBertModel

    cfg = MobileBertConfig()  # default config (google/mobilebert-uncased shape)
    return (
        MobileBertModel(cfg),
        (lambda rng: _text_inputs(rng, cfg.vocab_size)),
        ["last_hidden_state", "pooler_output"],
    )


MODELS: dict[str, Callable] = {
    "mobilenet_v2": build_mobilenet_v2,
    "deeplabv3": build_deeplabv3,
    "minilm": build_minilm,
    "mobilebert": build_mobilebert,
}


# --------------------------------------------------------------------------- census


def op_census(model) -> collections.Counter:
    """Op-type counts over the main graph and any subgraphs (domain-qualified if not ai.onnx)."""
    counts: collections.Counter = collections.Counter()

    def walk(graph):
        for node in graph.node:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            counts[key] += 1
            for attr in node.attribute:
                if attr.g is not None and attr.g.node:
                    walk(attr.g)
                for sub in attr.graphs:
                    walk(sub)

    walk(model.graph)
    for fn in model.functions:  # local functions (should be none after inlining)
        for node in fn.node:
            counts[f"fn:{fn.name}/{node.op_type}"] += 1
    return counts


def format_census(counts: collections.Counter) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def describe(model) -> str:
    """Notable attribute patterns per op type (what the compiler has to support)."""
    import onnx
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    consts, n_foldable = _fold_small_constants(model)
    shape_model = _folded_copy(model, consts)

    def cval(name):
        if name in consts:
            a = np.asarray(consts[name])
            if a.size <= 16:
                return a.tolist()
            flat = a.reshape(-1)
            if a.dtype.kind in "iu" and np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)):
                return f"<{'x'.join(map(str, a.shape))} arange({flat[0]}..{flat[-1]})>"
            return f"<{'x'.join(map(str, a.shape))} {a.dtype} {flat[:3].tolist()}..>"
        return "<dyn>" if name else "<none>"

    vi = _value_infos(shape_model)

    def shape(name):
        v = vi.get(name)
        if v is None:
            return "?"
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in v.type.tensor_type.shape.dim]
        return "x".join(map(str, dims)) or "scalar"

    def dtype(name):
        v = vi.get(name)
        if v is None:
            return "?"
        return onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)

    pats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for n in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        for k, v in list(attrs.items()):
            if isinstance(v, bytes):
                attrs[k] = v.decode()
            elif isinstance(v, list):
                attrs[k] = [x.decode() if isinstance(x, bytes) else x for x in v]
        op = n.op_type
        if op == "Conv":
            w = inits.get(n.input[1])
            k = "x".join(map(str, w.dims[2:])) if w is not None else "?"
            cin = w.dims[1] if w is not None else "?"
            key = (f"k={k} group={attrs.get('group', 1)} dil={attrs.get('dilations')} "
                   f"strides={attrs.get('strides')} pads={attrs.get('pads')} "
                   f"auto_pad={attrs.get('auto_pad', 'NOTSET')} bias={len(n.input) > 2} "
                   f"{'depthwise' if cin == 1 and attrs.get('group', 1) > 1 else ''}").strip()
        elif op == "Resize":
            key = (f"mode={attrs.get('mode', 'nearest')} ctm={attrs.get('coordinate_transformation_mode', 'half_pixel')} "
                   f"nearest_mode={attrs.get('nearest_mode', '-')} cubic={attrs.get('cubic_coeff_a', '-')} "
                   f"roi={cval(n.input[1]) if len(n.input) > 1 else '-'} "
                   f"scales={cval(n.input[2]) if len(n.input) > 2 else '-'} "
                   f"sizes={cval(n.input[3]) if len(n.input) > 3 else '-'} "
                   f"{shape(n.input[0])}->{shape(n.output[0])}")
        elif op == "Pad":
            key = (f"mode={attrs.get('mode', 'constant')} pads={cval(n.input[1])} "
                   f"value={cval(n.input[2]) if len(n.input) > 2 else '-'} "
                   f"axes={cval(n.input[3]) if len(n.input) > 3 else '-'}")
        elif op == "Transpose":
            key = f"perm={attrs.get('perm')} {shape(n.input[0])}"
        elif op in ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Equal", "Less", "Greater",
                    "GreaterOrEqual", "LessOrEqual", "Max", "Min", "Mod"):
            ins = " , ".join(
                f"{shape(i)}:{dtype(i)}" + (f"={cval(i)}" if i in consts and np.asarray(consts[i]).size == 1 else "")
                for i in n.input)
            key = f"{ins} -> {shape(n.output[0])}"
        elif op in ("GatherElements", "GatherND"):
            key = (f"{attrs} data={shape(n.input[0])}:{dtype(n.input[0])} "
                   f"idx={shape(n.input[1])}:{dtype(n.input[1])} -> {shape(n.output[0])}")
        elif op in ("Gather", "Concat", "Softmax", "Flatten", "Split", "Unsqueeze",
                    "Squeeze", "ArgMax", "LogSoftmax"):
            default_axis = {"Gather": 0, "Softmax": -1, "LogSoftmax": -1, "Flatten": 1, "Split": 0}
            if "axis" not in attrs and op in default_axis:
                attrs["axis"] = f"{default_axis[op]}(default)"
            extra = ""
            if op == "Gather":
                extra = f" data={shape(n.input[0])}:{dtype(n.input[0])} idx={shape(n.input[1])}:{dtype(n.input[1])}" \
                        f"{' idx=' + str(cval(n.input[1])) if n.input[1] in consts else ''}"
            if op in ("Unsqueeze", "Squeeze") and len(n.input) > 1:
                extra = f" axes={cval(n.input[1])}"
            if op == "Split" and len(n.input) > 1:
                extra = f" split={cval(n.input[1])}"
            if op == "Concat":
                extra = f" n_in={len(n.input)} out={shape(n.output[0])}:{dtype(n.output[0])}"
            key = f"axis={attrs.get('axis', '-')}{extra}" + (
                f" attrs={ {k: v for k, v in attrs.items() if k != 'axis'} }" if len(attrs) > 1 else "")
        elif op == "Cast":
            key = f"{dtype(n.input[0])}->{onnx.TensorProto.DataType.Name(attrs['to'])}"
        elif op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2"):
            axes = attrs.get("axes", cval(n.input[1]) if len(n.input) > 1 else "<all>")
            key = f"axes={axes} keepdims={attrs.get('keepdims', 1)} {shape(n.input[0])}"
        elif op in ("Reshape", "Expand", "Tile", "Shape", "Range"):
            key = (f"{shape(n.input[0]) if n.input else ''}->{shape(n.output[0])}:{dtype(n.output[0])} "
                   f"{'shape=' + str(cval(n.input[1])) if op in ('Reshape', 'Expand', 'Tile') else ''} "
                   f"{attrs if attrs else ''}").strip()
        elif op in ("Slice",):
            key = (f"starts={cval(n.input[1])} ends={cval(n.input[2])} "
                   f"axes={cval(n.input[3]) if len(n.input) > 3 else '-'} "
                   f"steps={cval(n.input[4]) if len(n.input) > 4 else '-'} {shape(n.input[0])}")
        elif op in ("Gemm", "MatMul"):
            key = f"{shape(n.input[0])} @ {shape(n.input[1])}" + (
                f" bias={len(n.input) > 2} {attrs}" if op == "Gemm" else "")
        elif op in ("Clip",):
            key = f"min={cval(n.input[1]) if len(n.input) > 1 else '-'} max={cval(n.input[2]) if len(n.input) > 2 else '-'}"
        elif op in ("Where",):
            key = (f"cond={shape(n.input[0])} x={shape(n.input[1])}:{dtype(n.input[1])}"
                   f"{'=' + str(cval(n.input[1])) if n.input[1] in consts else ''} y={shape(n.input[2])}"
                   f"{'=' + str(cval(n.input[2])) if n.input[2] in consts else ''} -> {shape(n.output[0])}")
        elif op in ("LayerNormalization", "BatchNormalization", "GlobalAveragePool", "AveragePool",
                    "MaxPool", "Gelu", "Erf", "Equal", "Not", "Trilu"):
            key = f"{attrs} {shape(n.input[0])}"
        elif op == "Constant":
            a = next(iter(n.attribute))
            arr = consts.get(n.output[0])
            key = (f"{a.name}:{'x'.join(map(str, arr.shape)) or 'scalar'}:{arr.dtype}" if arr is not None
                   else f"{a.name}:?")
        elif op == "ConstantOfShape":
            v = numpy_helper.to_array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
            key = f"shape={cval(n.input[0])} value={v.tolist()}:{v.dtype}"
        else:
            key = f"{attrs}" if attrs else ""
            key += f" {shape(n.input[0])}:{dtype(n.input[0])}" if n.input and n.input[0] else ""
            key = key.strip()
        pats[op][key] += 1

    lines = []
    for op in sorted(pats):
        tot = sum(pats[op].values())
        lines.append(f"  {op} ({tot})")
        for key, cnt in sorted(pats[op].items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"      {cnt:4d} x {key}")
    gi = ", ".join(f"{i.name}:{dtype(i.name)}[{shape(i.name)}]" for i in model.graph.input)
    go = ", ".join(f"{o.name}:{dtype(o.name)}[{shape(o.name)}]" for o in model.graph.output)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'}={o.version}" for o in model.opset_import)
    n_init = len(model.graph.initializer)
    n_par = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    return (f"  opset_import: {opsets}; ir_version {model.ir_version}; functions: {len(model.functions)}\n"
            f"  inputs: {gi}\n  outputs: {go}\n  initializers: {n_init} ({n_par} elements)\n"
            f"  nodes: {len(model.graph.node)}, of which {n_foldable} are Constant or compute only from "
            f"constants/static shapes (foldable at compile time; values shown below are folded)\n"
            + "\n".join(lines))


def _value_infos(model) -> dict:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # pragma: no cover
        inferred = model
    out = {}
    for t in inferred.graph.initializer:
        out[t.name] = onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        out[v.name] = v
    return out


def _folded_copy(model, consts: dict):
    """Copy of `model` with compile-time-computable nodes replaced by initializers
    (only used so that shape inference sees static pads/shapes)."""
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = []
    have = {t.name for t in m.graph.initializer}
    for n in m.graph.node:
        if n.output and all(o in consts for o in n.output if o):
            for o in n.output:
                if o and o not in have:
                    m.graph.initializer.append(numpy_helper.from_array(np.asarray(consts[o]), o))
                    have.add(o)
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    del m.graph.value_info[:]
    return m


def _fold_small_constants(model, max_elems: int = 4096) -> tuple[dict, int]:
    """Values of small tensors computable at compile time (Constant nodes, small
    initializers, Shape of statically shaped tensors, and anything computed only from
    those), iterated to a fixpoint with shape inference re-run on the folded graph.
    Returns ({name: ndarray}, number of foldable nodes)."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    consts: dict[str, np.ndarray] = {}
    for t in model.graph.initializer:
        if int(np.prod(t.dims)) <= max_elems:
            consts[t.name] = numpy_helper.to_array(t)
    big_inits = {t.name for t in model.graph.initializer if t.name not in consts}
    folded: set[int] = set()
    for _ in range(8):
        vi = _value_infos(_folded_copy(model, consts) if folded else model)
        before = len(folded)
        for idx, n in enumerate(model.graph.node):
            if idx in folded:
                continue
            ins = [i for i in n.input if i]
            if n.op_type == "Shape":
                v = vi.get(n.input[0])
                dims = [d.dim_value if d.HasField("dim_value") else None
                        for d in v.type.tensor_type.shape.dim] if v is not None else [None]
                if None not in dims:
                    start = end = None
                    for a in n.attribute:
                        if a.name == "start":
                            start = a.i
                        if a.name == "end":
                            end = a.i
                    consts[n.output[0]] = np.array(dims, dtype=np.int64)[start:end]
                    folded.add(idx)
                continue
            if any(i in big_inits for i in ins) or not all(i in consts for i in ins):
                continue
            try:
                if n.op_type == "GatherElements":
                    # onnx.reference's GatherElements mis-handles this case with numpy 2.x
                    # ("cannot reshape array of size 1"); numpy does it directly.
                    axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                    outs = [np.take_along_axis(consts[n.input[0]], consts[n.input[1]], axis=axis)]
                else:
                    outs = ReferenceEvaluator(n).run(None, {i: consts[i] for i in ins})
            except Exception:  # noqa: BLE001
                continue
            folded.add(idx)
            for name, val in zip(n.output, outs):
                if val is not None and np.asarray(val).size <= max_elems:
                    consts[name] = np.asarray(val)
        if len(folded) == before:
            break
    return consts, len(folded)


# --------------------------------------------------------------------------- export


def _files(out: Path, name: str) -> tuple[Path, Path, Path]:
    return out / f"{name}.onnx", out / f"{name}.inputs.npz", out / f"{name}.ref.npz"


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _to_tuple(out) -> tuple:
    if isinstance(out, dict):  # transformers ModelOutput
        return tuple(v for v in out.values() if v is not None)
    if isinstance(out, (list, tuple)):
        return tuple(out)
    return (out,)


class _LogCapture:
    """Swallow (and remember) the exporter's logging so each model prints one line."""

    NAMES = ("torch.onnx", "onnxscript")

    def __enter__(self):
        import logging

        self.records: list = []
        cap = self

        class _H(logging.Handler):
            def emit(self, record):
                cap.records.append(record)

        self._h = _H()
        self._saved = []
        for name in self.NAMES:
            lg = logging.getLogger(name)
            self._saved.append((lg, list(lg.handlers), lg.propagate))
            for h in list(lg.handlers):  # torch.onnx has its own stderr handler
                lg.removeHandler(h)
            lg.addHandler(self._h)
            lg.propagate = False
        return self

    def __exit__(self, *exc):
        for lg, handlers, prop in self._saved:
            lg.removeHandler(self._h)
            for h in handlers:
                lg.addHandler(h)
            lg.propagate = prop
        return False

    def version_conversion_error(self) -> str:
        for r in self.records:
            if r.exc_info and r.exc_info[1] is not None:
                msg = str(r.exc_info[1]).strip().splitlines()[-1]
                return msg.split("failed: ")[-1]
        return ""


def _export(model, kwargs, output_names, path: Path, opset: int) -> tuple[str, str]:
    """torch.onnx.export with the default (dynamo) exporter; TorchScript only as fallback.

    Returns (exporter used, reason for falling back or "").
    """
    import onnx
    import torch

    reason = ""
    try:
        # What users get by default in torch 2.13: dynamo=True (torch.export + onnxscript).
        # It builds the graph at opset 18 and down-converts to the requested opset with
        # onnxscript's/onnx's version converter *before* its optimizer runs.
        # external_data=False: keep weights inside the single .onnx (all models << 2 GB).
        with _LogCapture() as cap:
            torch.onnx.export(
                model,
                (),
                str(path),
                kwargs=kwargs,
                output_names=output_names,
                opset_version=opset,
                external_data=False,
                verbose=False,
            )
        got = {o.domain: o.version for o in onnx.load(str(path), load_external_data=False).opset_import}.get("")
        if got == opset:
            return "dynamo", ""
        # The dynamo exporter does not raise when down-conversion fails: it logs the error
        # and silently keeps opset 18.  With torch 2.13 / onnx 1.23 this happens for every
        # model containing aten::constant_pad_nd (onnx has no Pad 18->17 adapter), i.e.
        # mobilenet_v2, deeplabv3 (TF "SAME" padding) and mobilebert (trigram embedding).
        # We treat that as an export failure and fall back to dynamo=False below.
        reason = (f"dynamo exporter left the model at opset {got} "
                  f"({cap.version_conversion_error() or 'version conversion failed'})")
    except Exception as exc:  # noqa: BLE001
        reason = f"dynamo export raised {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
    for stale in (path, Path(str(path) + ".data")):
        if stale.exists():
            stale.unlink()

    # Fallback: legacy TorchScript exporter (torch.jit.trace based), opset 17 natively.
    # HF models return a ModelOutput dict; trace a thin wrapper that returns a tuple.
    class _TupleOut(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            return _to_tuple(self.m(**dict(zip(kwargs.keys(), args))))

    with _LogCapture():
        torch.onnx.export(
            _TupleOut(model),
            tuple(kwargs.values()),
            str(path),
            input_names=list(kwargs.keys()),
            output_names=output_names,
            opset_version=opset,
            dynamo=False,
        )
    return "torchscript", reason


def export_one(name: str, out: Path, opset: int = OPSET, do_describe: bool = False) -> None:
    import onnx
    import onnxruntime as ort

    onnx_path, in_path, ref_path = _files(out, name)
    if onnx_path.exists() and in_path.exists() and ref_path.exists():
        model = onnx.load(str(onnx_path))
        got = {o.domain: o.version for o in model.opset_import}.get("")
        if got != opset:
            print(f"{name}: cached files are opset {got}, re-exporting at opset {opset}", flush=True)
        else:
            print(f"{name}: cached size={onnx_path.stat().st_size / 2**20:.2f}MiB "
                  f"nodes={len(model.graph.node)} ops[{format_census(op_census(model))}]", flush=True)
            if do_describe:
                print(describe(model), flush=True)
            return

    import torch

    t0 = time.perf_counter()
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    model, make_inputs, output_names = MODELS[name]()
    _randomize_norms(model, SEED + 1)
    _randomize_biases(model, SEED + 2)
    model.eval()
    rng = np.random.default_rng(SEED)
    inputs_np = make_inputs(rng)
    inputs_pt = {k: torch.from_numpy(v) for k, v in inputs_np.items()}
    with torch.no_grad():
        eager = _to_tuple(model(**inputs_pt))
    eager = [t.detach().numpy() for t in eager]

    tmp_onnx = onnx_path.with_name(onnx_path.name + ".tmp.onnx")
    for stale in (tmp_onnx, Path(str(tmp_onnx) + ".data")):
        if stale.exists():
            stale.unlink()
    t_exp = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            exporter, fallback_reason = _export(model, inputs_pt, output_names, tmp_onnx, opset)
    export_s = time.perf_counter() - t_exp

    # Guarantee a single self-contained file (the TorchScript fallback or a >2 GB
    # model would otherwise leave external data next to it).
    if Path(str(tmp_onnx) + ".data").exists() or any(
        t.data_location == onnx.TensorProto.EXTERNAL for t in onnx.load(str(tmp_onnx), load_external_data=False).graph.initializer
    ):
        m = onnx.load(str(tmp_onnx))
        onnx.save(m, str(tmp_onnx), save_as_external_data=False)
        data = Path(str(tmp_onnx) + ".data")
        if data.exists():
            data.unlink()

    model_proto = onnx.load(str(tmp_onnx))
    onnx.checker.check_model(model_proto)
    ver = {o.domain: o.version for o in model_proto.opset_import}.get("", None)
    if ver != opset:
        raise RuntimeError(f"{name}: exported ai.onnx opset {ver}, expected {opset}")
    onnx_in = [i.name for i in model_proto.graph.input]
    if sorted(onnx_in) != sorted(inputs_np):
        raise RuntimeError(f"{name}: ONNX inputs {onnx_in} != sample inputs {list(inputs_np)}")
    onnx_out = [o.name for o in model_proto.graph.output]

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1  # deterministic reductions
    sess = ort.InferenceSession(str(tmp_onnx), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {k: inputs_np[k] for k in onnx_in})
    for o, r in zip(onnx_out, ref):
        if not np.all(np.isfinite(r)):
            raise RuntimeError(f"{name}: non-finite onnxruntime output {o}")
    diffs = [float(np.max(np.abs(r - e))) for r, e in zip(ref, eager)]
    if len(ref) != len(eager) or max(diffs) > 1e-3 * max(1.0, max(float(np.max(np.abs(e))) for e in eager)):
        raise RuntimeError(f"{name}: onnxruntime vs torch mismatch {diffs}")

    os.replace(tmp_onnx, onnx_path)
    _save_npz(in_path, {k: inputs_np[k] for k in onnx_in})
    _save_npz(ref_path, dict(zip(onnx_out, ref)))  # written last = completion marker

    total_s = time.perf_counter() - t0
    shapes = " ".join(f"{o}{list(r.shape)}" for o, r in zip(onnx_out, ref))
    if fallback_reason:
        exporter += f" (fallback: {fallback_reason})"
    print(f"{name}: exporter={exporter} export={export_s:.1f}s total={total_s:.1f}s "
          f"size={onnx_path.stat().st_size / 2**20:.2f}MiB nodes={len(model_proto.graph.node)} "
          f"out={shapes} max|ort-torch|={max(diffs):.2e} "
          f"ops[{format_census(op_census(model_proto))}]", flush=True)
    if do_describe:
        print(describe(model_proto), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--only", nargs="+", choices=sorted(MODELS), metavar="NAME",
                    help=f"subset of models ({', '.join(MODELS)})")
    ap.add_argument("--opset", type=int, default=OPSET,
                    help=f"ai.onnx opset to request (default {OPSET}; 18 keeps every model on the dynamo exporter)")
    ap.add_argument("--describe", action="store_true",
                    help="also print per-op attribute patterns (for the compiler team)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or list(MODELS):
        export_one(name, args.out, args.opset, args.describe)
    return 0


if __name__ == "__main__":
    sys.exit(main())
