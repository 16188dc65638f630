"""Python (Pyodide) vs JavaScript: the same build run by both runtimes in one headless Chromium page.

    .venv/bin/python benchmarks/pyodide_overhead.py [--models mlp small_cnn mobilenet_v2] [--runs 30]

What is compared with what: the same build folder, the same feeds, the same page and
adapter (Chromium's WebGPU on SwiftShader here), runs interleaved run by run so drift in
the machine's load hits both alike. Printed per model: the medians of both runtimes, their
ratio, and each runtime's host time outside the GPU wait (latency minus the time spent in
GPUBuffer.mapAsync, measured the same way in both), whose difference is the per-inference
overhead of running the schedule from Python (the project aims at < 5 ms for MobileNetV2).
mobilenet_v2 needs the seed model in tests/.data/seed (tests/seed/export_seed_models.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import webiree  # noqa: E402
from tests.browser_util import chromium, serving  # noqa: E402
from tests.test_browser import b64_feeds, evaluate  # noqa: E402
from tests.test_pyodide import RUN_TIMEOUT_S, SEED, open_python_page, py  # noqa: E402
from webiree.bundler import pyodide as P  # noqa: E402
from webiree.testing import models  # noqa: E402

BENCH_SETUP_PY = """
import array, base64, json
import webiree_runtime as wr
arg = json.loads(ARG)
CODES = {"float32": "f", "int64": "q", "int32": "i", "bool": "B"}
bench_feeds = {}
for name, f in arg["feeds"].items():
    a = array.array(CODES[f["type"]])
    a.frombytes(base64.b64decode(f["data"]))
    bench_feeds[name] = (a, f["dims"])
bench_sess = await wr.InferenceSession.create(arg["url"])
await bench_sess.run(None, bench_feeds)

async def bench_once():
    await bench_sess.run(None, bench_feeds)
"""

# Both runtimes in one page, runs interleaved so drift in the machine's load hits both alike.
# GPUBuffer.mapAsync is wrapped to time the wait for the GPU in either runtime the same way:
# host = latency - that wait is each runtime's own work per inference (feeds, encoding,
# submit, readback copy, and for Python the hops between the interpreter and JS).
BENCH_JS = """async ({url, feeds, runs, timeoutMs}) => {
  const p = globalThis.webireePy;
  const w = await import(url + 'webiree.js');
  const ARR = {float32: Float32Array, int64: BigInt64Array, int32: Int32Array, bool: Uint8Array};
  const bytes = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const tensors = {};
  for (const [name, {type, dims, data}] of Object.entries(feeds)) tensors[name] = new w.Tensor(type, new ARR[type](bytes(data).buffer), dims);
  const js = await w.InferenceSession.create(url, {timeoutMs});
  await js.run(tensors);
  const once = p.namespace.get('bench_once');
  const mapAsync = GPUBuffer.prototype.mapAsync;
  let wait = 0;
  GPUBuffer.prototype.mapAsync = function (...args) {
    const t0 = performance.now();
    return mapAsync.apply(this, args).then((v) => { wait += performance.now() - t0; return v; });
  };
  const r = {py: [], js: [], pyHost: [], jsHost: []};
  try {
    for (let i = 0; i < runs; i++) {
      wait = 0;
      let t0 = performance.now();
      await once();
      r.py.push(performance.now() - t0);
      r.pyHost.push(r.py[i] - wait);
      wait = 0;
      t0 = performance.now();
      await js.run(tensors);
      r.js.push(performance.now() - t0);
      r.jsHost.push(r.js[i] - wait);
    }
  } finally {
    GPUBuffer.prototype.mapAsync = mapAsync;
    once.destroy();
    await js.release();
    await p.exec('await bench_sess.release()');
  }
  return r;
}"""



def build(root: Path, names: list[str]) -> dict:
    """name -> feeds; the first site carries Pyodide (python.html is opened from it)."""
    feeds = {}
    for i, name in enumerate(names):
        if name == "mobilenet_v2":
            webiree.compile(SEED / f"{name}.onnx", root / name, pyodide=(i == 0))
            feeds[name] = dict(np.load(SEED / f"{name}.inputs.npz"))
        else:
            model = getattr(models, name)()
            webiree.compile(model, root / name, pyodide=(i == 0))
            feeds[name] = models.sample_inputs(model)
    return feeds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "small_cnn"])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="webiree-pyodide-bench-") as tmp:
        root = Path(tmp)
        feeds = build(root, args.models)
        first = args.models[0]
        with serving(root) as server, chromium() as browser:
            ctx, page = open_python_page(browser, f"{server}{first}/{P.PYTHON_PAGE}")
            if page.get_attribute("body", "data-state") != "ready":
                print(f"python.html did not boot: {page.inner_text('#status')}", file=sys.stderr)
                return 1
            boot_ms = evaluate(page, "async () => webireePy.bootMs")
            print(f"Chromium WebGPU (SwiftShader); Pyodide boot {boot_ms:.0f} ms; "
                  f"median of {args.runs} interleaved runs per model")
            for name in args.models:
                r = py(page, BENCH_SETUP_PY + "\njson.dumps('ok')",
                       {"url": f"../{name}/", "feeds": b64_feeds(feeds[name])})
                if r != "ok":
                    print(f"{name}: the Python session failed: {r}", file=sys.stderr)
                    return 1
                t = evaluate(page, BENCH_JS, {"url": f"{server}{name}/", "feeds": b64_feeds(feeds[name]),
                                              "runs": args.runs, "timeoutMs": 600_000}, RUN_TIMEOUT_S * 2)
                med = {k: statistics.median(v) for k, v in t.items()}
                print(f"{name}: Python {med['py']:.2f} ms, JavaScript {med['js']:.2f} ms "
                      f"(Python / JavaScript = {med['py'] / med['js']:.2f}x); host time outside the GPU wait: "
                      f"Python {med['pyHost']:.2f} ms, JavaScript {med['jsHost']:.2f} ms, "
                      f"overhead of Python {med['pyHost'] - med['jsHost']:+.2f} ms per inference")
            ctx.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
