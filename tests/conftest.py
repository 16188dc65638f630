"""Shared test helpers: compile a model, run it natively, compare with onnxruntime.

Tolerances (fp32), on the finite elements (NaN and inf positions must match exactly):
- scale-relative, every float output: max |webiree - onnxruntime| <= 1e-4 * max |onnxruntime|;
- element-wise, where small elements carry the result (softmax, normalizations, the seed
  models; `elementwise=True`): |webiree - onnxruntime| <= 1e-3 * |onnxruntime| + 1e-6 * max |onnxruntime|
  for every element, so an output with its small entries wrong or zeroed fails even where
  the scale-relative check cannot see it.
Integer and bool outputs must be equal.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp/webiree-xdg")
os.makedirs(os.environ["XDG_RUNTIME_DIR"], exist_ok=True)

FP32_TOL = 1e-4
EW_RTOL, EW_ATOL = 1e-3, 1e-6     # element-wise: relative to the element, absolute relative to the scale


def ort_run(model, feeds):
    """onnxruntime CPU's outputs; its int8 products on the model that it computes exactly
    (webiree.testing.models.exact_integer_reference: u8 x s8 saturates on AVX2 hosts). A QDQ
    graph (a DequantizeLinear of an 8-bit constant) runs with graph optimizations off: as written,
    each dequantization and then the f32 product, where onnxruntime's fusion would take the same
    saturating integer kernels (an AMD EPYC host without VNNI, 7 Dec 2026: a QDQ MatMul of int8
    weights off by up to 4.5 where its outputs reach 13)."""
    import onnxruntime as ort
    from webiree.testing.models import exact_integer_reference

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if _dequantizes_8bit_constants(model):
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = exact_integer_reference(model)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _dequantizes_8bit_constants(model) -> bool:
    """Whether a DequantizeLinear of `model`'s main graph reads an int8 or uint8 initializer."""
    from onnx import TensorProto
    eight = {i.name for i in model.graph.initializer if i.data_type in (TensorProto.INT8, TensorProto.UINT8)}
    return any(n.op_type == "DequantizeLinear" and n.input[0] in eight for n in model.graph.node)


def assert_close(got, ref, tol=FP32_TOL, name="output", elementwise=False):
    """Compare one output (see the module docstring); returns max |diff| / max |ref|."""
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
    g, r = got[ok].astype(np.float64), ref[ok].astype(np.float64)
    scale = max(float(np.abs(r).max()), 1e-30)
    diff = np.abs(g - r)
    err = float(diff.max()) / scale
    assert err <= tol, f"{name}: max |diff| / max |ref| = {err:.3e} > {tol}"
    if elementwise:
        bound = EW_RTOL * np.abs(r) + EW_ATOL * scale
        bad = diff > bound
        if bad.any():
            i = int(np.argmax(diff / bound))
            raise AssertionError(f"{name}: {int(bad.sum())} of {bad.size} elements differ by more than "
                                 f"{EW_RTOL:g} * |ref| + {EW_ATOL:g} * max |ref| (worst: got {g[i]:.6g}, "
                                 f"ref {r[i]:.6g})")
    return err


def compile_and_run(model, feeds, tmp_path, input_shapes=None, limits="default", **kw):
    """Compile in memory (shaders validated as `webiree.compile` does) and run natively; no build
    folder is written (tests of the build folder itself use webiree.compile)."""
    import webiree
    from webiree.bundler.site import resolve_target, shader_validator
    from webiree.compiler.driver import compile_model

    res = compile_model(model, input_shapes, resolve_target(limits), validate=shader_validator, **kw)
    sess = webiree.InferenceSession.from_module(res.module, res.weights)
    return sess.run(None, feeds), res, sess


def check_model(model, tmp_path, feeds=None, tol=FP32_TOL, input_shapes=None, elementwise=False):
    """Compile + run on the native HAL and compare every output with onnxruntime."""
    from webiree.testing.models import sample_inputs

    feeds = feeds if feeds is not None else sample_inputs(model)
    got, res, _ = compile_and_run(model, feeds, tmp_path, input_shapes)
    ref = ort_run(model, feeds)
    assert len(got) == len(ref) == len(model.graph.output), (len(got), len(ref), len(model.graph.output))
    for g, r, o in zip(got, ref, model.graph.output, strict=True):
        assert_close(g, r, tol, o.name, elementwise)
    return res


@pytest.fixture
def check(tmp_path):
    return lambda model, **kw: check_model(model, tmp_path, **kw)


@pytest.fixture(scope="module")
def server(site_root):
    """webiree's dev server on the module's `site_root` (a fixture each browser test module defines)."""
    from .browser_util import serving
    with serving(site_root) as url:
        yield url


@pytest.fixture
def page(browser, server):
    """A fresh page on the server's blank.html (tests/browser_util.py blank_page)."""
    from .browser_util import blank_page
    with blank_page(browser, server) as pg:
        yield pg


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium with WebGPU (tests/browser_util.py), one per test module."""
    from .browser_util import chromium
    with chromium() as b:
        yield b


# ---------------------------------------------------------------- no escape hatches
def pytest_sessionfinish(session, exitstatus):
    """A skip or an xfail is a failure nobody sees: any in a run makes the run fail. Set-up
    installs everything the suite needs (scripts/setup.sh), so a skip means set-up broke."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    hatches = sum(len(reporter.stats.get(k, [])) for k in ("skipped", "xfailed", "xpassed"))
    if hatches and session.exitstatus == 0:
        reporter.ensure_newline()
        reporter.write_line(f"webiree: {hatches} test(s) skipped or xfailed: the run fails (no escape hatches)",
                            red=True)
        session.exitstatus = 1
