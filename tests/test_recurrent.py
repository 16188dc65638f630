"""RNN, GRU and LSTM gate activations are the elementwise ops' own (compiler/ops/elementwise.py):
a recurrent Softplus does not overflow and a recurrent HardSigmoid keeps NaN.

onnxruntime's RNN/GRU/LSTM kernels accept these activations but compute them their own way:
Softplus as log(1 + exp(x)) (inf at x = 100) and HardSigmoid with a min/max that turns NaN into
0. So the reference here is a numpy reading of the ONNX spec's equations, with Softplus and
HardSigmoid as onnxruntime's Softplus and HardSigmoid *operators* compute them (checked first).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from webiree.testing.models import make_model

from .conftest import assert_close, compile_and_run, ort_run

F = TensorProto.FLOAT
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SEQ, BATCH, INP, HID = 3, 2, 2, 3


def softplus(x):
    with np.errstate(invalid="ignore"):     # NaN in, NaN out
        return np.logaddexp(0.0, x)


def hard_sigmoid(x):
    return np.clip(0.2 * x + 0.5, 0.0, 1.0)     # np.clip keeps NaN


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


NUMPY = {"Softplus": softplus, "HardSigmoid": hard_sigmoid, "Sigmoid": sigmoid, "Tanh": np.tanh}


def reference(kind, acts, x, w, r, b):
    """Y and Y_h of a forward RNN/GRU/LSTM by the ONNX spec's equations (float64, no peepholes,
    linear_before_reset=0); gate order z r h (GRU), i o f c (LSTM)."""
    f = [NUMPY[a] for a in acts]
    w, r = w[0].astype(np.float64), r[0].astype(np.float64)
    wb, rb = np.split(b[0].astype(np.float64), 2)
    h = np.zeros([BATCH, HID])
    c = np.zeros([BATCH, HID])
    ys = []
    for xt in x.astype(np.float64):
        def gate(g, hh=None):
            rows = slice(g * HID, (g + 1) * HID)
            hh = h if hh is None else hh
            return xt @ w[rows].T + hh @ r[rows].T + wb[rows] + rb[rows]
        if kind == "RNN":
            h = f[0](gate(0))
        elif kind == "GRU":
            z, rr = f[0](gate(0)), f[0](gate(1))
            hh = f[1](gate(2, rr * h))
            h = (1.0 - z) * hh + z * h
        else:
            i, o, fg, cc = f[0](gate(0)), f[0](gate(1)), f[0](gate(2)), f[1](gate(3))
            c = fg * c + i * cc
            h = o * f[2](c)
        ys.append(h)
    return np.stack(ys)[:, None].astype(np.float32), h[None].astype(np.float32)


def recurrent_model(kind, acts, seed=0):
    rng = np.random.default_rng(seed)
    g = GATES[kind]
    w = np.full([1, g * HID, INP], 0.5, np.float32)      # every gate sees sum(x) / 2 ...
    r = rng.uniform(-0.05, 0.05, [1, g * HID, HID]).astype(np.float32)   # ... plus a little history
    b = rng.uniform(-0.5, 0.5, [1, 2 * g * HID]).astype(np.float32)
    node = helper.make_node(kind, ["X", "W", "R", "B"], ["Y", "Y_h"], hidden_size=HID, activations=acts)
    model = make_model([node], [helper.make_tensor_value_info("X", F, [SEQ, BATCH, INP])],
                       [helper.make_tensor_value_info("Y", F, [SEQ, 1, BATCH, HID]),
                        helper.make_tensor_value_info("Y_h", F, [1, BATCH, HID])],
                       {"W": w, "R": r, "B": b})
    return model, (w, r, b)


def activation_model(op):
    node = helper.make_node(op, ["x"], ["y"])
    return make_model([node], [helper.make_tensor_value_info("x", F, [3])],
                      [helper.make_tensor_value_info("y", F, [3])], {})


def test_numpy_activations_are_onnxruntimes_operators():
    """The reference's Softplus and HardSigmoid give what onnxruntime's own operators give at the
    points the tests below probe: Softplus(100) = 100, HardSigmoid(NaN) = NaN."""
    x = np.array([100.0, -3.0, np.nan], np.float32)
    for op in ("Softplus", "HardSigmoid"):
        (got,) = ort_run(activation_model(op), {"x": x})
        assert_close(NUMPY[op](x.astype(np.float64)).astype(np.float32), got, name=op)
    assert ort_run(activation_model("Softplus"), {"x": x})[0][0] == 100.0


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("act", ["Softplus", "HardSigmoid"])
def test_reference_is_onnxruntimes_kernel_on_ordinary_inputs(kind, act):
    """Where onnxruntime's own kernels are exact (finite inputs of moderate size), the numpy
    reference gives what they give: its equations, gate order and weight layout are right."""
    acts = [act] * {"RNN": 1, "GRU": 2, "LSTM": 3}[kind]
    model, (w, r, b) = recurrent_model(kind, acts)
    x = np.random.default_rng(2).uniform(-2.0, 2.0, [SEQ, BATCH, INP]).astype(np.float32)
    for got, want, name in zip(ort_run(model, {"X": x}), reference(kind, acts, x, w, r, b), ("Y", "Y_h")):
        assert_close(want, got, name=f"{kind} {name}", elementwise=True)


SOFTPLUS = {"RNN": ["Softplus"], "GRU": ["Sigmoid", "Softplus"], "LSTM": ["Sigmoid", "Softplus", "Softplus"]}


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_softplus_activation_at_100_is_finite(kind, tmp_path):
    """Gates at x = 100 (inputs of 100, weights of 0.5): a Softplus activation gives ~100, not the inf
    of log(1 + exp(100)) in float32."""
    model, (w, r, b) = recurrent_model(kind, SOFTPLUS[kind])
    x = np.full([SEQ, BATCH, INP], 100.0, np.float32)
    x[:, 1] = np.linspace(-100.0, 100.0, SEQ * INP, dtype=np.float32).reshape(SEQ, INP)   # both signs
    got, _, _ = compile_and_run(model, {"X": x}, tmp_path)
    want = reference(kind, SOFTPLUS[kind], x, w, r, b)
    for g, ref, name in zip(got, want, ("Y", "Y_h")):
        assert np.isfinite(g).all(), f"{kind} {name}: {g}"
        assert_close(g, ref, name=f"{kind} {name}", elementwise=True)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_hard_sigmoid_activation_keeps_nan(kind, tmp_path):
    """Every activation HardSigmoid: a NaN input at the first step makes that sequence's gates, and
    so its states, NaN (the HardSigmoid operator keeps NaN); the other sequence is unaffected."""
    acts = ["HardSigmoid"] * {"RNN": 1, "GRU": 2, "LSTM": 3}[kind]
    model, (w, r, b) = recurrent_model(kind, acts)
    x = np.random.default_rng(1).uniform(-2.0, 2.0, [SEQ, BATCH, INP]).astype(np.float32)
    x[0, 0, 0] = np.nan
    got, _, _ = compile_and_run(model, {"X": x}, tmp_path)
    want = reference(kind, acts, x, w, r, b)
    for g, ref, name in zip(got, want, ("Y", "Y_h")):
        assert np.isnan(g[..., 0, :]).all() and np.isfinite(g[..., 1, :]).all(), f"{kind} {name}: {g}"
        assert_close(g, ref, name=f"{kind} {name}", elementwise=True)
