"""compiler/onnx_file.py: an .onnx file opened without its weights in memory. The large
raw_data fields become references into the file, which numpy maps; what the proto keeps must be
exactly what onnx.load reads, and a bad reference is one clear ModelError."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import webiree
from webiree.compiler import onnx_file
from webiree.compiler.importer import open_model, tensor_array
from webiree.ir.mapped import release


def _model(big: np.ndarray, small: np.ndarray, half: np.ndarray):
    nodes = [helper.make_node("MatMul", ["x", "big"], ["h"]), helper.make_node("Add", ["h", "small"], ["a"]),
             helper.make_node("Cast", ["half"], ["hf"], to=T.FLOAT), helper.make_node("Add", ["a", "hf"], ["y"])]
    graph = helper.make_graph(nodes, "file", [helper.make_tensor_value_info("x", T.FLOAT, [2, big.shape[0]])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, big.shape[1]])],
                              [numpy_helper.from_array(big, "big"), numpy_helper.from_array(small, "small"),
                               numpy_helper.from_array(half, "half")],
                              doc_string="kept")
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10,
                             producer_name="test_onnx_file")


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((128, 256)).astype(np.float32),      # 131,072 bytes: mapped
            rng.standard_normal(256).astype(np.float32),             # 1 KiB: stays in the proto
            rng.standard_normal((2, 256)).astype(np.float16))


def test_large_raw_data_is_mapped_and_the_rest_is_kept(tmp_path):
    big, small, half = _arrays()
    path = tmp_path / "m.onnx"
    onnx.save(_model(big, small, half), path)
    proto, base = open_model(path)
    assert base == tmp_path
    inits = {t.name: t for t in proto.graph.initializer}
    assert inits["big"].data_location == T.EXTERNAL and not inits["big"].raw_data
    assert {e.key: e.value for e in inits["big"].external_data}["location"] == "m.onnx"
    assert inits["small"].data_location == T.DEFAULT
    # everything but the mapped field reads as onnx.load reads it
    full = onnx.load(path)
    assert proto.graph.doc_string == "kept" and proto.producer_name == "test_onnx_file"
    assert [n.SerializeToString() for n in proto.graph.node] == [n.SerializeToString() for n in full.graph.node]
    for name, want in (("big", big), ("small", small), ("half", half)):
        got = tensor_array(inits[name], base)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    mapped = tensor_array(inits["big"], base)
    assert isinstance(mapped, np.memmap)
    release(mapped[3:5])                  # pages handed back are read again from the file
    np.testing.assert_array_equal(mapped, big)


def test_a_mapped_model_builds_and_matches_onnxruntime(tmp_path):
    from .conftest import assert_close, ort_run

    big, small, half = _arrays(1)
    model = _model(big, small, half)
    onnx.save(model, tmp_path / "m.onnx")
    res = webiree.compile(tmp_path / "m.onnx", tmp_path / "site")
    assert res.manifest["sizes"]["weights_bytes"] >= big.nbytes
    x = np.random.default_rng(2).standard_normal((2, 128)).astype(np.float32)
    (got,) = webiree.InferenceSession(tmp_path / "site").run(None, {"x": x})
    (ref,) = ort_run(model, {"x": x})
    assert_close(got, ref)


def test_a_wrong_reference_is_one_model_error(tmp_path):
    big, small, half = _arrays()
    path = tmp_path / "m.onnx"
    onnx.save(_model(big, small, half), path)
    proto, base = open_model(path)
    t = next(t for t in proto.graph.initializer if t.name == "big")
    for e in t.external_data:
        if e.key == "offset":
            e.value = str(path.stat().st_size - 100)      # runs past the end of the file
    with pytest.raises(webiree.ModelError, match=r"initializer 'big' is corrupt: 131072 bytes at offset"):
        tensor_array(t, base)


def test_a_truncated_file_is_one_model_error(tmp_path):
    big, small, half = _arrays()
    path = tmp_path / "m.onnx"
    onnx.save(_model(big, small, half), path)
    path.write_bytes(path.read_bytes()[:50_000])         # cut inside the big tensor's raw_data
    with pytest.raises(webiree.ModelError, match="m.onnx is not an ONNX model"):
        webiree.compile(path, tmp_path / "site")


def test_varints_round_trip():
    for v in (0, 1, 127, 128, 300, 1 << 31, (1 << 63) - 1):
        enc = onnx_file._encode_varint(v)
        assert onnx_file._varint(enc, 0) == (v, len(enc))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_released_pages_leave_the_resident_set(tmp_path):
    """release() hands a mapped constant's pages back: after reading 64 MiB of weights, the
    process holds them; released, it does not (and the values read again are the same)."""
    w = np.arange(16 << 20, dtype=np.float32)            # 64 MiB
    path = tmp_path / "w.onnx"
    onnx.save(_model(w.reshape(4096, 4096), *_arrays()[1:]), path)
    proto, base = open_model(path)
    mapped = tensor_array(next(t for t in proto.graph.initializer if t.name == "big"), base)
    before = _rss()
    assert float(mapped.sum(dtype=np.float64)) == float(w.sum(dtype=np.float64))
    touched = _rss()
    release(mapped)
    released = _rss()
    assert touched - before > 48 << 20, (before, touched)
    assert touched - released > 48 << 20, (touched, released)
    np.testing.assert_array_equal(mapped[-1], w.reshape(4096, 4096)[-1])
