#!/usr/bin/env python
"""Kernels chosen at load (issue #19 item 1) in headless Chromium (WebGPU on SwiftShader).

Usage::

    python benchmarks/kernel_variants_browser.py [--models minilm,mobilenet_v2] [--runs 10] [--turns 3] [--json OUT]

For each seed model (tests/.data/seed/NAME.onnx, NAME.inputs.npz, NAME.ref.npz) two builds:

- `default`: `webiree build` with no --limits; in the page webiree.js picks the variant by the
  adapter (SwiftShader: 'cpu-sg4', CPU-class kernels whose matmuls broadcast within subgroups of 4);
- `adapter`: built for the page's adapter as `--limits adapter` does natively: its limits (read
  in the page), device class cpu and its subgroup size;

and three sessions in one page: the default build as picked, the default build forced to 'cpu'
(what a default build ran before the subgroup variants), and the adapter build. Each session's
first output is checked against the reference (max |Δ| / max |ref| <= 1e-4, else exit 1); then
the sessions run in alternating turns (`runs` runs after a warm-up each turn) and the medians are
compared with the adapter build's. The time to first result of each (session create with
pipelines, plus the first run) is printed too. `--tuning TABLE` adds a fourth session: the default
build made with that tuning table (e.g. a lavapipe table, to see whether its CPU-class choices
carry to SwiftShader). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "tests" / ".data" / "seed"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--enable-unsafe-webgpu", "--no-sandbox"]
TOLERANCE = 1e-4
KINDS = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64", np.dtype(np.int32): "int32"}

ADAPTER_JS = """async () => { const a = await navigator.gpu.requestAdapter(); const l = {};
  for (const k of ['maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX', 'maxComputeWorkgroupSizeY',
                   'maxComputeWorkgroupSizeZ', 'maxComputeWorkgroupStorageSize', 'maxComputeWorkgroupsPerDimension',
                   'maxStorageBuffersPerShaderStage', 'maxStorageBufferBindingSize', 'maxBufferSize',
                   'minStorageBufferOffsetAlignment']) l[k] = a.limits[k];
  const sg = a.features.has('subgroups') && a.info.subgroupMinSize === a.info.subgroupMaxSize ? a.info.subgroupMinSize : 0;
  return {limits: l, subgroup: sg, name: `${a.info.vendor} ${a.info.architecture}`}; }"""

BENCH_JS = """async ({sessions, feeds, runs, turns}) => {
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
  const bytes = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const typed = (f) => { const b = bytes(f.data).buffer;
    return {float32: () => new Float32Array(b), int64: () => new BigInt64Array(b), int32: () => new Int32Array(b)}[f.type](); };
  const out = {};
  const live = {};
  for (const [name, {dir, variant}] of Object.entries(sessions)) {
    const w = await import(`./${dir}/webiree.js`);
    const t0 = performance.now();
    const s = await w.InferenceSession.create(`./${dir}/`, {timeoutMs: 600000, ...(variant ? {variant} : {})});
    const createMs = performance.now() - t0;
    const wfeeds = Object.fromEntries(Object.entries(feeds).map(([k, f]) => [k, new w.Tensor(f.type, typed(f), f.dims)]));
    const first = await s.run(wfeeds);
    out[name] = {variant: s.variant, createMs, ttfrMs: performance.now() - t0, times: [],
                 first: Object.fromEntries(Object.entries(first).map(([k, t]) => [k, Array.from(t.data, Number)]))};
    live[name] = [s, wfeeds];
  }
  for (let t = 0; t < turns; t++) {
    for (const [name, [s, f]] of Object.entries(live)) {
      await s.run(f);
      for (let i = 0; i < runs; i++) { const t1 = performance.now(); await s.run(f); out[name].times.push(performance.now() - t1); }
    }
  }
  for (const [name, [s]] of Object.entries(live)) { out[name].medianMs = median(out[name].times); await s.release(); }
  return out;
}"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="minilm,mobilenet_v2")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900, help="seconds for one model's in-page benchmark")
    ap.add_argument("--tuning", metavar="TABLE", help="also a default build with this tuning table ('tuned')")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp/webiree-xdg")
    os.makedirs(os.environ["XDG_RUNTIME_DIR"], exist_ok=True)
    from playwright.sync_api import sync_playwright

    import webiree
    from webiree.bundler.server import serve_in_thread

    report = {}
    with tempfile.TemporaryDirectory(prefix="webiree-variants-") as tmp, serve_in_thread(Path(tmp)) as base, \
            sync_playwright() as pw:
        root = Path(tmp)
        (root / "index.html").write_text("<!doctype html><title>variants</title><link rel=icon href='data:,'>")
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(base)
        adapter = page.evaluate(ADAPTER_JS)
        snake = {k: "".join("_" + c.lower() if c.isupper() else c for c in k) for k in adapter["limits"]}
        limits = {snake[k]: v for k, v in adapter["limits"].items()}
        limits.update(device_class="cpu", **({"subgroup_size": adapter["subgroup"]} if adapter["subgroup"] else {}))
        print(f"adapter: {adapter['name']} (subgroups of {adapter['subgroup'] or 'no fixed size'}); "
              f"Chromium {browser.version}")
        for name in args.models.split(","):
            onnx_path = SEED / f"{name}.onnx"
            feeds = dict(np.load(SEED / f"{name}.inputs.npz"))
            ref = np.load(SEED / f"{name}.ref.npz")
            webiree.compile(onnx_path, root / f"{name}_default")
            webiree.compile(onnx_path, root / f"{name}_adapter", limits=limits)
            sessions = {"default": {"dir": f"{name}_default"}, "default-cpu": {"dir": f"{name}_default", "variant": "cpu"},
                        "adapter": {"dir": f"{name}_adapter"}}
            if args.tuning:     # the default build with a tuning table (its CPU-class entries where they fit)
                webiree.compile(onnx_path, root / f"{name}_tuned", tuning=args.tuning)
                sessions["tuned"] = {"dir": f"{name}_tuned"}
            arg = {"sessions": sessions, "runs": args.runs, "turns": args.turns,
                   "feeds": {k: {"type": KINDS[v.dtype], "dims": list(v.shape),
                                 "data": base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()}
                             for k, v in feeds.items()}}
            res = page.evaluate(f"""async (arg) => {{ const fn = {BENCH_JS}; let timer;
              const limit = new Promise((_, rej) => {{ timer = setTimeout(() => rej(new Error('timed out')), {int(args.timeout * 1000)}); }});
              try {{ return await Promise.race([fn(arg), limit]); }} finally {{ clearTimeout(timer); }} }}""", arg)
            base_ms = res["adapter"]["medianMs"]
            print(f"{name}:")
            bad = False
            for k, r in res.items():
                err = max(float(np.abs(np.asarray(r["first"][o]) - ref[o].ravel()).max() / max(np.abs(ref[o]).max(), 1e-30))
                          for o in r["first"])
                bad |= not err <= TOLERANCE
                r.update(rel_err=err, vs_adapter=r["medianMs"] / base_ms)
                del r["first"]
                print(f"  {k:<12} variant {r['variant'] or '-':<8} {r['medianMs']:>9.1f} ms  {r['vs_adapter']:5.2f}x adapter  "
                      f"first result {r['ttfrMs'] / 1e3:6.1f} s (create {r['createMs'] / 1e3:.1f} s)  rel. err {err:.1e}  "
                      f"{len(r['times'])} runs" + ("  WRONG" if not err <= TOLERANCE else ""))
            report[name] = res
            if bad:
                return 1
        browser.close()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
