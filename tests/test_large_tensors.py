"""Constants larger than one binding (compiler/passes.py, split_large_constants): GPT-2's token
embedding (50,257 x 768 f32, 154 MB) and VGG's fc6 (411 MB) exceed WebGPU's default
maxStorageBufferBindingSize (128 MiB). Such a constant is cut into parts along its first axis:
a Gather or an elementwise op selects the part by index, a MatMul runs once per part of B's
columns and a concatenation joins the outputs. Each case is compared with onnxruntime.

The small cases build with a binding limit of 128 KiB, so that a 300 KB embedding takes three
parts; the slow one carries a 139 MB embedding under the default limits.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import webiree
from webiree.compiler.driver import compile_model

from .conftest import assert_close, ort_run

SMALL_BINDING = {"max_storage_buffer_binding_size": 128 << 10}


def tied_lm(vocab: int, dim: int, seq: int = 8, seed: int = 0, transpose: bool = True):
    """A token embedding read three ways: Gather (the input embedding), MatMul by its transpose
    (a tied LM head: B stored [K, N] once the Transpose is folded; `transpose`) and Gemm with
    transB (B stored [N, K]), whose output an Add of a bias (small enough for one binding) reads."""
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((vocab, dim)).astype(np.float32)
    bias = rng.standard_normal((seq, vocab)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"], axis=0),
             helper.make_node("Tanh", ["h"], ["t"]),
             helper.make_node("Transpose", ["emb"], ["emb_t"], perm=[1, 0]),
             helper.make_node("MatMul", ["t", "emb_t"], ["tied"]),
             helper.make_node("Reshape", ["t", "flat"], ["t2"]),
             helper.make_node("Gemm", ["t2", "emb"], ["g"], transB=1, alpha=0.5),
             helper.make_node("Add", ["g", "bias"], ["gemm"])]
    outputs = [helper.make_tensor_value_info("h", T.FLOAT, [1, seq, dim]),
               helper.make_tensor_value_info("tied", T.FLOAT, [1, seq, vocab]),
               helper.make_tensor_value_info("gemm", T.FLOAT, [seq, vocab])]
    if not transpose:
        nodes = [n for n in nodes if n.op_type not in ("Transpose", "MatMul")]
        outputs = [o for o in outputs if o.name != "tied"]
    graph = helper.make_graph(
        nodes, "tied_lm", [helper.make_tensor_value_info("ids", T.INT64, [1, seq])], outputs,
        [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(bias, "bias"),
         numpy_helper.from_array(np.array([seq, dim], np.int64), "flat")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _feeds(vocab: int, seq: int = 8, rows: tuple = ()):
    """Seeded ids, the first ones `rows` (both ends of the table and its parts' boundaries)."""
    ids = np.random.default_rng(1).integers(0, vocab, (1, seq)).astype(np.int64)
    ids[0, :len(rows)] = rows
    return {"ids": ids}


def _parts(res) -> dict[str, list]:
    """Constant -> the shapes of its parts, as the compiled program holds them."""
    out: dict[str, list] = {}
    for name, t in res.program.tensors.items():
        if ":part" in name:
            out.setdefault(name.split(":part")[0], []).append(tuple(t.shape))
    return out


def test_an_embedding_larger_than_a_binding_is_read_in_parts(tmp_path):
    vocab, dim = 1200, 64      # 307,200 bytes of f32
    model = tied_lm(vocab, dim)
    res = webiree.compile(model, tmp_path / "m", limits=SMALL_BINDING)
    parts = _parts(res)
    # the embedding (Gather and Gemm: rows) and the folded transpose (MatMul: columns) in three parts each;
    # the bias (38,400 bytes) fits and stays whole
    assert sorted(len(v) for v in parts.values()) == [3, 3], parts
    assert all(4 * int(np.prod(s)) <= SMALL_BINDING["max_storage_buffer_binding_size"] for v in parts.values() for s in v)
    feeds = _feeds(vocab, rows=(0, 511, 512, 1023, 1024, vocab - 1))   # parts of 512 rows (131,072 B)
    ref = ort_run(model, feeds)
    got = webiree.InferenceSession(tmp_path / "m").run(None, feeds)
    assert len(got) == len(ref) == 3
    for name, g, r in zip(("h", "tied", "gemm"), got, ref, strict=True):
        assert_close(g, r, name=name, elementwise=True)


def _conv(w: np.ndarray, group: int = 1, bias: bool = False):
    c = w.shape[1] * group
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], pads=[1, 1, 1, 1], group=group),
             helper.make_node("Relu", ["c"], ["y"])]
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        inits.append(numpy_helper.from_array(np.random.default_rng(1).standard_normal(w.shape[0]).astype(np.float32), "b"))
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", T.FLOAT, [2, c, 8, 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, w.shape[0], 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_a_convolution_weight_larger_than_a_binding_is_read_in_parts(tmp_path):
    """256 x 64 x 3 x 3 f32 (589,824 bytes) over a 128 KiB binding: one convolution per part of the
    output channels (56 a part: 129,024 bytes), their outputs written side by side; bias and ReLU
    stay fused in the concatenation's reader. Equal to onnxruntime, the channels at the parts'
    boundaries included."""
    w = np.random.default_rng(0).standard_normal((256, 64, 3, 3)).astype(np.float32)
    model = _conv(w, bias=True)
    res = webiree.compile(model, tmp_path / "m", limits=SMALL_BINDING)
    assert _parts(res) == {"w": [(56 * 64 * 9,)] * 4 + [(32 * 64 * 9,)]}, _parts(res)
    assert sum(d.kind == "conv" for d in res.dispatches) == 5
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 64, 8, 8)).astype(np.float32)}
    (got,) = webiree.InferenceSession(tmp_path / "m").run(None, feeds)
    assert_close(got, ort_run(model, feeds)[0], name="y", elementwise=True)


def test_a_constant_read_another_way_is_refused_naming_the_limit():
    """A grouped convolution's weight is not read in parts: the planner's error names the tensor and
    the limit."""
    w = np.random.default_rng(0).standard_normal((512, 32, 3, 3)).astype(np.float32)   # 589,824 bytes
    with pytest.raises(webiree.WebireeError, match=r"'w'.*maxStorageBufferBindingSize of 131072"):
        compile_model(_conv(w, group=2), target=SMALL_BINDING)


@pytest.mark.slow
def test_a_139_mb_embedding_runs_under_the_default_limits(tmp_path):
    """34,000 x 1,024 f32 (139 MB) over the default 128 MiB binding: two parts, shared by the Gather
    and the Gemm (its rows are theirs), so weights.bin holds the embedding once. (A Transpose of it
    would be refused: webiree folds at most 32 Mi elements at build.)"""
    vocab, dim = 34000, 1024
    model = tied_lm(vocab, dim, seq=4, transpose=False)
    res = webiree.compile(model, tmp_path / "m", limits="cpu")
    assert [len(v) for v in _parts(res).values()] == [2], _parts(res)
    assert vocab * dim * 4 <= (tmp_path / "m" / "weights.bin").stat().st_size < vocab * dim * 4 + (1 << 20)
    feeds = _feeds(vocab, seq=4, rows=(0, 32767, 32768, vocab - 1))   # parts of 32,768 rows (128 MiB)
    ref = ort_run(model, feeds)
    got = webiree.InferenceSession(tmp_path / "m").run(None, feeds)
    assert len(got) == len(ref) == 2
    for name, g, r in zip(("h", "gemm"), got, ref, strict=True):
        assert_close(g, r, name=name, elementwise=True)
