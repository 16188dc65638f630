"""8-bit quantization ops at sizes the conformance cases do not reach (compiler/ops/quant.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

from webiree.compiler.ops.quant import SPLIT_FROM
from webiree.testing.models import IR_VERSION

from .conftest import compile_and_run, ort_run


@pytest.mark.parametrize("n", [1000, SPLIT_FROM + 1, 3 * SPLIT_FROM + 17],
                         ids=["one step", "two steps, ragged", "two steps, long"])
def test_dynamic_quantize_linear_of_a_long_input(tmp_path, n):
    """The range of a long input is reduced in slices then over the slices (+inf filling the last
    slice's tail): y, y_scale and y_zero_point equal onnxruntime's, with the extremes anywhere."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    x[-1], x[n // 3] = 9.5, -7.25          # the maximum in the tail, the minimum inside
    g = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", T.UINT8, [n]), helper.make_tensor_value_info("s", T.FLOAT, []),
                           helper.make_tensor_value_info("z", T.UINT8, [])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    got, res, _ = compile_and_run(m, {"x": x}, tmp_path)
    ref = ort_run(m, {"x": x})
    assert len(got) == 3
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[2], ref[2])
    np.testing.assert_array_equal(got[0], ref[0])
    reduces = [d for d in res.dispatches if d.kind == "reduce"]
    assert len(reduces) == (1 if n < SPLIT_FROM else 2)


def test_dynamic_quantization_shared_by_three_products_is_not_stored(tmp_path):
    """What quantize_dynamic writes for attention's Q, K and V: one DynamicQuantizeLinear read by
    three MatMulIntegers, each dequantized (Cast, scale products) with a bias. The quantized
    activation and its scale are computed inside each product's loads, the dequantization is
    each product's epilogue: the range's reduction (one step: a short input) and three products."""
    rng = np.random.default_rng(7)
    m_, k, n = 64, 48, 32
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"])]
    inits = []
    for i in range(3):
        w = rng.integers(-127, 128, size=(k, n)).astype(np.int8)
        inits += [helper.make_tensor(f"w{i}", T.INT8, [k, n], w.tobytes(), raw=True),
                  helper.make_tensor(f"ws{i}", T.FLOAT, [], [float(0.01 * (i + 1))]),
                  helper.make_tensor(f"b{i}", T.FLOAT, [n], rng.standard_normal(n).astype(np.float32).tolist())]
        nodes += [helper.make_node("MatMulInteger", ["xq", f"w{i}", "xz"], [f"p{i}"]),
                  helper.make_node("Cast", [f"p{i}"], [f"pf{i}"], to=T.FLOAT),
                  helper.make_node("Mul", ["xs", f"ws{i}"], [f"s{i}"]),
                  helper.make_node("Mul", [f"pf{i}", f"s{i}"], [f"d{i}"]),
                  helper.make_node("Add", [f"d{i}", f"b{i}"], [f"y{i}"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [m_, k])],
                          [helper.make_tensor_value_info(f"y{i}", T.FLOAT, [m_, n]) for i in range(3)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    x = rng.standard_normal((m_, k)).astype(np.float32)
    got, res, _ = compile_and_run(m, {"x": x}, tmp_path)
    ref = ort_run(m, {"x": x})
    assert len(got) == 3
    for g_, r in zip(got, ref):
        np.testing.assert_allclose(g_, r, rtol=1e-5, atol=1e-5 * float(np.abs(r).max()))
    assert [d.kind for d in res.dispatches] == ["reduce", "matmul", "matmul", "matmul"], \
        [(d.kind, d.nodes) for d in res.dispatches]


@pytest.mark.parametrize("opset", [13, 21])
def test_qdq_pad_folds_into_the_conv(tmp_path, opset):
    """Pad (zeros) -> QuantizeLinear -> DequantizeLinear -> Conv, as quantize_static writes a padded
    convolution: the QDQ pair maps 0 to 0, so it runs before the pad (passes.sink_zero_pads) and the
    pad becomes the convolution's own (one dispatch); the pad value's own Q/DQ folds at opset 13 too
    (onnx.reference implements DequantizeLinear from 19 on). Equal to onnxruntime."""
    from onnx import numpy_helper
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.02, np.float32), "s"),
             numpy_helper.from_array(np.array(3, np.int8), "z"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero")]
    nodes = [helper.make_node("QuantizeLinear", ["zero", "s", "z"], ["zq"]),
             helper.make_node("DequantizeLinear", ["zq", "s", "z"], ["zdq"]),
             helper.make_node("Pad", ["x", "pads", "zdq"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["pdq"]),
             helper.make_node("Conv", ["pdq", "w"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    (got,), res, _ = compile_and_run(m, {"x": x}, tmp_path)
    (ref,) = ort_run(m, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert [d.kind for d in res.dispatches] == ["conv"], [d.kind for d in res.dispatches]
