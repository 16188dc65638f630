"""float16 / bfloat16 tensors computed in f32 (issue #17, first step; dtypes.py `rounded`).

Every value the graph holds as float16 / bfloat16 is stored as f32 and rounded to its type where
it is produced (kir `round_f16` / `round_bf16`, written in integer ops by wgsl_codegen/legalize.py
for WGSL and SPIR-V alike); inputs widen and outputs narrow exactly at the boundary.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from webiree.ir import kir
from webiree.testing.models import IR_VERSION
from webiree.wgsl_codegen import legalize

from .conftest import compile_and_run, ort_run


def model_of(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


# values that round differently under truncation / ties-away / flush-to-zero, ties either way,
# overflow to inf, f16 subnormals, signed zeros, NaN and inf
def probe_values() -> np.ndarray:
    h = np.float16
    vals = [0.0, -0.0, 1.0, -1.0, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, 1.0 + 2 ** -11 + 2 ** -20,   # ties to even / above
            1.0 - 2 ** -12, 65504.0, 65519.99, 65520.0, -65520.0, 70000.0, 1e30, -1e30,   # max, overflow
            2 ** -14, 2 ** -14 - 2 ** -26, 2 ** -24, 2 ** -25, 2 ** -25 + 2 ** -40, 3 * 2 ** -25,  # subnormals
            -(2 ** -24) * 1.5, 2 ** -26, 1e-30, 1e-45, 0.1, -0.3, 3.14159265, 12345.678, 2049.0, 2051.0,
            np.inf, -np.inf, np.nan]
    rng = np.random.default_rng(0)
    scaled = (rng.standard_normal(200) * 10.0 ** rng.integers(-9, 6, 200)).astype(np.float32)
    bits = rng.integers(0, 2 ** 32, 200, dtype=np.uint32).view(np.float32)    # any f32, NaNs included
    # every half-way point between two f16 subnormals (and the largest subnormal and 2^-14), the f32
    # values either side of each, both signs
    ties = ((np.arange(1025) + 0.5) * 2.0 ** -24).astype(np.float32)
    near = np.concatenate([ties, np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(1))])
    del h
    return np.concatenate([np.array(vals, np.float32), scaled, bits, near, -near])


def bf16_reference_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even on the upper 16 bits, by hand; NaN stays NaN (quiet)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def same_bits_f32(got, want):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_dtype_table():
    from webiree import dtypes
    assert dtypes.storage_of(T.FLOAT16) == dtypes.storage_of(T.BFLOAT16) == "f32"
    assert dtypes.rounded_of(T.FLOAT16) == "f16" and dtypes.rounded_of(T.BFLOAT16) == "bf16"
    assert dtypes.rounded_of(T.FLOAT) is None


def _f16_reference(x):
    with np.errstate(over="ignore"):
        return x.astype(np.float16).astype(np.float32)


def _bf16_reference(x):
    return (bf16_reference_bits(x).astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("to,reference", [(T.FLOAT16, _f16_reference), (T.BFLOAT16, _bf16_reference)],
                         ids=["float16 like numpy", "bfloat16 to nearest even"])
def test_cast_through_a_narrow_float_rounds_like_the_reference(tmp_path, to, reference):
    """float -> narrow -> float gives the reference's bits (numpy's float16; bfloat16 bits by
    hand) and onnxruntime's, on ties, near-ties, overflow, subnormals, +-0, inf and NaN."""
    x = probe_values()
    m = model_of([helper.make_node("Cast", ["x"], ["h"], to=to), helper.make_node("Cast", ["h"], ["y"], to=T.FLOAT)],
                 [vi("x", T.FLOAT, [x.size])], [vi("y", T.FLOAT, [x.size])])
    (got,), _, _ = compile_and_run(m, {"x": x}, tmp_path)
    same_bits_f32(got, reference(x))
    (ref,) = ort_run(m, {"x": x})
    same_bits_f32(got, ref)


def test_bfloat16_output_and_input(tmp_path):
    """bf16 at the boundary: ml_dtypes.bfloat16 arrays (or their uint16 bits) in and out."""
    x = probe_values()
    m = model_of([helper.make_node("Cast", ["x"], ["h"], to=T.BFLOAT16),
                  helper.make_node("Mul", ["h", "b"], ["y"])],
                 [vi("x", T.FLOAT, [x.size]), vi("b", T.BFLOAT16, [x.size])], [vi("y", T.BFLOAT16, [x.size])])
    b = np.full(x.size, 1.5, ml_dtypes.bfloat16)
    (got,), _, sess = compile_and_run(m, {"x": x, "b": b}, tmp_path)
    assert got.dtype == ml_dtypes.bfloat16
    hx = (bf16_reference_bits(x).astype(np.uint32) << 16).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = bf16_reference_bits(hx * np.float32(1.5))
    np.testing.assert_array_equal(got.view(np.uint16)[~np.isnan(hx)], want[~np.isnan(hx)])
    assert np.isnan(got.astype(np.float32)[np.isnan(hx)]).all()
    (again,) = sess.run(None, {"x": x, "b": b.view(np.uint16)})
    np.testing.assert_array_equal(again.view(np.uint16), got.view(np.uint16))


