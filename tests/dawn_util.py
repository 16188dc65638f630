"""Run a webiree build folder through web/webiree.js on Dawn in Node (tests/dawn/run_site.mjs)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "dawn" / "run_site.mjs"
NODE = "/usr/bin/node"
# the pinned dawn.node; scripts/setup.sh installs it into node_modules/
WEBGPU_VERSION = "0.6.2"
NP_TYPES = {"float32": np.float32, "int32": np.int32, "int64": np.int64, "uint8": np.uint8, "bool": np.bool_,
            "int8": np.int8, "uint32": np.uint32, "float64": np.float64, "uint64": np.uint64}
ONNX_NAMES = {v: k for k, v in NP_TYPES.items()}


def webgpu_package() -> Path | None:
    """The installed `webgpu` package (WEBIREE_WEBGPU overrides), or None."""
    for p in [os.environ.get("WEBIREE_WEBGPU"), ROOT / "node_modules" / "webgpu" / "index.js"]:
        if p and Path(p).exists():
            return Path(p)
    return None


def dawn_env() -> dict:
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp/webiree-xdg")
    os.makedirs(env["XDG_RUNTIME_DIR"], exist_ok=True)
    env["EGL_PLATFORM"] = "surfaceless"  # Mesa's EGL without a display (llvmpipe, for Dawn's OpenGL ES backend)
    return env


def run_dawn(url: str, feeds: dict, backend: str = "opengles", feature_level: str = "compatibility",
             timeout_s: float = 300, options: list | None = None) -> dict:
    """Run the site at url on Dawn; returns {name: ndarray} or raises RuntimeError with webiree.js's error."""
    pkg = webgpu_package()
    if pkg is None:
        raise RuntimeError("the npm package webgpu is missing: run scripts/setup.sh")
    with tempfile.TemporaryDirectory() as tmp:
        inputs = {}
        for i, (name, arr) in enumerate(feeds.items()):
            arr = np.ascontiguousarray(arr)
            f = os.path.join(tmp, f"in{i}.bin")
            (arr.astype(np.uint8) if arr.dtype == np.bool_ else arr).tofile(f)
            inputs[name] = {"type": ONNX_NAMES[arr.dtype.type], "dims": list(arr.shape), "file": f}
        spec = {"url": url, "backend": backend, "featureLevel": feature_level, "timeoutMs": 60000,
                "inputs": inputs, "outDir": os.path.join(tmp, "out"), "webgpu": str(pkg), "dawnOptions": options or []}
        spec_file = os.path.join(tmp, "spec.json")
        Path(spec_file).write_text(json.dumps(spec))
        proc = subprocess.run([NODE, str(RUNNER), spec_file], env=dawn_env(), capture_output=True, text=True,
                              timeout=timeout_s)
        res_file = Path(spec["outDir"]) / "result.json"
        if not res_file.exists():
            raise RuntimeError(f"dawn.node exited {proc.returncode} without a result:\n{proc.stderr[-3000:]}")
        res = json.loads(res_file.read_text())
        if "error" in res:
            raise RuntimeError(f"{res['kind']}: {res['error']}")
        out = {}
        for name, o in res["outputs"].items():
            a = np.fromfile(o["file"], dtype=NP_TYPES[o["type"]]).reshape(o["dims"])
            out[name] = a
        return out
