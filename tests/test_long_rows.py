"""Rows longer than one invocation may loop over on llvmpipe (wgsl_codegen/config.py,
SERIAL_LOOP_ITERATIONS): lavapipe ends every loop of an invocation after 65,535 back-edges in
all, silently. Softmax over a row of 64,000 ran one row per invocation in the CPU kernels (three
passes: 192,000 iterations) and came out wrong everywhere; a ReduceSum of 8 Mi elements summed
only the first 4 Mi; a MatMul with K = 300,000 in the CPU kernels (K in steps of 4) was off by 13%. Each is compared with numpy in both kernel classes of a default build.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import webiree


def _model(node, x_shape, y_shape, inits=()):
    g = helper.make_graph([node], "long_rows", [helper.make_tensor_value_info("x", T.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", T.FLOAT, y_shape)], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _neg_then(node, x_shape, y_shape):
    m = _model(node, x_shape, y_shape)
    m.graph.node.insert(0, helper.make_node("Neg", ["x"], ["n"]))
    return m


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layernorm(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)


_W300K = np.random.default_rng(1).uniform(0.0, 1.0, (300000, 8)).astype(np.float32)

CASES = {
    "softmax_64000": (lambda: _model(helper.make_node("Softmax", ["x"], ["y"], axis=-1), [2, 64000], [2, 64000]),
                      [2, 64000], _softmax),
    "softmax_1280000": (lambda: _model(helper.make_node("Softmax", ["x"], ["y"], axis=-1), [1, 1280000],
                                       [1, 1280000]), [1, 1280000], _softmax),
    "layernorm_64000": (lambda: _model(helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-1),
                                       [2, 64000], [2, 64000],
                                       [onnx.numpy_helper.from_array(np.ones(64000, np.float32), "s")]),
                        [2, 64000], _layernorm),
    "reducesum_8Mi": (lambda: _model(helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0), [1 << 23], []),
                      [1 << 23], lambda x: x.astype(np.float64).sum()),
    # the CPU register-blocked matmul steps K by 4 in one invocation: 75,000 iterations here (it
    # was wrong by 0.13); such a product is split over K instead
    # a pooling window over the whole 300 x 300 input looped 90,000 times in one invocation: the
    # average of the first 65,535 (off by 2.6e-3); now a global reduction
    "averagepool_300x300": (lambda: _model(helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[300, 300]),
                                           [1, 4, 300, 300], [1, 4, 1, 1]),
                            [1, 4, 300, 300], lambda x: x.mean((2, 3), keepdims=True)),
    # (of -x: the largest of uniform values is near 1 in any 65,535 of them, the smallest is not)
    "maxpool_300x300": (lambda: _neg_then(helper.make_node("MaxPool", ["n"], ["y"], kernel_shape=[300, 300]),
                                          [1, 4, 300, 300], [1, 4, 1, 1]),
                        [1, 4, 300, 300], lambda x: (-x).max((2, 3), keepdims=True)),
    "matmul_k300000": (lambda: _model(helper.make_node("MatMul", ["x", "w"], ["y"]), [4, 300000], [4, 8],
                                      [onnx.numpy_helper.from_array(_W300K, "w")]),
                       [4, 300000], lambda x: x @ _W300K.astype(np.float64)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_long_row_is_computed_whole(case, tmp_path):
    make, shape, ref = CASES[case]
    webiree.compile(make(), tmp_path / case, variants="gpu,cpu")
    x = np.random.default_rng(0).uniform(0.0, 1.0, shape).astype(np.float32)
    want = np.asarray(ref(x.astype(np.float64)), np.float64)
    for variant in ("gpu", "cpu"):
        (y,) = webiree.InferenceSession(tmp_path / case, variant=variant).run(None, {"x": x})
        assert y.shape == want.shape, (variant, y.shape)
        err = float(np.abs(y - want).max() / np.abs(want).max())
        assert err <= 1e-4, f"{case} ({variant} kernels): max rel. error {err:.2e}"


def test_a_window_past_the_loop_limit_is_refused(tmp_path):
    """A window that is not the whole input and holds more than 65,535 elements cannot be one
    invocation's loop: a LimitsError names the op and the limit (never a wrong result)."""
    model = _model(helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[260, 260]), [1, 1, 300, 300],
                   [1, 1, 41, 41])
    with pytest.raises(webiree.LimitsError, match=r"loops over 67,600 elements for each output.*65,535"):
        webiree.compile(model, tmp_path)
