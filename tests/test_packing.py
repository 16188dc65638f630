"""Narrow storage of constants (ir/packing.py, issue #17 item 1): weights keep the size they were
shipped in, kernels decode them where they load them.

Each form is checked end to end: a constant holding the form's edge values (for halves: subnormals,
the largest half, infinities, signed zeros, NaN) goes through a kernel bit for bit, through the WGSL
renderer (unpack2x16float) and through SPIR-V (the legalized integer decode), and weights.bin holds
it at the form's width.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from webiree.ir import packing
from webiree.testing.models import IR_VERSION

from .conftest import compile_and_run, ort_run


def _identity_of_const(value: np.ndarray, onnx_type: int):
    """y = c + x (x zeros of c's shape, -0.0 for floats: c + -0.0 is c, signed zeros too): the
    constant read by a kernel."""
    c = numpy_helper.from_array(value, "c")
    g = helper.make_graph([helper.make_node("Add", ["c", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx_type, list(value.shape))],
                          [helper.make_tensor_value_info("y", onnx_type, list(value.shape))], [c])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def _halves():
    h = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, -65504.0, 6.1035e-05, 6e-8, -6e-8, 3e-6, 1e-4,
                  np.inf, -np.inf, 0.1, 1024.5, 2049.0], np.float16)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 16, 47, dtype=np.uint16).view(np.float16)   # any half, subnormals included
    return np.concatenate([h, bits[np.isfinite(bits)]])


def _bfloat16s():
    v = np.array([1e30, -1e-30, 3.0e38, 1.0, -0.0, 0.0, np.inf, -np.inf, 65536.0 * 3] * 3, np.float32)
    return v.astype(ml_dtypes.bfloat16)


CASES = {   # form -> (constant, its ONNX type); odd lengths leave the last word partly filled
    "f16": (_halves(), T.FLOAT16),
    "bf16": (_bfloat16s(), T.BFLOAT16),
    "i8": (np.array(list(range(-128, 128, 7)) + [127, -128, 0], np.int32), T.INT32),
    "u8": (np.array(list(range(0, 256, 9)) + [255, 0, 128], np.int32), T.INT32),
    "i4": (np.array(list(range(-8, 8)) * 2 + [7], np.int32), T.INT32),
    "u4": (np.array(list(range(16)) * 2 + [15], np.int32), T.INT32),
    "i16": (np.array([-32768, 32767, -1, 0, 1, 300, -300] * 3, np.int32), T.INT32),
    "u16": (np.array([65535, 0, 1, 256, 40000] * 4, np.int32), T.INT32),
}


@pytest.mark.parametrize("target", ["wgsl", "spirv"])
@pytest.mark.parametrize("where", ["own binding", "constant table"])
@pytest.mark.parametrize("form", sorted(CASES))
def test_each_form_round_trips_through_a_kernel(tmp_path, form, where, target):
    """A constant of 256 bytes or more has its own binding; a smaller one lives in the constant
    table (compiler/memory.py) with the other small constants."""
    value, onnx_type = CASES[form]
    if where == "own binding":
        value = np.concatenate([value] * (1 + 2048 // (value.size * packing.PACKS[form].bits)))
    model = _identity_of_const(value, onnx_type)
    zeros = np.zeros_like(value) if value.dtype.kind in "iu" else np.full_like(value, -0.0)
    (got,), res, _ = compile_and_run(model, {"x": zeros}, tmp_path, targets=target)
    t = res.program.tensors["c"]
    assert t.pack == form and (t.table_word is None) == (where == "own binding")
    assert len([b for b in res.module.buffers if b.kind == "weights"]) == 1
    assert len(res.weights) == 4 * -(-value.size * packing.PACKS[form].bits // 32)
    if form in ("f16", "bf16"):
        np.testing.assert_array_equal(got.view(np.uint16), value.view(np.uint16))
    else:
        np.testing.assert_array_equal(got, value)
    if onnx_type != T.BFLOAT16:      # (onnxruntime's CPU Add has no bfloat16 kernel)
        (ref,) = ort_run(model, {"x": zeros})
        np.testing.assert_array_equal(got.view(np.uint8), ref.view(np.uint8))


def test_choose_is_lossless():
    assert packing.choose(np.arange(64, dtype=np.float32) * 0.5) == "f16"
    assert packing.choose(np.full(64, 0.1, np.float32)) is None          # 0.1 is no half
    assert packing.choose(np.full(64, 2.0 ** -20, np.float32)) == "f16"  # a half subnormal
    assert packing.choose(np.full(64, 1.5 * 2.0 ** 20, np.float32)) == "bf16"        # above the half range, low bits zero
    assert packing.choose(np.arange(64, dtype=np.int64) - 32) == "i8"
    assert packing.choose(np.arange(16, dtype=np.int32) - 8) == "i4"
    assert packing.choose(np.array([1 << 20] * 20, np.int32)) is None
    assert packing.choose(np.ones(8, np.float32)) is None                # too small to bother
    assert packing.choose(np.ones(64, np.bool_)) is None


def test_float32_weights_stay_float32(tmp_path):
    """A weight whose values are not all halves keeps 4 bytes a value, and computes as before."""
    rng = np.random.default_rng(3)
    value = rng.standard_normal((8, 9)).astype(np.float32)
    model = _identity_of_const(value, T.FLOAT)
    (got,), res, _ = compile_and_run(model, {"x": np.full_like(value, -0.0)}, tmp_path)
    np.testing.assert_array_equal(got, value)
    assert len(res.weights) == value.nbytes
