"""`webiree demo`: the main job of the README's first command.

Builds the small demo CNN (generated in code), runs it natively through
wgpu-py, prints the result and its agreement with onnxruntime, and says where
the site is.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def run_demo(out: str) -> int:
    import onnx

    from .bundler.site import compile as build
    from .module.dump import describe_build
    from .session import InferenceSession
    from .testing.models import sample_inputs, small_cnn

    model = small_cnn()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out_dir / "small_cnn.onnx")
    t0 = time.perf_counter()
    res = build(out_dir / "small_cnn.onnx", out_dir)
    print(f"built small_cnn in {time.perf_counter() - t0:.2f} s: {len(res.dispatches)} dispatches "
          f"from {len(model.graph.node)} ONNX nodes")
    feeds = sample_inputs(model)
    sess = InferenceSession(out_dir)
    sess.run(None, feeds)  # warm-up
    t0 = time.perf_counter()
    (probs,) = sess.run(None, feeds)
    ms = (time.perf_counter() - t0) * 1e3
    top = np.argsort(-probs[0])[:3]
    print(f"webiree (wgpu-py, {_adapter()}): top-3 classes {top.tolist()} "
          f"probs {[round(float(probs[0, i]), 4) for i in top]}  ({ms:.1f} ms)")
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed: skipping the comparison (pip install -e .[test])")
    else:
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        err = float(np.abs(probs - ref).max() / max(np.abs(ref).max(), 1e-30))
        verdict = "agrees" if err <= 1e-4 else "DISAGREES"
        print(f"onnxruntime CPU:           top-3 classes {np.argsort(-ref[0])[:3].tolist()}; "
              f"max |diff| / max |ref| = {err:.2e} -> {verdict} (tolerance 1e-4)")
        if err > 1e-4:
            return 1
    print(describe_build(out_dir).split("\nbuffers:")[0])
    print(f"site written to {out_dir.resolve()} (serve it with: webiree serve {out_dir})")
    return 0


def _adapter() -> str:
    from .hal_webgpu.wgpu_driver import adapter_info

    info = adapter_info()
    return f"{info.get('device', '?')} via {info.get('backend_type', '?')}"
