"""Shared test helpers: compile a model, run it natively, compare with onnxruntime.

Tolerance (fp32): max |webiree - onnxruntime| <= 1e-4 * max |onnxruntime|
(relative to the output's scale); exact equality for integer and bool outputs.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp/webiree-xdg")
os.makedirs(os.environ["XDG_RUNTIME_DIR"], exist_ok=True)

FP32_TOL = 1e-4


def ort_run(model, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close(got, ref, tol=FP32_TOL, name="output"):
    got, ref = np.asarray(got), np.asarray(ref)
    assert got.shape == ref.shape, f"{name}: shape {got.shape} != {ref.shape}"
    if ref.dtype.kind in "biu":
        assert got.dtype == ref.dtype, f"{name}: dtype {got.dtype} != {ref.dtype}"
        np.testing.assert_array_equal(got, ref, err_msg=name)
        return 0.0
    nan_ref, nan_got = np.isnan(ref), np.isnan(got)
    np.testing.assert_array_equal(nan_got, nan_ref, err_msg=f"{name}: NaN positions differ")
    fin = ~nan_ref
    inf = np.isinf(ref) & fin
    np.testing.assert_array_equal(got[inf], ref[inf], err_msg=f"{name}: inf values differ")
    ok = fin & ~inf
    if not ok.any():
        return 0.0
    scale = max(float(np.abs(ref[ok]).max()), 1e-30)
    err = float(np.abs(got[ok].astype(np.float64) - ref[ok]).max()) / scale
    assert err <= tol, f"{name}: max |diff| / max |ref| = {err:.3e} > {tol}"
    return err


def compile_and_run(model, feeds, tmp_path, input_shapes=None, **kw):
    import webiree

    out = tmp_path / "build"
    res = webiree.compile(model, out, input_shapes, **kw)
    sess = webiree.InferenceSession(out)
    return sess.run(None, feeds), res, sess


def check_model(model, tmp_path, feeds=None, tol=FP32_TOL, input_shapes=None):
    """Compile + run on the native HAL and compare every output with onnxruntime."""
    from webiree.testing.models import sample_inputs

    feeds = feeds if feeds is not None else sample_inputs(model)
    got, res, _ = compile_and_run(model, feeds, tmp_path, input_shapes)
    ref = ort_run(model, feeds)
    for g, r, o in zip(got, ref, model.graph.output):
        assert_close(g, r, tol, o.name)
    return res


@pytest.fixture
def check(tmp_path):
    return lambda model, **kw: check_model(model, tmp_path, **kw)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium with WebGPU (tests/browser_util.py), one per test module."""
    from .browser_util import chromium
    with chromium() as b:
        yield b
