#!/usr/bin/env python
"""webiree.js against onnxruntime-web's WebGPU EP on Dawn, Chromium's WebGPU implementation, in
one Node process (issue #20 item 6: a real browser engine on the real GPU).

    python benchmarks/dawn_vs_ort_web.py --onnx M.onnx --inputs M.inputs.npz [--runs 30]
        [--node node] [--webgpu node_modules/webgpu/index.js] [--ort-dir DIR] [--backend vulkan]

On this machine Dawn runs over llvmpipe (`--backend opengles --feature-level compatibility`: its
Vulkan backend refuses lavapipe); on the lent NVIDIA machine over the Vulkan driver, where benchmarks/dawn_gpu.sh prepares Node, dawn.node and onnxruntime-web (it has none).
The model is built with webiree's default build (the variant picked at load, as a site ships it);
`--ort-dir` holds onnxruntime-web's `ort.webgpu.min.mjs` and the asyncify wasm it loads
(default benchmarks/node_modules/onnxruntime-web/dist: `npm install --prefix benchmarks
onnxruntime-web@1.22.0`; 1.30.0's WebGPU EP fails under dawn.node 0.6.2, see dawn_pack.sh), run
on one wasm thread. Both runtimes' first outputs are checked
against onnxruntime CPU on the same file (max |Δ| / max |ref| <= 1e-4 per output, else exit 1),
then runs alternate in turns of 10 (each after 3 warm-up runs), results read back to the host in
both. Printed: session create, first run, median and fastest run, and the ratio of medians.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-4
KINDS = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64", np.dtype(np.int32): "int32"}
NUMPY = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "uint8": np.uint8, "int8": np.int8,
         "bool": np.bool_, "float16": np.float16}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--inputs", required=True, help=".npz of the model's inputs")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--node", default=shutil.which("node") or "node")
    ap.add_argument("--webgpu", default=str(ROOT / "node_modules" / "webgpu" / "index.js"))
    ap.add_argument("--ort-dir", default=str(ROOT / "benchmarks" / "node_modules" / "onnxruntime-web" / "dist"))
    ap.add_argument("--backend", default="vulkan", help="Dawn's backend (vulkan, opengles, ...)")
    ap.add_argument("--feature-level", default="core",
                    help="core, or compatibility (Dawn's OpenGL ES backend, e.g. over llvmpipe on a machine without a GPU)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)

    import onnxruntime as ort

    from webiree.bench import _max_rel_err
    from webiree.bundler.site import compile as build

    for what, path in (("dawn.node's package (--webgpu)", args.webgpu),
                       ("onnxruntime-web's ort.webgpu.min.mjs (--ort-dir)", os.path.join(args.ort_dir, "ort.webgpu.min.mjs"))):
        if not os.path.exists(path):
            print(f"error: {what} is missing: {path}", file=sys.stderr)
            return 2
    feeds = dict(np.load(args.inputs))
    so = ort.SessionOptions()
    ref_sess = ort.InferenceSession(args.onnx, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in ref_sess.get_outputs()]
    refs = dict(zip(names, ref_sess.run(None, feeds)))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build(args.onnx, root / "site")
        shutil.copy(args.onnx, root / "model.onnx")
        inputs = {}
        for name, value in feeds.items():
            f = root / f"in-{name}.bin"
            f.write_bytes(np.ascontiguousarray(value).tobytes())
            inputs[name] = {"type": KINDS[value.dtype], "dims": list(value.shape), "file": str(f)}
        spec = {"root": str(root), "site": "site", "model": "model.onnx", "ortDir": os.path.abspath(args.ort_dir),
                "webgpu": os.path.abspath(args.webgpu), "backend": args.backend, "featureLevel": args.feature_level,
                "inputs": inputs,
                "runs": args.runs, "warmup": args.warmup, "timeoutMs": 120000, "outDir": str(root / "out")}
        (root / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ)
        env.setdefault("XDG_RUNTIME_DIR", "/tmp")
        env.setdefault("EGL_PLATFORM", "surfaceless")   # Dawn's OpenGL ES backend without a display
        proc = subprocess.run([args.node, str(ROOT / "benchmarks" / "dawn_vs_ort_web.mjs"), str(root / "spec.json")],
                              capture_output=True, text=True, timeout=args.timeout, env=env)
        result_file = root / "out" / "result.json"
        if not result_file.exists():
            print(f"error: node exited {proc.returncode} without a result:\n{proc.stderr[-3000:]}", file=sys.stderr)
            return 1
        r = json.loads(result_file.read_text())
        if proc.returncode != 0 and "error" not in r and "ort" not in r["runtimes"]:
            # webiree's part was written before onnxruntime-web's started
            r["ortError"] = f"node exited {proc.returncode} during onnxruntime-web's part"
        if "error" in r:
            print(f"error: {r['error']}\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        ok = True
        for runtime, rr in r["runtimes"].items():
            got = {o["name"]: np.fromfile(o["file"], dtype=NUMPY[o["type"]]).reshape(o["dims"]) for o in rr["outputs"]}
            # every output of the reference, by name (a missing one: inf)
            rr["rel_err"] = _max_rel_err([got.get(n, np.full(1, np.nan)) for n in names], [refs[n] for n in names])
            if not rr["rel_err"] <= TOLERANCE:
                ok = False
            del rr["outputs"]
    w, o = r["runtimes"]["webiree"], r["runtimes"].get("ort")
    print(f"model {Path(args.onnx).name} on Dawn ({args.backend}) in Node, adapter {r['adapter'] or '?'}; webiree's "
          f"default build (variant {r.get('variant') or '-'}), onnxruntime-web {r.get('ortVersion') or ''} WebGPU EP on "
          f"one wasm thread; "
          f"median of {w['runs']} runs each" + (", alternating in turns of 10" if o else ""))
    print(f"{'':24}{'webiree':>12}" + (f"{'ort-web':>12}{'ort/webiree':>13}" if o else ""))
    for key, label in (("createMs", "session create (ms)"), ("firstRunMs", "first run (ms)"),
                       ("medianMs", "median run (ms)"), ("minMs", "fastest run (ms)")):
        print(f"{label:24}{w[key]:12.2f}" + (f"{o[key]:12.2f}{o[key] / w[key]:13.2f}" if o else ""))
    print(f"{'rel. error vs ort CPU':24}{w['rel_err']:12.1e}" + (f"{o['rel_err']:12.1e}" if o else "") +
          f"   (tolerance {TOLERANCE:.0e})")
    if not o:
        print(f"onnxruntime-web: not compared: {r.get('ortError', 'no result')}")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": Path(args.onnx).name, "backend": args.backend, **r}, indent=2))
    if not ok:
        print("FAILED: an output differs from onnxruntime CPU beyond the tolerance: not comparable", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
