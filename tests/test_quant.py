"""8-bit quantization ops at sizes the conformance cases do not reach (compiler/ops/quant.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

from webiree.compiler.ops.quant import SPLIT, SPLIT_FROM
from webiree.testing.models import IR_VERSION

from .conftest import compile_and_run, ort_run


@pytest.mark.parametrize("limits", ["default", "cpu"])
@pytest.mark.parametrize("n", [1000, 4 * 12289, SPLIT_FROM + 1, 3 * SPLIT_FROM + 17],
                         ids=["words", "words, long", "slices, ragged", "slices, long"])
def test_dynamic_quantize_linear_of_a_long_input(tmp_path, n, limits):
    """n % 4 == 0: the range, the parameters and the packed words are one dispatch (QuantizeWords,
    every workgroup reducing the whole input; several workgroups for the long one), y, y_scale and
    y_zero_point read from the words. Otherwise the range of a long input is reduced in slices in
    one dispatch (+inf filling the last slice's tail), their minima taken where the scale and zero
    point are read. Either way y, y_scale and y_zero_point equal onnxruntime's, with the extremes
    anywhere, for the GPU and the CPU-renderer plans."""
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    x[-1], x[n // 3] = 9.5, -7.25          # the maximum in the tail, the minimum inside
    g = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", T.UINT8, [n]), helper.make_tensor_value_info("s", T.FLOAT, []),
                           helper.make_tensor_value_info("z", T.UINT8, [])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    got, res, _ = compile_and_run(m, {"x": x}, tmp_path, limits=limits)
    ref = ort_run(m, {"x": x})
    assert len(got) == 3
    np.testing.assert_array_equal(got[1], ref[1])
    np.testing.assert_array_equal(got[2], ref[2])
    np.testing.assert_array_equal(got[0], ref[0])
    kinds = sorted(d.kind for d in res.dispatches)
    if n % 4 == 0:        # the words, then y, y_scale and y_zero_point unpacked from them (graph outputs)
        assert kinds == ["generic"] * 3 + ["quantizewords"], kinds
        (q,) = [d for d in res.dispatches if d.kind == "quantizewords"]
        wg, (per,) = q.config.workgroup_size[0], q.config.tile
        assert q.grid[0] * q.grid[1] == -(-n // (4 * wg * per)) and (n < 4000 or q.grid[0] > 1), (q.grid, wg, per)
    else:
        (reduce,) = [d for d in res.dispatches if d.kind == "reduce"]       # one dispatch: the slices at once
        assert reduce.grid[0] * reduce.grid[1] == 2 * (1 if n < SPLIT_FROM else SPLIT), reduce.grid


@pytest.mark.parametrize("wg, words", [(64, 1), (128, 5), (256, 64)])
def test_quantize_words_for_any_workgroup_count(tmp_path, monkeypatch, wg, words):
    """The range-pack kernel under forced plans (what `webiree tune` tries): 193, 20 and 1
    workgroups, each reducing the whole input and packing its own words, all equal to
    onnxruntime's y, scale and zero point."""
    from webiree.wgsl_codegen import config
    from webiree.wgsl_codegen.kernels.common import KernelConfig, Strategy
    monkeypatch.setitem(config.PLANNERS, Strategy.RANGE_PACK,
                        lambda op, limits: KernelConfig((wg, 1, 1), (words,), 1, Strategy.RANGE_PACK))
    n = 4 * 12289
    rng = np.random.default_rng(wg)
    x = (rng.standard_normal(n) * 2 + 0.5).astype(np.float32)
    x[7] = -6.0
    g = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", T.UINT8, [n]), helper.make_tensor_value_info("s", T.FLOAT, []),
                           helper.make_tensor_value_info("z", T.UINT8, [])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    got, res, _ = compile_and_run(m, {"x": x}, tmp_path)
    ref = ort_run(m, {"x": x})
    assert len(got) == 3
    for g_, r in zip(got, ref):
        np.testing.assert_array_equal(g_, r)
    (q,) = [d for d in res.dispatches if d.kind == "quantizewords"]
    assert q.grid[0] * q.grid[1] == -(-12289 // (wg * words)), q.grid


def _dynamic_projections(rng, k: int, n: int, outputs, w_low: int = -127):
    """quantize_dynamic's form of len(outputs) projections of one x [m, k]: one DynamicQuantizeLinear,
    then per output a MatMulInteger with constant int8 weights, its Cast, the scales' product and a
    bias. Returns (nodes, initializers)."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"])]
    inits = []
    for i, name in enumerate(outputs):
        w = rng.integers(w_low, 128, size=(k, n)).astype(np.int8)
        inits += [helper.make_tensor(f"w{i}", T.INT8, [k, n], w.tobytes(), raw=True),
                  helper.make_tensor(f"ws{i}", T.FLOAT, [], [float(0.01 * (i + 1))]),
                  helper.make_tensor(f"b{i}", T.FLOAT, [n], rng.standard_normal(n).astype(np.float32).tolist())]
        nodes += [helper.make_node("MatMulInteger", ["xq", f"w{i}", "xz"], [f"p{i}"]),
                  helper.make_node("Cast", [f"p{i}"], [f"pf{i}"], to=T.FLOAT),
                  helper.make_node("Mul", ["xs", f"ws{i}"], [f"s{i}"]),
                  helper.make_node("Mul", [f"pf{i}", f"s{i}"], [f"d{i}"]),
                  helper.make_node("Add", [f"d{i}", f"b{i}"], [name])]
    return nodes, inits


@pytest.mark.parametrize("limits, targets", [("default", ("wgsl",)), ("cpu", ("wgsl",)), ("default", ("spirv",)),
                                             ("cpu", ("spirv",))])
def test_dynamic_quantization_shared_by_three_products_is_packed_once(tmp_path, limits, targets):
    """What quantize_dynamic writes for attention's Q, K and V: one DynamicQuantizeLinear read by
    three MatMulIntegers, each dequantized (Cast, scale products) with a bias. The quantized
    activation is computed once, packed four values to a word (a quarter of the f32 activation),
    and each exact integer product reads the words and dequantizes in its epilogue: the range and
    the packing (one dispatch), and three products (each result is a graph output, so they are not
    combined: passes.combine_parallel_matmuls); GPU and CPU-renderer plans, WGSL and SPIR-V."""
    rng = np.random.default_rng(7)
    m_, k, n = 64, 48, 32
    nodes, inits = _dynamic_projections(rng, k, n, ["y0", "y1", "y2"])
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [m_, k])],
                          [helper.make_tensor_value_info(f"y{i}", T.FLOAT, [m_, n]) for i in range(3)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    x = rng.standard_normal((m_, k)).astype(np.float32)
    got, res, _ = compile_and_run(m, {"x": x}, tmp_path, limits=limits, targets=targets)
    assert {e.format for e in res.module.executables} == set(targets)
    ref = ort_run(m, {"x": x})
    assert len(got) == 3
    for g_, r in zip(got, ref):
        np.testing.assert_allclose(g_, r, rtol=1e-5, atol=1e-5 * float(np.abs(r).max()))
    assert [d.kind for d in res.dispatches] == ["quantizewords", "matmul", "matmul", "matmul"], \
        [(d.kind, d.nodes) for d in res.dispatches]
    assert res.module.limits.get("packed_4x8_integer_dot_product") == 1


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("limits, targets", [("default", ("wgsl",)), ("adapter", ("wgsl",)), ("cpu", ("spirv",))])
def test_dynamic_quantized_attention_projections_are_one_integer_product(tmp_path, limits, targets, masked):
    """quantize_dynamic's attention: Q, K and V are MatMulIntegers of one DynamicQuantizeLinear,
    each dequantized with a bias, and read by the attention's products. The three integer products
    become one whose B holds their words side by side (passes.combine_parallel_matmuls), and each
    projection's zero-point term, scales and bias are computed where the attention reads it: one
    range-pack, one product, then the attention (fused, or its products). With a run-time additive
    mask (BERT's) and heads of 64 (biases and column sums not below the constant table's 256
    bytes) the fused attention would bind 10 buffers (its output too), past WebGPU's default 8;
    its small constants are stacked, one per element type (passes._stacked_attention), and it
    stays one dispatch. Equal to onnxruntime."""
    rng = np.random.default_rng(11)
    m_, k, n = 32, 64, 64 if masked else 16
    nodes, inits = _dynamic_projections(rng, k, n, ["q", "k", "v"], w_low=-128)
    inits.append(helper.make_tensor("scale", T.FLOAT, [], [0.25]))
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[1, 0]),
              helper.make_node("MatMul", ["q", "kt"], ["qk"]),
              helper.make_node("Mul", ["qk", "scale"], ["scaled" if masked else "scores"])]
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, [m_, k])]
    feeds = {"x": rng.standard_normal((m_, k)).astype(np.float32)}
    if masked:
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["scores"]))
        inputs.append(helper.make_tensor_value_info("mask", T.FLOAT, [1, m_]))
        feeds["mask"] = np.where(np.arange(m_) < m_ - 5, 0.0, -1e4).astype(np.float32)[None]
    nodes += [helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["y"])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", T.FLOAT, [m_, n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    (got,), res, _ = compile_and_run(m, feeds, tmp_path, limits=limits, targets=targets)
    (ref,) = ort_run(m, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    combined = {t.name: (t.shape, t.dtype, t.form) for t in res.program.tensors.values()
                if t.name.endswith(":combined") and t.kind == "const"}
    assert list(combined.values()) == [((k // 4, 3 * n), "u32", "i8")], combined
    kinds = [d.kind for d in res.dispatches]
    # the attention is one dispatch where the plan fuses it (GPUs, CPU adapters with subgroups)
    fused = limits in ("default", "adapter")
    rest = ["attention"] if fused else ["matmul", "softmax", "matmul"]
    assert kinds == ["quantizewords", "matmul"] + rest, [(d.kind, d.nodes) for d in res.dispatches]
    stacks = sorted((t.dtype, t.shape) for t in res.program.tensors.values() if ":stack" in t.name)
    # (the adapter here, lavapipe, binds more than WebGPU's default 8 storage buffers: no stacking)
    assert stacks == ([("f32", (3 * n,)), ("i32", (3 * n,))] if limits == "default" and masked else []), stacks


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


def _matmul_integer(m, k, n, a_type, b_type, a_zp, b_zp, seed=0):
    """MatMulInteger of a run-time [m, k] A (and its zero point, a run-time scalar) with a constant
    [k, n] B (and a constant zero point), as quantize_dynamic writes it."""
    rng = np.random.default_rng(seed)
    w = rng.integers(*INT_RANGE[b_type], size=(k, n)).astype(NP_INT[b_type])
    inits = [helper.make_tensor("w", b_type, [k, n], w.tobytes(), raw=True)]
    inputs = [helper.make_tensor_value_info("a", a_type, [m, k])]
    names = ["a", "w", "az" if a_zp is not None else "", "bz" if b_zp is not None else ""]
    if a_zp is not None:
        inputs.append(helper.make_tensor_value_info("az", a_type, []))
    if b_zp is not None:
        inits.append(helper.make_tensor("bz", b_type, [], [b_zp]))
    while not names[-1]:
        names.pop()
    g = helper.make_graph([helper.make_node("MatMulInteger", names, ["y"])], "g", inputs,
                          [helper.make_tensor_value_info("y", T.INT32, [m, n])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    feeds = {"a": rng.integers(*INT_RANGE[a_type], size=(m, k)).astype(NP_INT[a_type])}
    if a_zp is not None:
        feeds["az"] = np.array(a_zp, NP_INT[a_type])
    return model, feeds


def _assert_packed(res, side: str) -> None:
    """An integer product and the packing of its operand `side` into words: one dispatch with
    GPU kernels (the product packs it where it loads it: passes.pack_in_products), the packing
    and then the product with a CPU renderer's."""
    kinds = [(d.kind, d.nodes) for d in res.dispatches]
    if res.limits.get("device_class") == "cpu":
        assert [k for k, _ in kinds] == ["generic", "matmul"], kinds
    else:
        assert [k for k, _ in kinds] == ["matmul"], kinds
        assert res.module.info["dispatches"][0]["precision"].endswith(f", packs {side} in its loads"), \
            res.module.info["dispatches"][0]["precision"]


INT_RANGE = {T.UINT8: (0, 256), T.INT8: (-128, 128)}
NP_INT = {T.UINT8: np.uint8, T.INT8: np.int8}
# (m, k, n, A's type, B's type, A's zero point, B's zero point): quantize_dynamic's QInt8 and
# QUInt8 forms, signed activations, no zero points, a K past one subgroup block with a ragged tail,
# N not a multiple of 4, extreme values of every zero point
INTEGER_PRODUCTS = [(5, 8, 12, T.UINT8, T.INT8, 3, None), (33, 64, 40, T.UINT8, T.INT8, 255, 0),
                    (17, 100, 36, T.INT8, T.INT8, -128, 7), (64, 384, 96, T.UINT8, T.UINT8, 128, 255),
                    (9, 1540, 22, T.UINT8, T.INT8, None, None)]


@pytest.mark.parametrize("limits", ["gpu", "cpu", "adapter"])
@pytest.mark.parametrize("case", INTEGER_PRODUCTS, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}")
def test_integer_product_equals_onnxruntime(tmp_path, case, limits):
    """A MatMulInteger with a constant B is one exact integer product (kernels/matmul_int8.py): B
    packed four values of K to a word, A packed as it is loaded, dot4I8Packed, the zero points
    applied through row and column sums. Equal to onnxruntime's int32 result, element for element,
    with every strategy the planner gives it: GPU (tiled-shared, split-k), CPU (register-blocked)
    and this adapter's (subgroup-broadcast on lavapipe)."""
    model, feeds = _matmul_integer(*case)
    (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
    (ref,) = ort_run(model, feeds)
    assert got.dtype == np.int32 and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    (d,) = [d for d in res.dispatches if d.kind == "matmul"]
    _assert_packed(res, "A")
    assert res.module.limits.get("packed_4x8_integer_dot_product") == 1
    assert d.config.strategy.value in {"gpu": {"tiled-shared", "split-k"}, "cpu": {"register-blocked"},
                                       "adapter": {"subgroup-broadcast"}}[limits], d.config


def extreme_integer_product():
    """A MatMulInteger whose every product is near the extreme 2^14 (A' = A - 128 and B' of -128
    and -127, odd products among them) over K = 2,052, so that each sum of A'B' is about 3.3e7,
    past f32's exact integers. Returns (model, feeds, numpy's int64 result)."""
    rng = np.random.default_rng(5)
    m_, k, n = 8, 2052, 16
    w = rng.integers(-128, -126, size=(k, n)).astype(np.int8)
    g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", T.UINT8, [m_, k])],
                          [helper.make_tensor_value_info("y", T.INT32, [m_, n])],
                          [helper.make_tensor("w", T.INT8, [k, n], w.tobytes(), raw=True)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    a = rng.integers(0, 2, size=(m_, k)).astype(np.uint8)       # A' = A - 128: -128 or -127
    inner = (a.astype(np.int64) - 128) @ w.astype(np.int64)     # the kernels' sum of A'B' (the result is it + 128 sum B)
    assert np.abs(inner).min() > 2 ** 24 and (inner % 2).any()
    return model, {"a": a}, a.astype(np.int64) @ w.astype(np.int64)


def test_integer_product_in_f32_chunks_is_exact_past_2_to_the_24(tmp_path):
    """The subgroup-broadcast integer product (CPU adapters) sums in f32, exact only while every
    partial sum stays within 2^24: it adds its f32 sums to i32 ones after each 1,024 values of K
    (kernels/matmul_int8.py EXACT_WORDS). On extreme_integer_product (two whole chunks and a tail,
    sums past 2^24): equal to numpy's int64 product. (tests/test_browser.py runs it in Chromium.)"""
    model, feeds, ref = extreme_integer_product()
    (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits="adapter")
    np.testing.assert_array_equal(got, ref)
    (d,) = [d for d in res.dispatches if d.kind == "matmul"]
    assert d.config.strategy.value == "subgroup-broadcast", d.config


@pytest.mark.parametrize("case", INTEGER_PRODUCTS, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}")
def test_the_onnxruntime_reference_is_the_exact_integer_product(case):
    """ort_run (on exact_integer_reference's model) gives the operator's exact result: numpy's int64
    product of A and B less their zero points, on any host (onnxruntime's own u8 x s8 kernels
    saturate on AVX2 hosts); it rewrites exactly the products of a uint8 A with an int8 B."""
    from onnx import numpy_helper
    from webiree.testing.models import exact_integer_reference

    model, feeds = _matmul_integer(*case)
    inits = {i.name: numpy_helper.to_array(i).astype(np.int64) for i in model.graph.initializer}
    a = feeds["a"].astype(np.int64) - (feeds["az"].astype(np.int64) if "az" in feeds else 0)
    (got,) = ort_run(model, feeds)
    np.testing.assert_array_equal(got, a @ (inits["w"] - inits.get("bz", 0)))
    rewritten = exact_integer_reference(model) is not model
    assert rewritten == (case[3] == T.UINT8 and case[4] == T.INT8), case


def test_integer_product_from_spirv(tmp_path):
    """The same products as SPIR-V executables, where pack4i8 and dot4i8 are written with shifts
    (legalize.py): equal to onnxruntime's."""
    for case, limits in [(INTEGER_PRODUCTS[2], "adapter"), (INTEGER_PRODUCTS[3], "gpu"), (INTEGER_PRODUCTS[4], "cpu")]:
        model, feeds = _matmul_integer(*case)
        (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits=limits, targets=("spirv",))
        assert {e.format for e in res.module.executables} == {"spirv"}
        np.testing.assert_array_equal(got, ort_run(model, feeds)[0])


def test_integer_product_falls_back_where_k_is_not_a_multiple_of_4(tmp_path):
    """K = 10 cannot be cut into words of 4: the product is summed in f32 as before (exact at this
    size) and needs no packed-integer WGSL."""
    model, feeds = _matmul_integer(6, 10, 8, T.UINT8, T.INT8, 5, None)
    (got,), res, _ = compile_and_run(model, feeds, tmp_path)
    np.testing.assert_array_equal(got, ort_run(model, feeds)[0])
    assert "packed_4x8_integer_dot_product" not in res.module.limits


def test_qlinear_matmul_with_constant_weights_is_an_integer_product(tmp_path):
    """QLinearMatMul (the QOperator format) with a constant B: the integer product, then the
    requantization (scales, zero point, round half to even, saturation) as its epilogue: equal to
    onnxruntime's uint8 result."""
    rng = np.random.default_rng(5)
    m, k, n = 24, 96, 40
    w = rng.integers(-128, 128, size=(k, n)).astype(np.int8)
    inits = [helper.make_tensor("w", T.INT8, [k, n], w.tobytes(), raw=True),
             helper.make_tensor("as", T.FLOAT, [], [0.02]), helper.make_tensor("az", T.UINT8, [], [121]),
             helper.make_tensor("ws", T.FLOAT, [], [0.005]), helper.make_tensor("wz", T.INT8, [], [0]),
             helper.make_tensor("ys", T.FLOAT, [], [0.02]), helper.make_tensor("yz", T.UINT8, [], [130])]
    g = helper.make_graph([helper.make_node("QLinearMatMul", ["a", "as", "az", "w", "ws", "wz", "ys", "yz"], ["y"])],
                          "g", [helper.make_tensor_value_info("a", T.UINT8, [m, k])],
                          [helper.make_tensor_value_info("y", T.UINT8, [m, n])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    feeds = {"a": rng.integers(0, 256, size=(m, k)).astype(np.uint8)}
    (got,), res, _ = compile_and_run(model, feeds, tmp_path)
    (ref,) = ort_run(model, feeds)
    np.testing.assert_array_equal(got, ref)
    assert 0 < int((ref == 0).sum() + (ref == 255).sum()), "the case should saturate somewhere"
    _assert_packed(res, "A")
    assert res.module.limits.get("packed_4x8_integer_dot_product") == 1


def _conv_integer(c, o, hw, x_type, w_type, x_zp, w_zp, images=1, seed=0, x_range=None, w_range=None):
    """ConvInteger 1x1 of a run-time [images, c, h, w] x with a constant [o, c, 1, 1] w and constant
    zero points, and numpy's exact int64 result."""
    rng = np.random.default_rng(seed)
    w = rng.integers(*(w_range or INT_RANGE[w_type]), size=(o, c, 1, 1)).astype(NP_INT[w_type])
    x = rng.integers(*(x_range or INT_RANGE[x_type]), size=(images, c) + hw).astype(NP_INT[x_type])
    inits = [helper.make_tensor("w", w_type, list(w.shape), w.tobytes(), raw=True),
             helper.make_tensor("xz", x_type, [], [x_zp]), helper.make_tensor("wz", w_type, [], [w_zp])]
    g = helper.make_graph([helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", x_type, list(x.shape))],
                          [helper.make_tensor_value_info("y", T.INT32, [images, o] + list(hw))], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    exact = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.int64) - w_zp, x.astype(np.int64) - x_zp)
    return model, {"x": x}, exact


# (c, o, (h, w), x's type, w's type, x's zero point, w's zero point): sums past 2^24 (an f32 sum
# rounds them: x - 255 in [-255, -195] times w - 128 in [-128, -98] over 1,024 channels, 35 pixels,
# not a multiple of 4), a signed image and weights, uint8 weights with an odd output count
POINTWISE = [(1024, 24, (5, 7), T.UINT8, T.UINT8, 255, 128, (0, 61), (0, 31)),
             (96, 40, (8, 8), T.INT8, T.INT8, -3, 0, None, None),
             (32, 13, (3, 3), T.UINT8, T.UINT8, 17, 128, None, None)]


@pytest.mark.parametrize("limits", ["gpu", "cpu", "adapter"])
@pytest.mark.parametrize("case", POINTWISE, ids=lambda c: f"{c[0]}to{c[1]}")
def test_pointwise_conv_integer_is_one_exact_integer_product(tmp_path, case, limits):
    """A pointwise ConvInteger of one image (ops/quant.py integer_conv): the weights packed four
    channels to a word at build time, the image's four channels a pixel packed by one Generic,
    dot4I8Packed in i32, x's zero point through the row sums: numpy's exact int64 result, element for
    element, including sums past 2^24 that an f32 sum (the kernel before) rounds."""
    c, o, hw, xt, wt, xz, wz, xr, wr = case
    model, feeds, exact = _conv_integer(c, o, hw, xt, wt, xz, wz, x_range=xr, w_range=wr)
    (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
    assert got.dtype == np.int32 and got.shape == exact.shape
    np.testing.assert_array_equal(got, exact)
    _assert_packed(res, "B")
    (d,) = [d for d in res.module.info["dispatches"] if d["kind"] == "matmul"]
    assert d["precision"].startswith("int8 products in i32"), d["precision"]
    if case is POINTWISE[0]:
        assert np.abs(exact).max() > 2 ** 24 and (np.abs(exact) > 2 ** 24).sum() == exact.size


def test_pointwise_conv_integer_of_two_images_sums_in_f32(tmp_path):
    """Two images (or any convolution that is not pointwise) keep the f32 sum: still exact where the
    sums stay below 2^24, and no packed-integer WGSL."""
    model, feeds, exact = _conv_integer(32, 8, (4, 4), T.UINT8, T.INT8, 3, 0, images=2)
    (got,), res, _ = compile_and_run(model, feeds, tmp_path)
    np.testing.assert_array_equal(got, exact)
    assert "packed_4x8_integer_dot_product" not in res.module.limits


def test_pointwise_qlinear_conv_is_an_integer_product(tmp_path):
    """QLinearConv 1x1 (the QOperator format) with per-channel weight scales and an int32 bias: the
    integer product, then the requantization (bias, scales, zero point, half to even, saturation):
    equal to onnxruntime's uint8 result (weights within +-63, so that its AVX2 kernels' 16-bit pair
    sums cannot saturate)."""
    rng = np.random.default_rng(7)
    c, o = 64, 24
    w = rng.integers(-63, 64, size=(o, c, 1, 1)).astype(np.int8)
    bias = rng.integers(-2000, 2000, size=o).astype(np.int32)
    ws = (rng.random(o) * 0.01 + 0.002).astype(np.float32)
    inits = [helper.make_tensor("w", T.INT8, list(w.shape), w.tobytes(), raw=True),
             helper.make_tensor("xs", T.FLOAT, [], [0.03]), helper.make_tensor("xz", T.UINT8, [], [117]),
             helper.make_tensor("ws", T.FLOAT, [o], ws), helper.make_tensor("wz", T.INT8, [o], [0] * o),
             helper.make_tensor("ys", T.FLOAT, [], [0.05]), helper.make_tensor("yz", T.UINT8, [], [128]),
             helper.make_tensor("b", T.INT32, [o], bias)]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.UINT8, [1, c, 6, 6])],
                          [helper.make_tensor_value_info("y", T.UINT8, [1, o, 6, 6])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    feeds = {"x": rng.integers(0, 256, size=(1, c, 6, 6)).astype(np.uint8)}
    (got,), res, _ = compile_and_run(model, feeds, tmp_path)
    (ref,) = ort_run(model, feeds)
    np.testing.assert_array_equal(got, ref)
    assert 0 < int((ref == 0).sum() + (ref == 255).sum()) < ref.size, "the case should saturate somewhere"
    _assert_packed(res, "B")


def _qdq_conv(x_type, w_type, per_channel, images=1, c=48, o=20, hw=(7, 7), seed=11):
    """f32 x -> QuantizeLinear -> DequantizeLinear -> Conv 1x1 with DequantizeLinear(8-bit w) and
    DequantizeLinear(int32 bias), as quantize_static writes a pointwise convolution."""
    rng = np.random.default_rng(seed)
    lo, hi = INT_RANGE[w_type]
    wz = 128 if w_type == T.UINT8 else 0
    w = rng.integers(lo, hi, size=(o, c, 1, 1)).astype(NP_INT[w_type])
    ws = (rng.random(o) * 0.004 + 0.001).astype(np.float32) if per_channel else np.array(0.003, np.float32)
    xs, xz = np.float32(0.04), (100 if x_type == T.UINT8 else -7)
    bias = rng.integers(-5000, 5000, size=o).astype(np.int32)
    from onnx import numpy_helper
    inits = [helper.make_tensor("w", w_type, list(w.shape), w.tobytes(), raw=True),
             numpy_helper.from_array(ws, "ws"), numpy_helper.from_array(np.full(ws.shape, wz, NP_INT[w_type]), "wz"),
             numpy_helper.from_array(np.array(xs), "xs"), numpy_helper.from_array(np.array(xz, NP_INT[x_type]), "xz"),
             numpy_helper.from_array(bias, "b"), numpy_helper.from_array((xs * ws).astype(np.float32), "bs"),
             numpy_helper.from_array(np.zeros(ws.shape, np.int32), "bz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=0),
             helper.make_node("Conv", ["xd", "wd", "bd"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [images, c] + list(hw))],
                          [helper.make_tensor_value_info("y", T.FLOAT, [images, o] + list(hw))], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    return model, {"x": (rng.standard_normal((images, c) + hw) * 2).astype(np.float32)}


def _check_qdq_integer(model, feeds, tmp_path, side):
    """onnxruntime's f32 result to its rounding, from the integer product with its dequantization
    in the epilogue, packing the activation's words (operand `side`) where it loads them (a CPU
    renderer's: after a dispatch that packs them)."""
    (got,), res, _ = compile_and_run(model, feeds, tmp_path)
    (ref,) = ort_run(model, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    _assert_packed(res, side)
    (d,) = [d for d in res.module.info["dispatches"] if d["kind"] == "matmul"]
    assert d["precision"].startswith("int8 products in i32, result f32"), d["precision"]


@pytest.mark.parametrize("x_type, w_type, per_channel", [(T.INT8, T.INT8, True), (T.UINT8, T.INT8, True),
                                                         (T.UINT8, T.UINT8, False)])
def test_qdq_pointwise_conv_is_an_integer_product(tmp_path, x_type, w_type, per_channel):
    """A QDQ pointwise Conv (quantize_static's form) is the integer product of the quantized image
    and weights, scaled and biased in its epilogue (ops/quant.py qdq_conv), and the image's
    QuantizeLinear is computed where its words are packed: two dispatches, equal to onnxruntime's
    f32 result to its rounding (f32 sums of products of dequantized values), and exactly to the
    integer sum scaled."""
    _check_qdq_integer(*_qdq_conv(x_type, w_type, per_channel), tmp_path, "B")


def test_qdq_conv_that_is_not_pointwise_sums_in_f32(tmp_path):
    """Two images: the QDQ Conv keeps its f32 form (a product of dequantized values), still equal
    to onnxruntime's."""
    model, feeds = _qdq_conv(T.UINT8, T.INT8, True, images=2)
    (got,), res, _ = compile_and_run(model, feeds, tmp_path)
    (ref,) = ort_run(model, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert "packed_4x8_integer_dot_product" not in res.module.limits


def test_pointwise_conv_integer_from_spirv(tmp_path):
    """The same convolutions as SPIR-V executables (pack4i8 and dot4i8 written with shifts):
    numpy's exact result."""
    for case, limits in [(POINTWISE[0], "gpu"), (POINTWISE[2], "cpu")]:
        c, o, hw, xt, wt, xz, wz, xr, wr = case
        model, feeds, exact = _conv_integer(c, o, hw, xt, wt, xz, wz, x_range=xr, w_range=wr)
        (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits=limits, targets=("spirv",))
        assert {e.format for e in res.module.executables} == {"spirv"}
        np.testing.assert_array_equal(got, exact)


def _qdq_product(op, x_type, shape, k, n, per_column, seed=13):
    """f32 x -> QuantizeLinear -> DequantizeLinear -> MatMul / Gemm (transB, a dequantized int32
    bias) with DequantizeLinear(int8 weights), as quantize_static writes a transformer's products."""
    from onnx import numpy_helper
    rng = np.random.default_rng(seed)
    gemm = op == "Gemm"
    w = rng.integers(-128, 128, size=(n, k) if gemm else (k, n)).astype(np.int8)
    ws = (rng.random(n) * 0.004 + 0.001).astype(np.float32) if per_column else np.array(0.002, np.float32)
    xs, xz = np.float32(0.05), (131 if x_type == T.UINT8 else 9)
    inits = [helper.make_tensor("w", T.INT8, list(w.shape), w.tobytes(), raw=True), numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(np.zeros(ws.shape, np.int8), "wz"), numpy_helper.from_array(np.array(xs), "xs"),
             numpy_helper.from_array(np.array(xz, NP_INT[x_type]), "xz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0 if gemm else 1)]
    if gemm:
        inits += [numpy_helper.from_array(rng.integers(-3000, 3000, size=n).astype(np.int32), "b"),
                  numpy_helper.from_array((xs * ws * np.ones(n)).astype(np.float32), "bs"),
                  numpy_helper.from_array(np.zeros(n, np.int32), "bz")]
        nodes += [helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bd"], axis=0),
                  helper.make_node("Gemm", ["xd", "wd", "bd"], ["y"], transB=1)]
    else:
        nodes.append(helper.make_node("MatMul", ["xd", "wd"], ["y"]))
    out = list(shape[:-1]) + [n]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", T.FLOAT, out)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    return model, {"x": (rng.standard_normal(shape) * 3).astype(np.float32)}


@pytest.mark.parametrize("op, x_type, shape, per_column", [("MatMul", T.INT8, (2, 5, 64), True),
                                                           ("MatMul", T.UINT8, (7, 96), False),
                                                           ("Gemm", T.UINT8, (3, 128), True)])
def test_qdq_product_is_an_integer_product(tmp_path, op, x_type, shape, per_column):
    """A QDQ MatMul or Gemm with int8 weights (ops/quant.py qdq_matmul): the activation quantized
    and packed once, the integer product, x_scale * w_scale[n] (and a Gemm's bias) in its epilogue:
    two dispatches, onnxruntime's f32 result to its rounding."""
    _check_qdq_integer(*_qdq_product(op, x_type, shape, shape[-1], 24, per_column), tmp_path, "A")


def test_qdq_product_with_k_not_a_multiple_of_4_sums_in_f32(tmp_path):
    """K = 30: no words of four; the product of the dequantized values, as before, equal to
    onnxruntime's."""
    model, feeds = _qdq_product("MatMul", T.INT8, (4, 30), 30, 8, True)
    (got,), res, _ = compile_and_run(model, feeds, tmp_path)
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    assert "packed_4x8_integer_dot_product" not in res.module.limits



@pytest.mark.parametrize("limits", ["default", "cpu"])
def test_layers_that_differ_in_their_scales_share_one_executable(tmp_path, limits):
    """Four layers of quantize_dynamic's projections, alike but for their per-tensor weight scales
    (which lowering writes into a kernel as literals): each product reads its scale from a small
    constant of its own (passes.lift_literals), so the first three (each writing the next layer's
    input, whose range it records: passes.ranges_from_producers) run one executable; the last,
    whose result no range-pack reads, is a kernel of its own and keeps its literal. On a GPU the
    products after the first quantize their A themselves (passes.pack_in_products): one
    range-pack, four products, the second and third one executable. Equal to onnxruntime."""
    rng = np.random.default_rng(5)
    m_, k = 32, 128         # (column sums and biases of 128 values: bound, not in the constant table)
    nodes, inits = [], []
    for layer, (x, y, w_scale) in enumerate([("x", "h", 0.003), ("h", "h2", 0.01), ("h2", "h3", 0.015),
                                             ("h3", "y", 0.02)]):
        p = f"l{layer}_"
        w = rng.integers(-127, 128, size=(k, k)).astype(np.int8)
        inits += [helper.make_tensor(p + "w", T.INT8, [k, k], w.tobytes(), raw=True),
                  helper.make_tensor(p + "ws", T.FLOAT, [], [w_scale]),
                  helper.make_tensor(p + "b", T.FLOAT, [k], rng.standard_normal(k).astype(np.float32).tolist())]
        nodes += [helper.make_node("DynamicQuantizeLinear", [x], [p + "xq", p + "xs", p + "xz"]),
                  helper.make_node("MatMulInteger", [p + "xq", p + "w", p + "xz"], [p + "p"]),
                  helper.make_node("Cast", [p + "p"], [p + "pf"], to=T.FLOAT),
                  helper.make_node("Mul", [p + "xs", p + "ws"], [p + "s"]),
                  helper.make_node("Mul", [p + "pf", p + "s"], [p + "d"]),
                  helper.make_node("Add", [p + "d", p + "b"], [y])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [m_, k])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [m_, k])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    feeds = {"x": rng.standard_normal((m_, k)).astype(np.float32)}
    (got,), res, _ = compile_and_run(m, feeds, tmp_path, limits=limits)
    (ref,) = ort_run(m, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))
    info = res.module.info["dispatches"]
    if limits == "cpu":
        assert [d["kind"] for d in info] == ["quantizewords", "matmul"] * 4, info
        assert info[1]["exec"] == info[3]["exec"] == info[5]["exec"] != info[7]["exec"], info
    else:
        assert [d["kind"] for d in info] == ["quantizewords"] + ["matmul"] * 4, info
        assert [d["precision"].endswith(", quantizes A in its loads (range from its producer)") for d in info] \
            == [False, False, True, True, True], info
        assert info[1]["exec"] != info[2]["exec"] == info[3]["exec"] != info[4]["exec"], info
    lifted = sorted(round(float(np.asarray(t.data[:1], np.uint32).view(np.float32)[0]), 6)
                    for t in res.program.tensors.values() if t.name.endswith(":literals"))
    assert lifted == [0.003, 0.01, 0.015], lifted


@pytest.mark.parametrize("limits", ["default", "cpu"])
def test_qdq_layers_that_differ_in_scales_and_zero_points_share_executables(tmp_path, monkeypatch, limits):
    """Three QDQ layers (quantize_static's products, per-tensor scales) whose activations' scales
    and zero points differ (i32 literals in the packing, f32 ones there and in the epilogue): each
    op reads them from a small constant of its own (passes.lift_literals; strides and offsets stay
    in the code), so the second and third layers' packings (each of the dequantized product
    before it) run one executable. The same values as the build without the pass, and
    onnxruntime's to its rounding."""
    from onnx import numpy_helper
    rng = np.random.default_rng(3)
    m_, k = 16, 128
    nodes, inits = [], []
    layers = [("x", "h0", 0.05, 131, 0.002), ("h0", "h1", 0.4, 120, 0.003), ("h1", "y", 0.3, 125, 0.004)]
    for layer, (x, y, xs, xz, ws) in enumerate(layers):
        p = f"l{layer}_"
        w = rng.integers(-128, 128, size=(k, k)).astype(np.int8)
        inits += [helper.make_tensor(p + "w", T.INT8, [k, k], w.tobytes(), raw=True),
                  numpy_helper.from_array(np.array(ws, np.float32), p + "ws"),
                  numpy_helper.from_array(np.array(0, np.int8), p + "wz"),
                  numpy_helper.from_array(np.array(xs, np.float32), p + "xs"),
                  numpy_helper.from_array(np.array(xz, np.uint8), p + "xz")]
        nodes += [helper.make_node("QuantizeLinear", [x, p + "xs", p + "xz"], [p + "xq"]),
                  helper.make_node("DequantizeLinear", [p + "xq", p + "xs", p + "xz"], [p + "xd"]),
                  helper.make_node("DequantizeLinear", [p + "w", p + "ws", p + "wz"], [p + "wd"]),
                  helper.make_node("MatMul", [p + "xd", p + "wd"], [y])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [m_, k])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [m_, k])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    feeds = {"x": (rng.standard_normal((m_, k)) * 3).astype(np.float32)}
    (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
    from webiree.compiler import passes
    monkeypatch.setattr(passes, "lift_literals", lambda prog, **kw: prog)
    (unlifted,), res0, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
    np.testing.assert_array_equal(got, unlifted)
    # onnxruntime's h is a sum of f32 products, ours f32(integer sum) * scale: where an h lies on a
    # rounding boundary of the next QuantizeLinear the two differ by one step, which moves y by up
    # to 128 weight steps (0.3 * 0.004 each)
    (ref,) = ort_run(model, feeds)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2 * 128 * 0.3 * 0.004)
    assert np.mean(np.abs(got - ref) > 1e-4 * np.abs(ref).max()) < 0.2
    info = res.module.info["dispatches"]
    execs = ([d["exec"] for d in info], [d["exec"] for d in res0.module.info["dispatches"]])
    if limits == "cpu":
        assert [d["kind"] for d in info] == ["generic", "matmul"] * 3, info
        assert len(res.module.executables) == 4 and len(res0.module.executables) == 5, execs
        # the second and third packings share one executable (the products of the first two layers,
        # with no epilogue of their own, do without the pass too)
        assert info[2]["exec"] == info[4]["exec"] and info[1]["exec"] == info[3]["exec"], info
    else:   # each product packs its A (passes.pack_in_products); the last one's epilogue dequantizes y
        assert [d["kind"] for d in info] == ["matmul"] * 3, info
        assert execs == ([0, 1, 2], [0, 1, 2]), execs
    lifted = [np.asarray(t.data, np.uint32) for t in res.program.tensors.values() if t.name.endswith(":literals")]
    assert len(lifted) == 2, [t.name for t in res.program.tensors.values() if t.name.endswith(":literals")]
    # the packings' zero points among their words (the second and third layers': 120 and 125)
    assert sorted(int(w) for a in lifted for w in a if w in (120, 125)) == [120, 125], lifted


def _qdq_product_with_no_norm(rng, m_: int, k: int):
    """quantize_static's product as MobileBERT has them: x's NoNorm (x * s + t, a value a
    channel) -> Q/DQ -> MatMul (per-column int8 weights) + bias, then the next NoNorm and two
    residuals r and r2."""
    from onnx import numpy_helper
    w = rng.integers(-128, 128, size=(k, k)).astype(np.int8)
    f32 = lambda name, a: numpy_helper.from_array(np.asarray(a, np.float32), name)
    inits = [helper.make_tensor("w", T.INT8, [k, k], w.tobytes(), raw=True),
             f32("ws", rng.random(k) * 0.004 + 0.001), numpy_helper.from_array(np.zeros(k, np.int8), "wz"),
             f32("b", rng.standard_normal(k)), f32("gamma", rng.random(k) + 0.5), f32("beta", rng.standard_normal(k)),
             f32("s", rng.random(k) + 0.5), f32("t", rng.standard_normal(k)),
             f32("xs", 0.05), numpy_helper.from_array(np.array(131, np.uint8), "xz")]
    nodes = [helper.make_node("Mul", ["x", "s"], ["xm"]), helper.make_node("Add", ["xm", "t"], ["xn"]),
             helper.make_node("QuantizeLinear", ["xn", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["mb"]),
             helper.make_node("Mul", ["mb", "gamma"], ["g"]), helper.make_node("Add", ["g", "beta"], ["n"]),
             helper.make_node("Add", ["n", "r"], ["nr"]), helper.make_node("Add", ["nr", "r2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, T.FLOAT, [m_, k]) for n in ("x", "r", "r2")],
                          [helper.make_tensor_value_info("y", T.FLOAT, [m_, k])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    return model, {n: (rng.standard_normal((m_, k)) * 3).astype(np.float32) for n in ("x", "r", "r2")}


@pytest.mark.parametrize("limits", ["default", "cpu"])
def test_a_product_and_its_packer_stack_their_constants_to_fit_the_bindings(tmp_path, monkeypatch, limits):
    """A QDQ product between two NoNorms, with two residuals, would bind 9 buffers with its packing
    (x and its NoNorm's two constants, read by the packing; the words of B, their column sums, the
    fusion's stack of the scales, bias and second NoNorm, r, r2 and the output): the packing's and
    the product's f32 constants are stacked into one (passes._fits_packed), and on GPUs the
    product then packs A in its loads, one dispatch. The same values as the build without the
    packings in the products, and onnxruntime's to its rounding."""
    from webiree.compiler import passes
    model, feeds = _qdq_product_with_no_norm(np.random.default_rng(17), 16, 128)
    (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
    monkeypatch.setattr(passes, "PACKED_STACK_BYTES", 0)        # no stacking
    (unstacked,), res1, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
    monkeypatch.setattr(passes, "pack_in_products", lambda prog, **kw: prog)
    (unpacked,), res0, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
    np.testing.assert_array_equal(got, unpacked)
    np.testing.assert_array_equal(unstacked, unpacked)
    (ref,) = ort_run(model, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    kinds = [[d.kind for d in r.dispatches] for r in (res, res1, res0)]
    # one new stack: the fusion's (the bias and the NoNorms' constants, 4 x 128) with x's NoNorm's 2 x 128
    stacks = [(t.dtype, t.shape) for t in res.program.tensors.values() if ":stack" in t.name and t.name not in res1.program.tensors]
    if limits == "cpu":     # the packing stays a dispatch; its kernel and the product's read the stack all the same
        assert kinds == [["generic", "matmul"]] * 3, kinds
    else:
        assert kinds == [["matmul"], ["generic", "matmul"], ["generic", "matmul"]], kinds
        assert res.module.info["dispatches"][0]["precision"].endswith(", packs A in its loads")
    assert stacks == [("f32", (768,))], stacks


def test_a_packer_that_costs_more_than_the_bound_keeps_its_dispatch(tmp_path, monkeypatch):
    """An elementwise packer of A that computes more than passes.PACKER_MAX_COST a word stays a
    dispatch on GPUs (every column block of the product would compute it again: QDQ MiniLM's
    FFN-out packings made it 1.18x slower on an H100). The packer here (x's NoNorm, then
    QuantizeLinear) costs less than the bound, so it moves in; with the bound below its cost it
    stays a dispatch. The same values either way."""
    from webiree.compiler import passes
    model, feeds = _qdq_product_with_no_norm(np.random.default_rng(17), 16, 128)
    (got,), res, _ = compile_and_run(model, feeds, tmp_path)
    monkeypatch.setattr(passes, "PACKER_MAX_COST", 20)
    (kept,), res1, _ = compile_and_run(model, feeds, tmp_path)
    np.testing.assert_array_equal(got, kept)
    kinds = [[d.kind for d in r.dispatches] for r in (res, res1)]
    assert kinds == [["matmul"], ["generic", "matmul"]], kinds


def _producers_model(rng, m_: int, k: int, heads: int):
    """Three range-packs, each of another producer's result: a LayerNormalization, a product with
    its bias and Relu, and a batched product whose heads a Transpose and a Reshape put back side by
    side (attention's context: the range-pack's prologue permutes the product's result). Each
    packing feeds a MatMulInteger, dequantized; the results and the results divided by the
    activations' scales are outputs."""
    d = k // heads
    f = lambda a: helper.make_tensor(f"c{next(_ids)}", T.FLOAT, list(a.shape), a.ravel().tolist())
    ln_s, ln_b = f(rng.standard_normal(k).astype(np.float32)), f(rng.standard_normal(k).astype(np.float32))
    w1, b1 = f((rng.standard_normal((k, k)) * 0.2).astype(np.float32)), f(rng.standard_normal(k).astype(np.float32))
    wh = f((rng.standard_normal((heads, d, d)) * 0.3).astype(np.float32))
    shape_h = helper.make_tensor("shape_h", T.INT64, [3], [m_, heads, d])
    shape_m = helper.make_tensor("shape_m", T.INT64, [2], [m_, k])
    inits = [ln_s, ln_b, w1, b1, wh, shape_h, shape_m]
    nodes = [helper.make_node("LayerNormalization", ["x", ln_s.name, ln_b.name], ["ln"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["x", w1.name], ["mm"]), helper.make_node("Add", ["mm", b1.name], ["mb"]),
             helper.make_node("Relu", ["mb"], ["act"]),
             helper.make_node("Reshape", ["x", "shape_h"], ["xh"]), helper.make_node("Transpose", ["xh"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("MatMul", ["xt", wh.name], ["ctx"]), helper.make_node("Transpose", ["ctx"], ["ct"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["ct", "shape_m"], ["att"])]
    outs = []
    for i, src in enumerate(["ln", "act", "att"]):
        more, inits_i = _dynamic_projections(rng, k, k, [f"y{i}"])
        rename = {"x": src, "xq": f"q{i}", "xs": f"xs{i}", "xz": f"z{i}"}
        for node in more:
            node.input[:] = [rename.get(a, a if a.startswith(f"y{i}") else f"{a}_{i}") for a in node.input]
            node.output[:] = [rename.get(a, a if a.startswith(f"y{i}") else f"{a}_{i}") for a in node.output]
        for t in inits_i:
            t.name = f"{t.name}_{i}"
        nodes += more
        inits += inits_i
        # the result in steps of A's scale: a read of the scale after the product (as attention's of Q's)
        nodes.append(helper.make_node("Div", [f"y{i}", f"xs{i}"], [f"r{i}"]))
        outs += [helper.make_tensor_value_info(f"y{i}", T.FLOAT, [m_, k]), helper.make_tensor_value_info(f"r{i}", T.FLOAT, [m_, k])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [m_, k])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


_ids = iter(range(1 << 30))


@pytest.mark.parametrize("limits, targets", [("default", ("wgsl",)), ("cpu", ("wgsl",)), ("cpu", ("spirv",))])
def test_dynamic_quantization_reads_its_range_from_the_producer(tmp_path, monkeypatch, limits, targets):
    """The range-packs of a layernorm's, a product's (bias, Relu) and a permuted batched product's
    results read their ranges from the minima each producing workgroup recorded
    (passes.ranges_from_producers, kernels/quant_range.py), and give bit for bit the values of the
    build without the pass, and of a build whose producers have more workgroups than the slots
    (each records none, and the range-pack scans its input), for WGSL; onnxruntime's within a
    rounding step, also for SPIR-V. With GPU kernels each product quantizes its A itself from
    those minima (or, with none recorded, by scanning x) and stores the scale and zero point
    after the words, which the later divisions by the scales read; no range-pack runs
    (passes.pack_in_products)."""
    from webiree.compiler import passes
    from webiree.ir import program as P
    rng = np.random.default_rng(17)
    m = _producers_model(rng, 64, 128, 4)
    feeds = {"x": (rng.standard_normal((64, 128)) * 2).astype(np.float32)}
    got, res, _ = compile_and_run(m, feeds, tmp_path, limits=limits, targets=targets)
    packs = [op for op in res.program.ops if isinstance(op, P.QuantizeWords)]
    assert len(packs) == 3 and all(op.partials for op in packs), [(op.name, op.partials) for op in packs]
    plans = [d["precision"] for d in res.module.info["dispatches"]]
    assert sum(p.endswith(", records its result's range") for p in plans) == 3, plans
    # a GPU's products quantize A themselves (passes.pack_in_products); a CPU's read the range-packs' words
    gpu = limits == "default"
    reads = ", quantizes A in its loads (range from its producer)" if gpu else "u32, range from its producer"
    assert sum(p.endswith(reads) for p in plans) == 3, plans
    assert sum(d["kind"] == "quantizewords" for d in res.module.info["dispatches"]) == (0 if gpu else 3)
    ref = ort_run(m, feeds)
    assert len(got) == len(ref) == 6
    for g_, r in zip(got, ref):
        np.testing.assert_allclose(g_, r, rtol=1e-2, atol=2e-2 * float(np.abs(r).max()))
    if targets != ("wgsl",):
        return      # (the SPIR-V kernels are rendered from the same kernel IR as the WGSL ones)
    with monkeypatch.context() as mp:
        mp.setattr(P, "RANGE_SLOTS", 1)         # every producer has more workgroups than that
        few, res_few, _ = compile_and_run(m, feeds, tmp_path, limits=limits, targets=targets)
    assert sum(d["precision"].endswith(", records no range") for d in res_few.module.info["dispatches"]) == 3
    with monkeypatch.context() as mp:
        mp.setattr(passes, "ranges_from_producers", lambda prog: prog)
        plain, res_plain, _ = compile_and_run(m, feeds, tmp_path, limits=limits, targets=targets)
    assert not any(t.ranges for t in res_plain.program.tensors.values())
    assert len(few) == len(plain) == 6
    for g_, f_, p_ in zip(got, few, plain):
        np.testing.assert_array_equal(g_, p_)
        np.testing.assert_array_equal(f_, p_)


def test_a_range_pack_reads_the_range_of_a_permutation_only():
    """passes._permuted: the tensor a range-pack's prologue reads, where that prologue is one load
    whose index takes every value of [0, n) once (a transpose: its values are the tensor's, so is
    its range); a shifted window, a broadcast, arithmetic on the value or an index the check
    cannot evaluate give None (the range-pack then scans its input)."""
    from webiree.compiler.passes import _permuted
    from webiree.ir import kir
    from webiree.ir.program import O
    n = 4 * 3 * 8
    heads = (O // 8 % 3) * 32 + (O // 24) * 8 + O % 8          # [4, 3, 8] -> [3, 4, 8]
    assert _permuted(kir.load("t", heads, "f32"), n) == "t"
    assert _permuted(kir.load("t", O, "f32"), n) == "t"
    assert _permuted(kir.load("t", O + 1, "f32"), n) is None              # a window shifted by one
    assert _permuted(kir.load("t", O % 16, "f32"), n) is None             # a broadcast
    assert _permuted(kir.load("t", O, "f32") * 2.0, n) is None            # not the tensor's values
    assert _permuted(kir.load("t", kir.binary("shr", O, kir.i32(1)), "f32"), n) is None
    assert _permuted(kir.load("t", O, "i32"), n) is None
