"""A build's peak host memory stays under twice the model's size (issue #19): the .onnx file is
opened through a memory map with its weights left in the file (compiler/onnx_file.py), the
checker and shape inference see a model without them (importer._skeleton), constants are
packed and written into weights.bin a chunk at a time and their pages handed back
(packing.encode_into, onnx_file.release), and the blob is made once for all kernel variants.
Before, a 650 MB GPT-2 peaked at 3.2 GB (one variant) and 5.2 GB (a default build).

The model here: two f32 matmuls, 268 MB of weights (random normal: no narrower form holds them),
built (default build: four kernel variants) in a fresh process whose peak RSS is read from
getrusage; the site's output is compared with numpy.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import webiree

from .test_reliability import ROOT

K, N = 4096, 8192     # W1 [K, N] and W2 [N, K]: 2 x 128 MiB of f32


def peak_rss(reset: bool = False) -> int:
    """This process's peak resident set (VmHWM), in bytes; reset: start it again from the current
    RSS (a forked child inherits its parent's peak, which exec keeps)."""
    if reset:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _model(path):
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((K, N), dtype=np.float32) * 0.02)
    w2 = (rng.standard_normal((N, K), dtype=np.float32) * 0.02)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "big_mlp",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, K])], [helper.make_tensor_value_info("y", T.FLOAT, [1, K])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return w1, w2


@pytest.mark.slow
def test_a_build_peaks_under_twice_the_model_size(tmp_path):
    w1, w2 = _model(tmp_path / "big.onnx")
    size = (tmp_path / "big.onnx").stat().st_size
    code = ("import json, sys, webiree; from tests.test_build_memory import peak_rss; "
            "before = peak_rss(reset=True); webiree.compile(sys.argv[1], sys.argv[2]); "
            "print('PEAK ' + json.dumps([before, peak_rss()]))")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "big.onnx"), str(tmp_path / "site")],
                       capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("PEAK ")]
    assert p.returncode == 0 and lines, f"the build failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
    imported, peak = json.loads(lines[-1][5:])
    print(f"\n[build memory] model {size / 1e6:.0f} MB: peak RSS {peak / 1e6:.0f} MB ({peak / size:.2f}x; "
          f"{imported / 1e6:.0f} MB before the build, webiree imported)")
    assert peak < 2 * size, f"the build peaked at {peak:,} bytes for a {size:,}-byte model"
    # the site is right: weights.bin holds the weights once, and the output matches numpy
    assert 2 * K * N * 4 <= (tmp_path / "site" / "weights.bin").stat().st_size < 2 * K * N * 4 + (1 << 20)
    x = np.random.default_rng(1).standard_normal((1, K), dtype=np.float32)
    (y,) = webiree.InferenceSession(tmp_path / "site").run(None, {"x": x})
    want = np.maximum(x.astype(np.float64) @ w1, 0) @ w2
    err = float(np.abs(y - want).max() / np.abs(want).max())
    assert y.shape == (1, K) and err < 1e-4, err
