"""Every foundation op and fused pattern against onnxruntime (CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from webiree.testing.models import make_model

F = TensorProto.FLOAT


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def single(op, in_shapes, out_shape, attrs=None, inits=None, opset=17, out_type=F, in_types=None, extra_inputs=()):
    names = [f"x{i}" for i in range(len(in_shapes))]
    node = helper.make_node(op, names + list(extra_inputs), ["y"], **(attrs or {}))
    in_types = in_types or [F] * len(in_shapes)
    return make_model([node], [vi(n, s, t) for n, s, t in zip(names, in_shapes, in_types)],
                      [vi("y", out_shape, out_type)], inits or {}, opset=opset)


UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Floor", "Ceil", "Erf", "Softsign", "Softplus",
         "HardSwish", "Sin", "Cos", "Atan", "Sign", "Reciprocal", "Elu", "Selu", "Mish", "Round"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op, check):
    check(single(op, [[3, 17]], [3, 17], opset=18 if op == "Mish" else 17))


def test_sqrt_log_on_positive(check, tmp_path):
    rng = np.random.default_rng(1)
    x = rng.uniform(0.1, 5, (4, 9)).astype(np.float32)
    for op in ("Sqrt", "Log"):
        check(single(op, [[4, 9]], [4, 9]), feeds={"x0": x})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", [([2, 3, 4], [2, 3, 4]), ([2, 3, 4], [4]), ([2, 1, 4], [3, 1]), ([1], [5, 2])])
def test_binary_broadcast(op, shapes, check):
    a, b = shapes
    out = list(np.broadcast_shapes(tuple(a), tuple(b)))
    check(single(op, [a, b], out))


def test_pow_and_constant_exponents(check):
    m = make_model([helper.make_node("Pow", ["x", "three"], ["y"]), helper.make_node("Pow", ["x", "half_exp"], ["z"])],
                   [vi("x", [2, 5])], [vi("y", [2, 5]), vi("z", [2, 5])],
                   {"three": np.array(3.0, np.float32), "half_exp": np.array(2.0, np.float32)})
    check(m)


def test_clip_relu6_and_leaky(check):
    m = make_model([helper.make_node("Clip", ["x", "lo", "hi"], ["c"]),
                    helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.2)],
                   [vi("x", [4, 8])], [vi("y", [4, 8])],
                   {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)})
    check(m, feeds={"x": np.linspace(-3, 3, 32, dtype=np.float32).reshape(4, 8)})


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_transposes(ta, tb, check):
    M, K, N = 37, 29, 41
    a = [K, M] if ta else [M, K]
    b = [N, K] if tb else [K, N]
    rng = np.random.default_rng(2)
    m = make_model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=ta, transB=tb, alpha=0.7, beta=1.3)],
                   [vi("a", a)], [vi("y", [M, N])],
                   {"b": rng.standard_normal(b).astype(np.float32), "c": rng.standard_normal([N]).astype(np.float32)})
    check(m)


@pytest.mark.parametrize("sa,sb", [([70, 33], [33, 65]), ([2, 3, 20, 8], [2, 3, 8, 20]), ([4, 9, 16], [16, 7]),
                                   ([3, 1, 5, 6], [2, 6, 4]), ([8], [8, 3]), ([5, 8], [8])])
def test_matmul_batched_broadcast(sa, sb, check):
    out = list(np.matmul(np.zeros(sa), np.zeros(sb)).shape)
    check(single("MatMul", [sa, sb], out))


@pytest.mark.parametrize("kw", [
    dict(pads=[1, 1, 1, 1]),
    dict(strides=[2, 2], pads=[1, 0, 1, 0]),
    dict(dilations=[2, 2], pads=[2, 2, 2, 2]),
    dict(group=4, pads=[1, 1, 1, 1]),                       # grouped
    dict(group=8, strides=[2, 2], pads=[1, 1, 1, 1]),       # depthwise strided
    dict(group=8, dilations=[4, 4], pads=[4, 4, 4, 4]),     # depthwise dilated
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
])
def test_conv2d(kw, check):
    rng = np.random.default_rng(3)
    group = kw.get("group", 1)
    cin, cout = 8, 8 if group == 8 else 12
    w = rng.standard_normal([cout, cin // group, 3, 3]).astype(np.float32)
    b = rng.standard_normal([cout]).astype(np.float32)
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **kw)], [vi("x", [1, cin, 15, 13])],
                   [vi("y", None)], {"w": w, "b": b})
    check(m)


def test_conv_1x1_and_no_bias(check):
    rng = np.random.default_rng(4)
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [vi("x", [2, 6, 7, 7])], [vi("y", None)],
                   {"w": rng.standard_normal([10, 6, 1, 1]).astype(np.float32)})
    check(m)


def _pad_conv(value=None, other_reader=None):
    """x -> Pad (spatial pads 1,2 / 2,1 with `value`) -> Conv 3x3 (own pads 1) -> y; `other_reader`
    ("sum" or "conv") reads the padded tensor too, for a second output."""
    rng = np.random.default_rng(5)
    inits = {"pads": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
             "w": rng.standard_normal([4, 3, 3, 3]).astype(np.float32), "b": rng.standard_normal([4]).astype(np.float32)}
    pad_in = ["x", "pads"]
    if value is not None:
        inits["v"] = np.array(value, np.float32)
        pad_in.append("v")
    nodes = [helper.make_node("Pad", pad_in, ["p"], name="pad"),
             helper.make_node("Conv", ["p", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    outs = [vi("y", None)]
    if other_reader == "sum":
        nodes.append(helper.make_node("ReduceSum", ["p"], ["s"], name="sum", keepdims=0))
        outs.append(vi("s", None))
    elif other_reader == "conv":
        inits["w2"] = rng.standard_normal([2, 3, 2, 2]).astype(np.float32)
        nodes.append(helper.make_node("Conv", ["p", "w2"], ["z"], name="conv2", strides=[2, 2]))
        outs.append(vi("z", None))
    return make_model(nodes, [vi("x", [1, 3, 6, 5])], outs, inits)


def _conv_ops(res):
    from webiree.ir.program import Conv
    return [op for op in res.program.ops if isinstance(op, Conv)]


def test_zero_pad_folds_into_conv(check):
    """passes.fold_pad_into_conv: the Conv reads x with the Pad's zeros added to its own pads; no
    dispatch computes the padded tensor. Two Convs sharing the pad both take it."""
    res = check(_pad_conv())
    (op,) = _conv_ops(res)
    assert op.x == "x" and op.pads == (2, 3, 3, 2)
    assert all("pad" not in op.nodes for op in res.program.ops)
    res = check(_pad_conv(other_reader="conv"))
    assert [(op.x, op.pads) for op in _conv_ops(res)] == [("x", (2, 3, 3, 2)), ("x", (1, 2, 2, 1))]
    assert all("pad" not in op.nodes for op in res.program.ops)


def test_pad_with_another_reader_or_a_value_is_not_folded(check):
    """A padded tensor something else reads too, or padded with a value other than 0, is computed; the
    Conv reads it with its own pads."""
    for model in (_pad_conv(other_reader="sum"), _pad_conv(value=1.5)):
        (op,) = _conv_ops(check(model))
        assert op.x != "x" and op.pads == (1, 1, 1, 1)


@pytest.mark.parametrize("op,kw", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[3, 3], dilations=[2, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
])
def test_pooling(op, kw, check):
    check(single(op, [[1, 5, 11, 9]], None, kw))


# Softmax and the normalizations are compared element by element too (tests/conftest.py): their
# small entries carry the result, and a scale-relative bound cannot see them.
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax(axis, check):
    check(single("Softmax", [[3, 7, 5]], [3, 7, 5], {"axis": axis}), elementwise=True)


def test_softmax_large_values_is_stable(check):
    """Inputs near 1000 overflow exp() unless the row maximum is subtracted; the spread of 0.5
    keeps every entry of the result well away from 0 and 1."""
    x = (1000.0 + np.arange(24, dtype=np.float32).reshape(2, 12) * 0.5)
    x[1] *= -1
    check(single("Softmax", [[2, 12]], [2, 12]), feeds={"x0": x}, elementwise=True)


def test_softmax_long_row(check):
    check(single("Softmax", [[2, 1000]], [2, 1000]), elementwise=True)


def test_softmax_opset11_coerces_to_2d(check):
    check(single("Softmax", [[2, 3, 4]], [2, 3, 4], {"axis": 1}, opset=11), elementwise=True)


def test_elementwise_tolerance_sees_small_entries():
    """The comparison the softmax and normalization tests use fails a softmax with half its
    entries zeroed, which the scale-relative bound alone lets through."""
    from tests.conftest import assert_close

    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32) * 5   # peaked rows
    ref = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    bad = ref.copy()
    bad[bad < np.median(bad)] = 0
    assert_close(bad, ref)                       # within 1e-4 of the scale ...
    with pytest.raises(AssertionError, match="elements differ"):
        assert_close(bad, ref, elementwise=True)  # ... but not element by element
    assert_close(ref * (1 + 1e-5), ref, elementwise=True)


NORMS = {
    "LayerNormalization_last": ("LayerNormalization", [[3, 5, 16], [16], [16]], [3, 5, 16], {"axis": -1}, 17),
    "LayerNormalization_axis1": ("LayerNormalization", [[3, 5, 16], [5, 16], [5, 16]], [3, 5, 16],
                                 {"axis": 1, "epsilon": 1e-3}, 17),
    "InstanceNormalization": ("InstanceNormalization", [[2, 4, 6, 5], [4], [4]], [2, 4, 6, 5], {}, 17),
    "BatchNormalization": ("BatchNormalization", [[2, 4, 6, 5], [4], [4], [4], [4]], [2, 4, 6, 5], {}, 15),
    "GroupNormalization": ("GroupNormalization", [[2, 6, 4, 5], [6], [6]], [2, 6, 4, 5], {"num_groups": 3}, 21),
    "LRN": ("LRN", [[2, 7, 4, 4]], [2, 7, 4, 4], {"size": 3}, 17),
    "LpNormalization": ("LpNormalization", [[3, 9]], [3, 9], {"axis": -1, "p": 2}, 17),
    "MeanVarianceNormalization": ("MeanVarianceNormalization", [[2, 3, 4, 5]], [2, 3, 4, 5], {}, 17),
}


@pytest.mark.parametrize("name", list(NORMS))
def test_normalization(name, check):
    op, shapes, out, attrs, opset = NORMS[name]
    m = single(op, shapes, out, attrs, opset=opset)
    feeds = {f"x{i}": np.random.default_rng(i).standard_normal(sh).astype(np.float32) for i, sh in enumerate(shapes)}
    if op == "BatchNormalization":
        feeds["x4"] = np.abs(feeds["x4"]) + 0.5       # a variance
    check(m, feeds=feeds, elementwise=True)


def test_flatten_reshape_are_views(tmp_path):
    from tests.conftest import check_model
    m = make_model([helper.make_node("Flatten", ["x"], ["f"], axis=2),
                    helper.make_node("Reshape", ["f", "shape"], ["r"]),
                    helper.make_node("Relu", ["r"], ["y"])],
                   [vi("x", [2, 3, 4, 5])], [vi("y", [6, 20])], {"shape": np.array([6, -1], np.int64)})
    res = check_model(m, tmp_path)
    assert len(res.dispatches) == 1


def test_reshape_output_of_graph(check):
    m = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])],
                   [vi("x", [2, 6])], [vi("y", [3, 4])], {"s": np.array([3, 4], np.int64)})
    check(m)


def test_identity_model_output_is_input(check):
    check(make_model([helper.make_node("Identity", ["x"], ["y"])], [vi("x", [3, 3])], [vi("y", [3, 3])], {}))


def test_constant_folding_of_shape_subgraph(tmp_path):
    from tests.conftest import check_model
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y0"]),
             helper.make_node("Sigmoid", ["y0"], ["y"])]
    m = make_model(nodes, [vi("x", [2, 3, 4])], [vi("y", [2, 12])],
                   {"zero": np.array(0, np.int64), "ax": np.array([0], np.int64), "minus1": np.array([-1], np.int64)})
    res = check_model(m, tmp_path)
    assert len(res.dispatches) == 1


def test_elementwise_prologue_feeds_reduction_and_softmax(check):
    """A lone elementwise producer is computed inside the reduction's loads (prologue fusion)."""
    m = make_model([helper.make_node("Sigmoid", ["x"], ["s"]),
                    helper.make_node("ReduceMean", ["s"], ["y"], axes=[1], keepdims=0),
                    helper.make_node("Mul", ["x", "two"], ["x2"]),
                    helper.make_node("Softmax", ["x2"], ["z"], axis=1),
                    helper.make_node("Neg", ["x"], ["n"]),
                    helper.make_node("MaxPool", ["n"], ["p"], kernel_shape=[2])],
                   [vi("x", [3, 8, 5])], [vi("y", [3, 5]), vi("z", [3, 8, 5]), vi("p", [3, 8, 4])],
                   {"two": np.array(2.0, np.float32)}, opset=17)
    res = check(m, elementwise=True)
    assert len(res.dispatches) == 3


def test_non_finite_constants_render_without_const_expressions(tmp_path):
    """Tint rejects non-finite WGSL const-expressions; every inf/NaN literal goes through wi_f32()."""
    import webiree
    m = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], [vi("x", [1, 2, 4, 4])],
                   [vi("y", [1, 2, 3, 3])], {})
    res = webiree.compile(m, tmp_path)
    text = "".join(t for _, t in res.shaders)
    assert "wi_f32(0xff800000u)" in text and "bitcast<f32>(0xff800000u)" not in text.replace("return bitcast", "")