def test_float16_model_matches_onnxruntime(tmp_path):
    """float16 input and output, f16 initializers: MatMul + Add + Relu + Softmax in f16."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((32, 16)) * 0.3).astype(np.float16)
    bias = (rng.standard_normal(16) * 0.1).astype(np.float16)
    m = model_of([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "bias"], ["a"]),
                  helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)],
                 [vi("x", T.FLOAT16, [4, 32])], [vi("y", T.FLOAT16, [4, 16])],
                 [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")])
    x = rng.standard_normal((4, 32)).astype(np.float16)
    (got,), res, _ = compile_and_run(m, {"x": x}, tmp_path)
    (ref,) = ort_run(m, {"x": x})
    assert got.dtype == np.float16 and got.shape == ref.shape
    # each op's result is rounded to f16 as onnxruntime rounds it: a few f16 ulps at most
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=4e-3, atol=1e-4)
    # every value is an f16 value: widening and narrowing round-trip
    assert np.array_equal(got.astype(np.float32).astype(np.float16), got)


def test_float16_add_rounds_result(tmp_path):
    """An Add of two float16 tensors: computed in f32, the result rounded to f16 (bit-exact)."""
    rng = np.random.default_rng(2)
    a = (rng.standard_normal(512) * 100).astype(np.float16)
    b = (rng.standard_normal(512) * 0.01).astype(np.float16)
    m = model_of([helper.make_node("Add", ["a", "b"], ["y"])],
                 [vi("a", T.FLOAT16, [512]), vi("b", T.FLOAT16, [512])], [vi("y", T.FLOAT16, [512])])
    (got,), _, _ = compile_and_run(m, {"a": a, "b": b}, tmp_path)
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    (ref,) = ort_run(m, {"a": a, "b": b})
    np.testing.assert_array_equal(got.view(np.uint16), ref.view(np.uint16))


@pytest.mark.parametrize("fn", ["round_f16", "round_bf16"])
def test_rounding_is_legalized_for_both_renderers(fn):
    """SPIR-V gets the rule inline; WGSL calls a helper function whose body is the same rule,
    rendered once per shader (a half model rounds every result)."""
    from webiree.wgsl_codegen import spirv, wgsl
    x = kir.var("x", "f32")
    e = kir.unary(fn, x)
    assert legalize.feature(e) == fn
    assert fn not in spirv.SUPPORTS
    k = kir.Kernel("k", [kir.Binding(0, "b0", "f32", writes=True)], (1, 1, 1),
                   [kir.Store("b0", kir.i32(0), kir.unary(fn, kir.load("b0", kir.i32(1), "f32"))),
                    kir.Store("b0", kir.i32(2), kir.unary(fn, kir.load("b0", kir.i32(3), "f32")))], [])
    text = wgsl.render(legalize.legalize(k, wgsl.SUPPORTS))
    assert text.count(f"fn wi_{fn}(x: f32) -> f32") == 1 and text.count(f"wi_{fn}(b0[") == 2
    assert "bitcast<u32>(x)" in text          # the helper's body is the bit-level rule


def test_half_models_parallel_projections_are_one_product(tmp_path):
    """onnxruntime's float16 converter (fp32 I/O) on BERT's self-attention: the Q, K and V products
    each round their sums to f16, an epilogue they share, so they still combine into one product
    (passes.combine_parallel_matmuls) that rounds alike: the f32 block's three dispatches, and
    the result within the half model's tolerance of onnxruntime's."""
    from webiree.testing.models import float16_model

    from .test_pipeline import _attention_block

    model = float16_model(_attention_block(), keep_io_types=True)
    x = np.random.default_rng(9).standard_normal((1, 8, 16)).astype(np.float32)
    (got,), res, _ = compile_and_run(model, {"x": x}, tmp_path)
    (ref,) = ort_run(model, {"x": x})
    assert [d.kind for d in res.dispatches] == ["matmul", "attention", "generic"], \
        [(d.kind, d.nodes) for d in res.dispatches]
    assert len([n for n in res.dispatches[0].nodes if n.startswith("MatMul")]) == 3, res.dispatches[0].nodes
    combined = [t for t in res.program.tensors.values() if t.name.endswith(":combined") and t.kind != "const"]
    assert [t.rounded for t in combined] == ["f16"]
    assert got.shape == ref.shape == (1, 8, 16)
    np.testing.assert_allclose(got, ref, rtol=0, atol=4 * 2.0 ** -10 * float(np.abs(ref).max()))
