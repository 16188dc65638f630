"""Float16 activations stored as halves where the adapter has shader-f16 (compiler/half_storage.py,
issue #17 item 2): the '-f16' kernel variants, their rules, the runtimes' choice and refusal, and
the same bits as the f32-storage kernels through WGSL and SPIR-V. The converter-written models are
in test_precision_models.py (test_halves_stored_as_f16_give_the_same_bits); Chromium, whose
SwiftShader has no shader-f16, in test_browser.py (test_half_variant_needs_shader_f16)."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import webiree
from webiree.compiler import half_storage
from webiree.errors import LimitsError
from webiree.hal_webgpu.requirements import check_requirements
from webiree.hal_webgpu.wgpu_driver import adapter_limits
from webiree.module import read_module
from webiree.module.format import pick_variant, select_variant
from webiree.testing.models import small_cnn

from .conftest import assert_close, ort_run

K, N, ROWS = 64, 96, 32


def half_model():
    """A float16 graph whose every intermediate is a temporary: a matmul with a bias, an
    elementwise chain, a softmax, a transpose and a second matmul reading the float16 input again."""
    rng = np.random.default_rng(0)
    w = nh.from_array((0.1 * rng.standard_normal((K, N))).astype(np.float16), "w")
    b = nh.from_array(rng.standard_normal((N,)).astype(np.float16), "b")
    g = h.make_graph([
        h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
        h.make_node("Relu", ["a"], ["r"]), h.make_node("Mul", ["r", "r"], ["q"]),
        h.make_node("Softmax", ["q"], ["s"], axis=-1), h.make_node("Transpose", ["s"], ["t"], perm=[1, 0]),
        h.make_node("MatMul", ["t", "x"], ["y"])],
        "halves", [h.make_tensor_value_info("x", T.FLOAT16, [ROWS, K])],
        [h.make_tensor_value_info("y", T.FLOAT16, [N, K])], [w, b])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


def feeds():
    return {"x": np.random.default_rng(1).standard_normal((ROWS, K)).astype(np.float16)}


@pytest.mark.parametrize("targets", ["wgsl", "spirv"])
def test_half_variants_store_halves_and_give_the_same_bits(tmp_path, targets):
    assert adapter_limits().get("shader_f16") == 1, "the test adapter (lavapipe) offers shader-f16"
    model = half_model()
    res = webiree.compile(model, tmp_path, variants="cpu,cpu-f16,gpu,gpu-f16", targets=targets)
    info = res.module.info["variants"]
    assert {n: v["rule"] for n, v in info.items()} == {
        "cpu": "device_class=cpu", "cpu-f16": "device_class=cpu,shader_f16=1",
        "gpu": "device_class=gpu", "gpu-f16": "device_class=gpu,shader_f16=1"}
    # the fused dispatches: matmul+bias+relu+square, softmax, transpose+matmul; the first two
    # write a half temporary, the last two read one; the first adds its bias and squares in f16
    assert [d["precision"] for d in info["cpu-f16"]["dispatches"]] == [
        "f32, weights f16, result rounded to f16, activations stored as f16, sums and products of halves in f16",
        "f32, result rounded to f16, activations stored as f16",
        "f32, result rounded to f16, activations stored as f16"]
    assert not any("stored" in d["precision"] for d in info["cpu"]["dispatches"])
    assert res.module.limits.get("shader_f16") is None        # a variant's own requirement, named by its rule
    m = read_module((tmp_path / "model.wrm").read_bytes())
    assert select_variant(m, "cpu-f16").limits["shader_f16"] == 1
    assert "shader_f16" not in select_variant(m, "cpu").limits
    if targets == "wgsl":
        halves = [t for f, t in res.shaders if "enable f16;" in t]
        assert len(halves) == 6 and all("array<f16>" in t or "array<vec4<f16>>" in t for t in halves)
    else:
        cap = struct.pack("<II", (2 << 16) | 17, 4433)     # OpCapability StorageBuffer16BitAccess
        assert len(res.spirv) == 12 and sum(cap in code for _, code in res.spirv) == 6
    want = ort_run(model, feeds())[0]
    got = {v: webiree.InferenceSession(tmp_path, variant=v).run(None, feeds())[0] for v in info}
    for v, out in got.items():
        assert out.dtype == np.float16 and np.array_equal(out.view(np.uint16), got["cpu"].view(np.uint16)), v
        assert_close(out, want, tol=4 * 2.0 ** -10, name=v)    # 4 float16 steps of the scale
    assert webiree.InferenceSession(tmp_path).variant == "cpu-f16"   # lavapipe: CPU class, shader-f16


def test_an_f32_model_drops_the_half_variant_of_its_class(tmp_path):
    """No float16 tensor, no halves: a '-f16' variant would repeat its class's kernels, so it is not
    carried, and nothing asks for shader-f16."""
    res = webiree.compile(small_cnn(), tmp_path, variants="cpu,gpu,cpu-f16,gpu-f16")
    assert list(res.module.info["variants"]) == ["cpu", "gpu"]
    assert "shader_f16" not in res.module.limits


def test_only_temporaries_whose_values_are_halves(tmp_path):
    res = webiree.compile(half_model(), tmp_path, variants="cpu,cpu-f16")
    prog = res.program
    halves = half_storage.half_tensors(prog)
    boundary = {prog.root(n) for n in prog.inputs + prog.outputs}
    assert len(halves) == 2 and not halves & boundary, halves
    assert all(prog.tensors[n].kind == "temp" and prog.tensors[n].rounded == "f16" for n in halves)


def test_the_rule_is_matched_and_the_feature_checked(tmp_path):
    webiree.compile(half_model(), tmp_path, variants="cpu,cpu-f16,gpu,gpu-f16")
    m = read_module((tmp_path / "model.wrm").read_bytes())
    assert pick_variant(m, {"device_class": "cpu", "subgroup_size": 8}) == "cpu"
    assert pick_variant(m, {"device_class": "cpu", "subgroup_size": 8, "shader_f16": 1}) == "cpu-f16"
    assert pick_variant(m, {"device_class": "gpu", "shader_f16": 0}) == "gpu"
    assert pick_variant(m, {"device_class": "gpu", "shader_f16": 1}) == "gpu-f16"
    with pytest.raises(LimitsError, match="need the shader-f16 feature, which this adapter does not offer"):
        check_requirements(select_variant(m, "gpu-f16").limits, {"max_buffer_size": 1 << 30})
    check_requirements(select_variant(m, "gpu-f16").limits, {"shader_f16": 1})
    check_requirements(select_variant(m, "gpu").limits, {})


def test_variant_names(tmp_path):
    from webiree.compiler.driver import parse_variants
    from webiree.target import Target
    assert parse_variants("cpu-sg8-f16,gpu-f16", Target()) == ("cpu-sg8-f16", "gpu-f16")
    with pytest.raises(LimitsError, match="then optionally -f16"):
        parse_variants("gpu-f32", Target())
    with pytest.raises(LimitsError):
        parse_variants("f16-gpu", Target())


def test_half_arithmetic_gives_the_integer_roundings_bits(tmp_path):
    """A '-f16' kernel computes a sum, difference or product of two halves in f16
    (half_storage.half_arithmetic) where the f32-storage kernel rounds f32's result with integer
    operations: the same bits for halves of every size (subnormal, near overflow, signed zeros) and
    results that overflow to inf or fall below the subnormals: 1,024 pairs, each added, subtracted
    and multiplied. The halves come from two products with an identity (stored as halves in the
    '-f16' variant); each result is a dispatch of its own that reads them."""
    rng = np.random.default_rng(3)
    rows, k = 64, 16
    bits = rng.integers(0, 0x7C00, (2, rows, k), dtype=np.uint16) | (rng.integers(0, 2, (2, rows, k), dtype=np.uint16) << 15)
    x1, x2 = bits.view(np.float16)
    eye = nh.from_array(np.eye(k, dtype=np.float16), "eye")
    nodes = [h.make_node("MatMul", ["x1", "eye"], ["y1"]), h.make_node("MatMul", ["x2", "eye"], ["y2"]),
             h.make_node("Add", ["y1", "y2"], ["s"]), h.make_node("Sub", ["y1", "y2"], ["d"]),
             h.make_node("Mul", ["y1", "y2"], ["p"])]
    ins = [h.make_tensor_value_info(n, T.FLOAT16, [rows, k]) for n in ("x1", "x2")]
    outs = [h.make_tensor_value_info(n, T.FLOAT16, [rows, k]) for n in ("s", "d", "p")]
    model = h.make_model(h.make_graph(nodes, "arith", ins, outs, [eye]), opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    res = webiree.compile(model, tmp_path, variants="cpu,cpu-f16")
    ops = [t for f, t in res.shaders if "enable f16;" in t and "array<f16>" in t and "wi_round_f16" not in t]
    assert sorted(re.search(r"f32\(\(b\d\[o\] ([-+*]) b\d\[o\]\)\)", t).group(1) for t in ops) == ["*", "+", "-"]
    feeds_ = {"x1": x1, "x2": x2}
    y1 = (x1.astype(np.float32) @ np.eye(k, dtype=np.float32)).astype(np.float16)   # +0 for -0, as the product
    y2 = (x2.astype(np.float32) @ np.eye(k, dtype=np.float32)).astype(np.float16)
    with np.errstate(over="ignore"):
        want = [y1 + y2, y1 - y2, y1 * y2]          # numpy: each rounded from the exact f32 result
    got = {v: webiree.InferenceSession(tmp_path, variant=v).run(None, feeds_) for v in ("cpu", "cpu-f16")}
    assert sum(np.isinf(w).sum() for w in want) > 0 and sum((np.abs(w) < 2.0 ** -14).sum() for w in want) > 0
    for v, outs_ in got.items():
        assert len(outs_) == 3
        for name, g, w in zip("sdp", outs_, want):
            assert np.array_equal(g.view(np.uint16), w.view(np.uint16)), (v, name, int((g.view(np.uint16) != w.view(np.uint16)).sum()))
