#!/usr/bin/env python
"""What kernels chosen at load buy (issue #19 item 1), natively on this machine's adapter.

Usage::

    python benchmarks/kernel_variants.py [--models minilm,mobilenet_v2] [--runs 10] [--turns 3] [--json OUT]

For each seed model (tests/.data/seed/NAME.onnx with NAME.inputs.npz and NAME.ref.npz) three builds:

- `default`: `webiree build` with no --limits: GPU- and CPU-class kernel variants, the session
  picking by the adapter (lavapipe: 'cpu-sg8', the CPU-class kernels with its subgroup size);
- `adapter`: `--limits adapter`, tuned for this adapter (its limits, its subgroup size);
- `gpu`: `--limits gpu`, the GPU-class kernels alone: what a default build ran before variants.

Each session's output is checked against the reference; then the sessions run in alternating
turns (`runs` timed runs after one warm-up each turn, a slow build fewer: see below), so load
drift on shared cores hits all alike, and the medians over all turns are compared with
`adapter`. A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "tests" / ".data" / "seed"
BUILDS = {"default": {}, "adapter": {"limits": "adapter"}, "gpu": {"limits": "gpu"}}
SLOW_MS = 2000      # a build slower than this per run is timed 2 runs a turn


def main(argv=None) -> int:
    import webiree
    from webiree.bench import _max_rel_err

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="minilm,mobilenet_v2")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    report = {}
    for name in args.models.split(","):
        feeds = dict(np.load(SEED / f"{name}.inputs.npz"))
        ref = np.load(SEED / f"{name}.ref.npz")
        sessions, row = {}, {}
        with tempfile.TemporaryDirectory() as tmp:
            for build, kw in BUILDS.items():
                t0 = time.perf_counter()
                res = webiree.compile(SEED / f"{name}.onnx", Path(tmp) / build, **kw)
                built = time.perf_counter() - t0
                t0 = time.perf_counter()
                sess = webiree.InferenceSession(Path(tmp) / build)
                load = time.perf_counter() - t0
                outs = sess.run(None, feeds)
                err = _max_rel_err(outs, [ref[o.name] for o in sess.get_outputs()])
                sessions[build] = sess
                row[build] = {"variant": sess.variant, "executables": len(sess.module.executables),
                              "module_executables": len(res.module.executables), "build_s": round(built, 1),
                              "load_s": round(load, 2), "rel_err": err, "times": []}
            for _ in range(args.turns):
                for build, sess in sessions.items():
                    t0 = time.perf_counter()
                    sess.run(None, feeds)      # warm-up, and a first guess of the run time
                    n = args.runs if (time.perf_counter() - t0) * 1e3 < SLOW_MS else 2
                    for _ in range(n):
                        t0 = time.perf_counter()
                        sess.run(None, feeds)
                        row[build]["times"].append((time.perf_counter() - t0) * 1e3)
            for sess in sessions.values():
                sess.close()
        base = statistics.median(row["adapter"]["times"])
        print(f"{name}:")
        for build, r in row.items():
            r["median_ms"] = statistics.median(r["times"])
            r["vs_adapter"] = r["median_ms"] / base
            print(f"  {build:<8} variant {r['variant'] or '-':<8} {r['median_ms']:>9.1f} ms  {r['vs_adapter']:5.2f}x "
                  f"adapter  (rel. err {r['rel_err']:.1e}; {r['executables']} of the module's "
                  f"{r['module_executables']} executables; built {r['build_s']} s, loaded {r['load_s']} s; "
                  f"{len(r['times'])} runs)")
        report[name] = row
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
