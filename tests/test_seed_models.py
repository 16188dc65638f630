"""The four benchmark models of IREE's Vulkan talk, exported from Hugging Face
`transformers` with seeded random weights (tests/seed/export_seed_models.py),
compiled and run on the native HAL, compared with onnxruntime CPU.

Tolerance: max |webiree - onnxruntime| / max |onnxruntime| <= 1e-4 per output, and element by
element |webiree - onnxruntime| <= 1e-3 |onnxruntime| + 1e-6 max |onnxruntime| (tests/conftest.py).
IREE 3.13 forms 55 / 58 / 103 / 513 dispatches for these models.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import webiree

from .conftest import assert_close

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("WEBIREE_SEED_DIR", ROOT / "tests" / ".data" / "seed"))
IREE_DISPATCHES = {"mobilenet_v2": 55, "deeplabv3": 58, "minilm": 103, "mobilebert": 513}
# issue #20's bound for MobileBERT (its feed-forward pairs chained: 269 on 4 Dec 2026)
MAX_DISPATCHES = {"mobilebert": 300}

# sha256 of each model's outputs (default build's GPU kernels, the exported seed inputs) on the CI
# adapter, recorded before the re-layering of issue #15: a refactor that claims to change no behaviour
# must reproduce them bit for bit. The bits also depend on the host under the adapter: the same commit
# (d963e9a, where they were recorded) computes other bits for the CNNs on the hosts of 2 Dec 2026
# (Intel Xeon with AVX-512, CI's too), where the seed export or llvmpipe's JIT differs; each host's
# digests are accepted, and a change of the code's bits on either fails. Another adapter computes
# other bits; record its own then.
OUTPUT_HASHES = {
    "llvmpipe (LLVM 15.0.6, 256 bits)": {
        "mobilenet_v2": ("bc664c7946409f445c224ccb4e7b9b491cfc52cafef3167b707503e13f7fbae6",
                         "48edc3855fcdb3ed2f123b54c80c63b604cd3873dcba1cdf48c8c1745cf91b5c"),
        # DeepLabV3's GPU kernels changed on 2 Dec 2026 (config.py revised from the H200 tuning table:
        # scalar matmul tiles of at most 4 x 4, 256 invocations for its mean over 4,225 values); recorded
        # on that day's host; the second on 3 Dec 2026's Intel Xeon host (AVX-512), same code, where
        # mobilenet_v2 and minilm matched the recorded digests
        "deeplabv3": ("3047a6e3e80e19f4ad839e9ec71b802de9bcba5226f275fbe6f308daf9d9532b",
                      "177a628ac6cf4fa8f826e3dfc182fd5b51d2d1601e002da58b4ee5cf3599fe2f"),
        # MiniLM's GPU layernorms and softmax rows changed on 3 Dec 2026 (256 / 128 invocations a row,
        # config.py revised from the H200 tuning table of the int8 MiniLM); its Q, K and V projections
        # became one product on 4 Dec 2026 (passes.combine_parallel_matmuls: a 128 x 1152 x 384 product,
        # its biases added in the attention products' loads). MobileBERT's combined products kept its bits;
        # its feed-forward pairs became one chained-product dispatch each on 4 Dec 2026
        # (passes.fuse_matmul_chains; the second product's K summed in 4 slices, as split-k's were not).
        # Later that day both models' products of K = 128 were split across slices of K (config.py
        # SPLIT_K_SHORT: MiniLM's attention x V, MobileBERT's 128-wide products), changing both again.
        "minilm": ("b5e603d578455e1bd5747c1f78616e7cb14b4393ff3033387a9b380f5835d8b5",),
        "mobilebert": ("c3da71d423d96c54123a6c958890462bd7c3ecbe94b41916a6136c74a96ffffa",),
    },
}


@pytest.fixture(scope="session")
def seed_dir():
    """Export the models once (cached in tests/.data/seed; never committed)."""
    DATA.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "seed" / "export_seed_models.py"), "--out", str(DATA)],
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, f"seed export failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return DATA


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mobilenet_v2", "deeplabv3", "minilm", "mobilebert"])
def test_seed_model(name, seed_dir, tmp_path, capsys):
    t0 = time.perf_counter()
    res = webiree.compile(seed_dir / f"{name}.onnx", tmp_path / name)
    build_s = time.perf_counter() - t0
    # four kernel variants; a guard against a runaway build, not a benchmark: MobileBERT took 242 s
    # inside the suite on a 2-core AMD EPYC host whose lavapipe ran MiniLM 4.7x as long as the
    # hosts of earlier sessions (869 vs 186 ms)
    assert build_s < 600, f"build took {build_s:.1f} s"
    feeds = dict(np.load(seed_dir / f"{name}.inputs.npz"))
    ref = dict(np.load(seed_dir / f"{name}.ref.npz"))
    # the default build carries GPU- and CPU-class kernels, and CPU-class ones broadcasting within
    # subgroups of 8 where the model has such matmuls (lavapipe picks 'cpu-sg8' then): all must be
    # right; the recorded bits are the GPU kernels' (the portable ones every adapter can run)
    names = [v["name"] for v in res.manifest["variants"]]
    picked = webiree.InferenceSession(tmp_path / name).variant
    assert picked == ("cpu-sg8" if "cpu-sg8" in names else "cpu"), (picked, names)
    errs, digests, run_ms = {}, {}, {}
    for variant in dict.fromkeys(("gpu", "cpu", picked)):
        sess = webiree.InferenceSession(tmp_path / name, variant=variant)
        sess.run(None, feeds)
        t0 = time.perf_counter()
        outs = sess.run(None, feeds)
        run_ms[variant] = (time.perf_counter() - t0) * 1e3
        assert sorted(o.name for o in sess.get_outputs()) == sorted(ref), (sess.get_outputs(), list(ref))
        for o, got in zip(sess.get_outputs(), outs, strict=True):
            errs[f"{o.name} ({variant})"] = assert_close(got, ref[o.name], 1e-4, f"{name}:{o.name} ({variant})",
                                                         elementwise=True)
        digests[variant] = hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in outs)).hexdigest()
    from webiree.hal_webgpu.wgpu_driver import adapter_info

    adapter = adapter_info().get("device", "?")
    assert adapter in OUTPUT_HASHES, f"no output hashes recorded for adapter {adapter!r} (see OUTPUT_HASHES)"
    assert digests["gpu"] in OUTPUT_HASHES[adapter][name], \
        f"{name}: the outputs' bits changed on {adapter}: {digests['gpu']} is none of the recorded ones"
    m = res.manifest
    if name in MAX_DISPATCHES:
        assert m["dispatches"] <= MAX_DISPATCHES[name], (name, m["dispatches"])
    with capsys.disabled():
        print(f"\n[seed] {name}: {m['dispatches']} dispatches (IREE 3.13: {IREE_DISPATCHES[name]}), "
              f"peak arena {res.plan.arena_peak} B (sum of intermediates {res.plan.intermediates_sum} B), "
              f"weights {m['sizes']['weights_bytes']} B, module {m['sizes']['module_bytes']} B, "
              f"build {build_s:.1f} s, run on lavapipe " + " / ".join(f"{v} {t:.0f} ms" for v, t in run_ms.items())
              + f" (picked: {picked}), rel. error "
              + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
