"""Reads that do not vary are made once (ir/kir.py hoist_invariants, share_reads): what is moved,
what must stay, and that a kernel's values do not change."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from webiree.ir import kir
from webiree.ir.kir import For, If, Let, Store, i32, lvar
from webiree.testing.models import IR_VERSION

from .conftest import compile_and_run, ort_run


def _lets(body):
    return [s for s in body if isinstance(s, Let)]


def test_an_invariant_read_leaves_the_loop():
    """A scale read at a fixed index of a buffer the kernel only reads, and arithmetic on it, move to
    the kernel's top; the loop's own reads, a read of the written buffer and a read at a varying
    index stay where they are."""
    k = lvar("k", "i32")
    scale = kir.load("b1", i32(0), "f32") * 2.0
    body = [For("k", i32(0), i32(8), [
        Store("b2", k, kir.load("b0", k, "f32") * scale + kir.load("b2", i32(0), "f32")),
    ])]
    out = kir.hoist_invariants(body, {"b2"})
    (let,) = _lets(out)
    assert let.value is scale
    loop = out[-1]
    stored = loop.body[0].value
    reads = {(n.attr, n.args[0].is_const) for n in kir.walk(stored) if n.op == "load"}
    assert reads == {("b0", False), ("b2", True)}, reads       # the written buffer's read stays
    assert kir.var(let.name, "f32") in set(kir.walk(stored))


def test_the_leading_sizes_count_as_invariant():
    """A read indexed by a size bound at the top (bind_dims' `sz` lets) is hoisted after them."""
    body = [Let("sz0", kir.load("dims", i32(1), "i32")),
            For("k", i32(0), lvar("sz0", "i32"), [Store("b2", lvar("k", "i32"),
                                                       kir.load("b1", lvar("sz0", "i32") - 1, "f32"))])]
    out = kir.hoist_invariants(body, {"b2"})
    assert [s.name for s in _lets(out)] == ["sz0", "inv0"]
    assert out[1].value.op == "load" and out[1].value.attr == "b1"


def test_stores_share_a_column_read():
    """Four stores of two rows x two columns read each column's bias once; a read of the written
    buffer is not shared."""
    stores = []
    for r in range(2):
        for c in range(2):
            v = lvar(f"acc{r}{c}", "f32") + kir.load("bias", i32(c), "f32") + kir.load("out", i32(0), "f32")
            stores.append(If(lvar("ok", "bool"), [Store("out", i32(r * 2 + c), v)]))
    out = kir.share_reads(stores, {"out"})
    lets = _lets(out)
    assert [lt.value.attr for lt in lets] == ["bias", "bias"]
    assert {lt.value.args[0].attr for lt in lets} == {0, 1}
    assert len(out) == len(lets) + 4


def test_hoisting_keeps_the_values(tmp_path):
    """A dequantized int8 product whose scale is read from a small table, with a bias and a residual:
    the same values as onnxruntime after the kernels' reads are hoisted and shared."""
    rng = np.random.default_rng(4)
    m, k, n = 40, 64, 48
    w = rng.integers(-128, 128, size=(k, n)).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["p"]),
             helper.make_node("Cast", ["p"], ["pf"], to=T.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]), helper.make_node("Mul", ["pf", "s"], ["d"]),
             helper.make_node("Add", ["d", "bias"], ["db"]), helper.make_node("Add", ["db", "x2"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [m, k]),
                                       helper.make_tensor_value_info("x2", T.FLOAT, [m, n])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [m, n])],
                          [helper.make_tensor("w", T.INT8, [k, n], w.tobytes(), raw=True),
                           numpy_helper.from_array(np.array(0.003, np.float32), "ws"),
                           numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    feeds = {"x": rng.standard_normal((m, k)).astype(np.float32), "x2": rng.standard_normal((m, n)).astype(np.float32)}
    for limits in ("gpu", "adapter"):
        (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
        np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)
        (mm,) = [d for d in res.dispatches if d.kind == "matmul"]
        tops = [s.name for s in mm.kernel.body if isinstance(s, Let)]
        assert any(name.startswith("inv") for name in tops), tops      # the scale, read once


def _qdq_convs(c=32, m=48):
    """x -> Conv 1x1 (c -> m) -> Relu -> depthwise Conv 3x3 -> y, each weight int8 through a
    per-channel DequantizeLinear (axis 0, zero points not 0), as quantize_static writes them."""
    rng = np.random.default_rng(8)
    nodes, inits = [], []
    for name, shape in (("w1", [m, c, 1, 1]), ("w2", [m, 1, 3, 3])):
        inits += [helper.make_tensor(f"{name}q", T.INT8, shape, rng.integers(-100, 100, size=shape).astype(np.int8).tobytes(), raw=True),
                  numpy_helper.from_array((rng.random(m) * 0.02 + 0.001).astype(np.float32), f"{name}s"),
                  helper.make_tensor(f"{name}z", T.INT8, [m], rng.integers(-3, 4, size=m).astype(np.int8).tobytes(), raw=True)]
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}q", f"{name}s", f"{name}z"], [name], axis=0))
    nodes += [helper.make_node("Conv", ["x", "w1"], ["p"]), helper.make_node("Relu", ["p"], ["r"]),
              helper.make_node("Conv", ["r", "w2"], ["y"], group=m, pads=[1] * 4)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, c, 12, 12])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, m, 12, 12])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def test_a_channels_scale_is_read_once(tmp_path):
    """Per-channel dequantized weights: a 1x1 convolution's product (A the weights, a vec4 of K a
    row) reads each row's scale and zero point once, not once per lane, and its four int8 values
    as one word; a depthwise window's nine weights share one read of each. Same values as
    onnxruntime."""
    from webiree.wgsl_codegen.kernels.common import Strategy
    model = _qdq_convs()
    feeds = {"x": np.random.default_rng(9).standard_normal([1, 32, 12, 12]).astype(np.float32)}
    limits = {"device_class": "cpu", "subgroup_size": 8}
    (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)

    def reads(d, tensor):
        slot = f"b{d.tensors.index(tensor)}"
        nodes = {n for s in kir.statements(d.kernel.body) for e in kir.stmt_exprs(s) for n in kir.walk(e)}
        return len({n for n in nodes if n.op == "load" and n.attr == slot})
    mm, dw = res.dispatches
    assert (mm.config.strategy, dw.config.strategy) == (Strategy.SUBGROUP_BROADCAST, Strategy.ROW_BLOCK)
    rows = mm.config.tile.rows
    # the scales and zero points are small: both in the constant table, one read each a row
    assert reads(mm, "__const_table") == 2 * rows, (reads(mm, "__const_table"), rows)
    assert reads(mm, "w1q") == rows                                 # the row's 4 values: one word
    assert reads(dw, "__const_table") == 2
