"""webiree's browser runtime vs onnxruntime-web (WebGPU EP), in the same headless Chromium.

    cd benchmarks && npm install --no-save --no-package-lock --prefix . onnxruntime-web@1.30.0
    cd .. && .venv/bin/python benchmarks/browser_vs_ort_web.py [--model small_cnn | --onnx M.onnx --inputs M.inputs.npz] [--runs 30]

This script installs nothing: onnxruntime-web must already be in
benchmarks/node_modules (gitignored). It builds the model with webiree into a
temporary root, puts the ONNX file and ort-web's WebGPU runtime files beside
it, serves the root with webiree's server, and in one page:

  1. creates a webiree session and an ort-web session (executionProviders ['webgpu'];
     ort-web's wasm part, which runs the operators its WebGPU EP does not take, on
     one thread: the page is not cross-origin isolated, so it has no SharedArrayBuffer),
  2. checks that both give the same outputs on the first run: max |webiree - ort| /
     max |ort| per output must be <= TOLERANCE (1e-4, the project's fp32 tolerance),
     else the script prints the figures and exits 1,
  3. times `--runs` runs of each, alternating the two runtimes run by run, after
     `--warmup` runs (results read back to the CPU in both cases) and prints the
     medians and their ratio, and the time to first result (runtime import,
     session creation with weights and pipelines, first run),
  4. reloads the page (a second visit: same browser profile, so the Cache API and
     Chromium's caches are warm) and times each runtime's first result again,
  5. prints the gzipped size of each runtime (what a page has to download
     besides the model).

`--throttle MBIT_S` emulates a network of that speed (Chromium's network emulation
over CDP, both visits), where a first visit's downloads take time and a second
visit's cached weights save it; `--no-start-tier` runs webiree's picked variant
from the first run (webiree.js `startTier: false`) for comparison.

Chromium runs WebGPU on SwiftShader (a CPU) here, so the absolute numbers say
little about a real GPU; the ratio and the sizes are the point. webiree runs its
default build (`--limits default`: GPU- and CPU-class kernel variants, picked by
the adapter at load, as a site's author ships it; `--limits cpu` builds the CPU
kernels alone), ort-web its generic WebGPU kernels with one wasm thread.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORT_DIST = HERE / "node_modules" / "onnxruntime-web" / "dist"
# ort-web 1.30's WebGPU build: the ES module and the wasm it loads
ORT_FILES = ("ort.webgpu.min.mjs", "ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--enable-unsafe-webgpu", "--no-sandbox"]
ORT_WASM_THREADS = 1  # the page is not cross-origin isolated: no SharedArrayBuffer, no wasm threads
TOLERANCE = 1e-4      # max |webiree - ort| / max |ort| per output (the project's fp32 tolerance)

# onnxruntime-web's module and a WebGPU session of ./model.onnx (both pages' functions start with it)
ORT_SESSION_JS = """const ortSession = async (ortThreads) => {
  const ort = await import('./ort/ort.webgpu.min.mjs');
  ort.env.wasm.wasmPaths = new URL('./ort/', location.href).href;
  ort.env.wasm.numThreads = ortThreads;
  ort.env.logLevel = 'error';
  return [ort, await ort.InferenceSession.create('./model.onnx', {executionProviders: ['webgpu']})];
};"""

BENCH_JS = """async ({runs, warmup, feeds, ortThreads, startTier}) => {
  // Both sessions are created first; then the two runtimes alternate run by run, so
  // SwiftShader's noise hits both alike, and the medians are compared.
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
  const bytes = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const typed = (f) => { const b = bytes(f.data).buffer;
    return {float32: () => new Float32Array(b), int64: () => new BigInt64Array(b), int32: () => new Int32Array(b),
            bool: () => new Uint8Array(b)}[f.type](); };
  const out = {webiree: {}, ort: {}};
  // webiree: time to first result = runtime import + session (fetch, pipelines) + first run
  let t0 = performance.now();
  const w = await import('./webiree/webiree.js');
  const ws = await w.InferenceSession.create('./webiree/', {timeoutMs: 600000, startTier});  // SwiftShader is slow
  out.webiree.createMs = performance.now() - t0;
  const wfeeds = Object.fromEntries(Object.entries(feeds).map(([k, f]) => [k, new w.Tensor(f.type, typed(f), f.dims)]));
  let t1 = performance.now();
  out.webiree.firstVariant = ws.runningVariant;   // a start tier runs while its variant compiles
  const wfirst = await ws.run(wfeeds);
  out.webiree.firstRunMs = performance.now() - t1;
  out.webiree.ttfrMs = performance.now() - t0;
  // every pipeline of the picked variant created: the runs timed below use it (not the start tier)
  await ws.ready();
  out.webiree.readyMs = performance.now() - t0;
  // onnxruntime-web, WebGPU execution provider
  t0 = performance.now();
  const [ort, os] = await ortSession(ortThreads);
  out.ort.createMs = performance.now() - t0;
  const ofeeds = Object.fromEntries(Object.entries(feeds).map(([k, f]) => [k, new ort.Tensor(f.type, typed(f), f.dims)]));
  t1 = performance.now();
  const ofirst = await os.run(ofeeds);
  out.ort.firstRunMs = performance.now() - t1;
  out.ort.ttfrMs = performance.now() - t0;
  for (let i = 0; i < warmup; i++) { await ws.run(wfeeds); await os.run(ofeeds); }
  const wms = [], oms = [];
  for (let i = 0; i < runs; i++) {
    t1 = performance.now(); await ws.run(wfeeds); wms.push(performance.now() - t1);
    t1 = performance.now(); await os.run(ofeeds); oms.push(performance.now() - t1);
  }
  Object.assign(out.webiree, {medianMs: median(wms), minMs: Math.min(...wms)});
  Object.assign(out.ort, {medianMs: median(oms), minMs: Math.min(...oms)});
  // max over outputs of max |webiree - ort| / max |ort| (loops, not spreads: large outputs);
  // a missing or differently sized output is Infinity, a NaN stays NaN
  let err = 0;
  out.webiree.variant = ws.variant;
  out.webiree.weightsSource = ws.weightsSource;
  for (const [k, ref] of Object.entries(ofirst)) {
    const r = ref.data, g = wfirst[k]?.data;
    if (!g || g.length !== r.length) { err = Infinity; continue; }
    let scale = 1e-30, d = 0;
    for (let i = 0; i < r.length; i++) {
      scale = Math.max(scale, Math.abs(Number(r[i])));
      d = Math.max(d, Math.abs(Number(r[i]) - Number(g[i])));
    }
    err = Math.max(err, d / scale);
  }
  out.maxRelDiff = err;
  await ws.release();
  await os.release();
  return out;
}"""


SECOND_VISIT_JS = """async ({feeds, ortThreads, startTier}) => {
  // after a reload: each runtime's time to first result again (import, create, first run)
  const bytes = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const typed = (f) => { const b = bytes(f.data).buffer;
    return {float32: () => new Float32Array(b), int64: () => new BigInt64Array(b), int32: () => new Int32Array(b),
            bool: () => new Uint8Array(b)}[f.type](); };
  const out = {webiree: {}, ort: {}};
  let t0 = performance.now();
  const w = await import('./webiree/webiree.js');
  const ws = await w.InferenceSession.create('./webiree/', {timeoutMs: 600000, startTier});
  out.webiree.createMs = performance.now() - t0;
  await ws.run(Object.fromEntries(Object.entries(feeds).map(([k, f]) => [k, new w.Tensor(f.type, typed(f), f.dims)])));
  out.webiree.ttfrMs = performance.now() - t0;
  out.webiree.weightsSource = ws.weightsSource;
  await ws.release();
  t0 = performance.now();
  const [ort, os] = await ortSession(ortThreads);
  out.ort.createMs = performance.now() - t0;
  await os.run(Object.fromEntries(Object.entries(feeds).map(([k, f]) => [k, new ort.Tensor(f.type, typed(f), f.dims)])));
  out.ort.ttfrMs = performance.now() - t0;
  await os.release();
  return out;
}"""


def gz(path: Path) -> int:
    return len(gzip.compress(path.read_bytes(), 9))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small_cnn", help="a model of webiree.testing.models (default small_cnn)")
    ap.add_argument("--onnx", help="an .onnx file instead (e.g. tests/.data/seed/mobilenet_v2.onnx)")
    ap.add_argument("--inputs", help=".npz of its inputs (default: seeded random)")
    ap.add_argument("--limits", choices=["default", "cpu", "gpu"], default="default",
                    help="webiree's build: 'default' (the variants for GPU and CPU adapters, picked at load), "
                         "or one class's kernels alone")
    ap.add_argument("--no-start-tier", action="store_true",
                    help="run the picked variant's own kernels from the first run (webiree.js startTier: false)")
    ap.add_argument("--throttle", type=float, default=0, metavar="MBIT_S",
                    help="emulate a network of this many Mbit/s each way (40 ms latency) for both visits")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=300, help="seconds for the whole in-page benchmark")
    args = ap.parse_args(argv)

    missing = [f for f in ORT_FILES if not (ORT_DIST / f).is_file()]
    if missing:
        print(f"onnxruntime-web is not installed in {HERE / 'node_modules'} (missing {missing}); run:\n"
              f"  cd {HERE} && npm install --no-save --no-package-lock --prefix . onnxruntime-web@1.30.0",
              file=sys.stderr)
        return 2
    if not os.path.exists(CHROMIUM):
        print(f"{CHROMIUM} is missing (Debian's chromium; scripts/setup.sh installs it)", file=sys.stderr)
        return 2
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp/webiree-xdg")
    os.makedirs(os.environ["XDG_RUNTIME_DIR"], exist_ok=True)

    import base64

    import numpy as np
    import onnx
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    import webiree
    from webiree.bundler.server import serve_in_thread
    from webiree.testing import models

    if args.onnx:
        model = onnx.load(args.onnx)
        args.model = Path(args.onnx).stem
        feeds = dict(np.load(args.inputs)) if args.inputs else models.sample_inputs(model)
    else:
        model = getattr(models, args.model)()
        feeds = models.sample_inputs(model)
    kinds = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64", np.dtype(np.int32): "int32",
             np.dtype(np.bool_): "bool"}
    if any(v.dtype not in kinds for v in feeds.values()):
        print("this benchmark feeds float32 / int64 / int32 / bool inputs only", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="webiree-bench-") as tmp:
        root = Path(tmp)
        webiree.compile(model, root / "webiree", limits=args.limits)
        onnx.save(model, root / "model.onnx")
        (root / "ort").mkdir()
        for f in ORT_FILES:
            shutil.copyfile(ORT_DIST / f, root / "ort" / f)
        (root / "index.html").write_text("<!doctype html><title>bench</title><link rel=icon href='data:,'>")

        stack = contextlib.ExitStack()
        base = stack.enter_context(serve_in_thread(root))
        arg = {"runs": args.runs, "warmup": args.warmup, "ortThreads": ORT_WASM_THREADS, "startTier": not args.no_start_tier,
               "feeds": {k: {"type": kinds[v.dtype], "dims": list(v.shape),
                             "data": base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()}
                         for k, v in feeds.items()}}
        def wrapped(js):
            return f"""async (arg) => {{
          {ORT_SESSION_JS}
          const fn = {js};
          let timer;
          const limit = new Promise((_, reject) => {{ timer = setTimeout(
            () => reject(new Error('the benchmark timed out after {args.timeout} s')), {int(args.timeout * 1000)}); }});
          try {{ return await Promise.race([fn(arg), limit]); }} finally {{ clearTimeout(timer); }}
        }}"""
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
                page = browser.new_page()
                if args.throttle:   # Chromium's own network emulation, kept across the reload
                    cdp = page.context.new_cdp_session(page)
                    cdp.send("Network.enable")
                    cdp.send("Network.emulateNetworkConditions", {
                        "offline": False, "latency": 40, "downloadThroughput": args.throttle * 1e6 / 8,
                        "uploadThroughput": args.throttle * 1e6 / 8})
                page.goto(base)
                adapter = page.evaluate("""async () => { const a = await navigator.gpu?.requestAdapter();
                  return a ? `${a.info.vendor} ${a.info.architecture}` : 'none'; }""")
                try:
                    res = page.evaluate(wrapped(BENCH_JS), arg)
                    page.reload()
                    res["second"] = page.evaluate(wrapped(SECOND_VISIT_JS), arg)
                except PlaywrightError as e:
                    print(f"the benchmark failed in the page: {str(e).splitlines()[0]}", file=sys.stderr)
                    return 1
                finally:
                    version = browser.version
                    browser.close()
        finally:
            stack.close()

    webiree_js = Path(webiree.__file__).resolve().parents[1] / "web" / "webiree.js"
    w_gz = gz(webiree_js)
    o_gz = sum(gz(ORT_DIST / f) for f in ORT_FILES)
    w, o = res["webiree"], res["ort"]
    diff = res["maxRelDiff"]
    ok = diff <= TOLERANCE  # NaN compares False
    print(f"model {args.model}; Chromium {version}, WebGPU adapter {adapter}; {args.runs} timed runs after "
          f"{args.warmup} warm-up runs, the two runtimes alternating" +
          (f"; network emulated at {args.throttle:g} Mbit/s, 40 ms latency" if args.throttle else ""))
    ort_version = json.loads((ORT_DIST.parent / "package.json").read_text()).get("version", "?")
    print(f"webiree: {args.limits} build{' (no start tier)' if args.no_start_tier else ''}, kernel variant {w.get('variant') or '(one)'} picked; onnxruntime-web "
          f"{ort_version}: WebGPU EP, "
          f"wasm part on {ORT_WASM_THREADS} thread (no cross-origin isolation)")
    print(f"{'':22}{'webiree':>12}{'ort-web':>12}{'ort/webiree':>13}")
    for key, label in (("createMs", "session create (ms)"), ("firstRunMs", "first run (ms)"),
                       ("ttfrMs", "first result (ms)"), ("medianMs", "median run (ms)"),
                       ("minMs", "fastest run (ms)")):
        print(f"{label:22}{w[key]:12.2f}{o[key]:12.2f}{o[key] / max(w[key], 1e-9):13.2f}")
    sw, so = res["second"]["webiree"], res["second"]["ort"]
    print(f"{'2nd visit result (ms)':22}{sw['ttfrMs']:12.2f}{so['ttfrMs']:12.2f}{so['ttfrMs'] / max(sw['ttfrMs'], 1e-9):13.2f}"
          f"   (webiree's weights from the {sw['weightsSource']}; 2nd / 1st visit: webiree "
          f"{sw['ttfrMs'] / w['ttfrMs']:.2f}, ort-web {so['ttfrMs'] / o['ttfrMs']:.2f})")
    if w.get("firstVariant") != w.get("variant"):
        print(f"webiree's first result came from the start tier {w['firstVariant']}; {w['variant']}'s pipelines were "
              f"all created {w['readyMs']:.0f} ms after the start (the timed runs use them)")
    print(f"{'runtime, gzipped (B)':22}{w_gz:12d}{o_gz:12d}{o_gz / w_gz:13.0f}")
    print(f"outputs {'agree' if ok else 'DIFFER'}: max |webiree - ort| / max |ort| = {diff:.2e} "
          f"(tolerance {TOLERANCE:.0e})")
    print(json.dumps({"model": args.model, "limits": args.limits, "throttle_mbit_s": args.throttle, "webiree": w, "ort": o, "second_visit": res["second"],
                      "webiree_gz": w_gz, "ort_gz": o_gz,
                      "ort_wasm_threads": ORT_WASM_THREADS, "max_rel_diff": diff, "tolerance": TOLERANCE}))
    if not ok:
        print(f"FAILED: webiree's outputs differ from ort-web's by {diff:.2e} > {TOLERANCE:.0e} "
              f"(max |diff| / max |ort| per output); the timings above are not a comparison", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
