"""onnxruntime's contrib operators (com.microsoft, and the few it defines in the default
domain) against onnxruntime (CPU); BiasAdd and BiasSplitGelu, which onnxruntime runs only
on GPUs, against numpy formulas of its documentation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from webiree.errors import UnsupportedOpError
from webiree.testing.models import IR_VERSION, sample_inputs

from .conftest import assert_close, compile_and_run

F = TensorProto.FLOAT
MS = "com.microsoft"


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def ms_model(nodes, inputs, outputs, inits=None, opset=17):
    """A model importing com.microsoft; outputs are (name, shape) pairs (ONNX cannot infer them)."""
    g = helper.make_graph(nodes, "contrib", [vi(n, s) for n, s in inputs], [vi(n, s) for n, s in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=IR_VERSION)


def node(op, ins, outs, domain=MS, **attrs):
    return helper.make_node(op, ins, outs, name=f"{op.lower()}_node", domain=domain, **attrs)


def rng_inits(seed=0, **shapes):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def refused(model, tmp_path, *words):
    """Compiling `model` raises one UnsupportedOpError naming the node and these words."""
    with pytest.raises(UnsupportedOpError) as e:
        compile_and_run(model, sample_inputs(model), tmp_path)
    text = str(e.value)
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"


def gelu_erf(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


# --- activations ------------------------------------------------------------------

def test_gelu(check):
    check(ms_model([node("Gelu", ["x"], ["y"])], [("x", [2, 5, 16])], [("y", [2, 5, 16])]))


@pytest.mark.parametrize("bias_as", ["none", "input", "initializer"])
def test_fast_gelu(check, bias_as):
    ins = [("x", [2, 5, 16])] + ([("b", [16])] if bias_as == "input" else [])
    inits = rng_inits(b=[16]) if bias_as == "initializer" else {}
    check(ms_model([node("FastGelu", ["x", "b"] if bias_as != "none" else ["x"], ["y"])], ins,
                   [("y", [2, 5, 16])], inits))


def test_bias_gelu(check):
    check(ms_model([node("BiasGelu", ["a", "b"], ["y"])], [("a", [3, 4, 8])], [("y", [3, 4, 8])],
                   rng_inits(b=[8])))


@pytest.mark.parametrize("alpha", [None, 1.0, -0.5])
def test_quick_gelu(check, alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    check(ms_model([node("QuickGelu", ["x"], ["y"], **attrs)], [("x", [4, 33])], [("y", [4, 33])]))


def test_bias_add(tmp_path):
    m = ms_model([node("BiasAdd", ["x", "b", "s"], ["y"])], [("x", [2, 3, 8]), ("s", [2, 3, 8])],
                 [("y", [2, 3, 8])], rng_inits(b=[8]))
    feeds = sample_inputs(m)
    got, _, _ = compile_and_run(m, feeds, tmp_path)
    b = numpy_helper.to_array(m.graph.initializer[0])
    assert_close(got[0], feeds["x"] + b + feeds["s"])


def test_bias_split_gelu(tmp_path):
    m = ms_model([node("BiasSplitGelu", ["x", "b"], ["y"])], [("x", [2, 6, 16])], [("y", [2, 6, 8])],
                 rng_inits(b=[16]))
    feeds = sample_inputs(m)
    got, _, _ = compile_and_run(m, feeds, tmp_path)
    a = feeds["x"].astype(np.float64) + numpy_helper.to_array(m.graph.initializer[0])
    assert_close(got[0], a[..., :8] * gelu_erf(a[..., 8:]))


def test_activation_feeds_matmul_epilogue(check):
    """FastGelu after a MatMul + bias: the pattern the BERT optimizer leaves."""
    inits = rng_inits(w=[16, 32], b=[32])
    check(ms_model([helper.make_node("MatMul", ["x", "w"], ["h"]), node("FastGelu", ["h", "b"], ["y"])],
                   [("x", [2, 4, 16])], [("y", [2, 4, 32])], inits))
