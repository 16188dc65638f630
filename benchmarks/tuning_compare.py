#!/usr/bin/env python
"""A model built with the heuristic of this commit against tuning tables, in one run.

Usage::

    python benchmarks/tuning_compare.py MODEL.onnx [--inputs X.npz] [--table T.json ...]
                                        [--recorded-heuristic T.json ...] [--runs 30] [--limits adapter]

Builds (same model, same target, same adapter, same feeds):

- `heuristic`: no table, the kernel planner of this commit (wgsl_codegen/config.py);
- `table NAME`: each --table, its measured configurations where they apply (`webiree tune` wrote it);
- `recorded NAME`: each --recorded-heuristic table's *heuristic* configurations, the choices the
  planner made when that table was measured: the planner of then, so a revision of the heuristic
  is compared with what it replaced.

Each build's outputs are checked against onnxruntime CPU within the model's tolerance
(webiree.bench.model_tolerance); then all run in alternating turns (host to host) and the ratio
to `heuristic` is printed, and beside it the GPU time of a run (the sum of its dispatches' times
from timestamp queries, median of `runs` profiled runs in alternating turns too): host time
includes what the host does per run and varies from one session to another on the H200 (two
sessions of the same kernels have differed by 2x), GPU time is what the kernels cost. A benchmark, not a test: it asserts nothing about speed, and exits 1
on a wrong result.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--inputs")
    ap.add_argument("--table", action="append", default=[])
    ap.add_argument("--recorded-heuristic", action="append", default=[])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--limits", default="adapter")
    args = ap.parse_args(argv)

    import onnx
    import onnxruntime as ort
    from webiree.bench import _feeds, _max_rel_err, alternating_medians, model_tolerance
    from webiree.bundler.site import resolve_target
    from webiree.compiler.driver import compile_model
    from webiree.hal_webgpu.wgpu_driver import adapter_info
    from webiree.session import InferenceSession
    from webiree.wgsl_codegen.tuning import Table

    builds = {"heuristic": None}
    for path in args.table:
        builds[f"table {Path(path).name}"] = Table.load(path)
    for path in args.recorded_heuristic:
        data = json.loads(Path(path).read_text())
        old = copy.deepcopy(data)
        for e in old["entries"].values():
            e["config"] = e["heuristic"]
        builds[f"recorded {Path(path).name}"] = Table(old, f"{path} (its recorded heuristic)")
    target = resolve_target(args.limits)
    sessions, wrong = {}, []
    feeds = ref = tol = None
    for name, table in builds.items():
        res = compile_model(args.model, None, target, tuning=table)
        sess = InferenceSession.from_module(res.module, res.weights)
        if feeds is None:
            feeds = _feeds(sess.module, args.inputs)
            so = ort.SessionOptions()
            so.log_severity_level = 3
            ref = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
            tol = model_tolerance(onnx.load(args.model, load_external_data=False), args.model, feeds, ref)[0]
        err = _max_rel_err(sess.run(None, feeds), ref)
        used = res.module.info.get("tuning", {}).get("used", 0)
        print(f"  {name:<40} {len(res.dispatches)} dispatches, {used} from the table, rel. error {err:.1e} "
              f"{'ok' if err <= tol else 'WRONG'}", flush=True)
        if not err <= tol:
            wrong.append(name)
        sessions[name] = sess
    ms = alternating_medians(list(sessions.values()), feeds, args.runs, args.warmup)
    gpu = {name: [] for name in sessions}
    for _ in range(max(1, args.runs // 10)):
        for name, s in sessions.items():
            for i in range(args.warmup + 10):
                s.run(None, feeds, profile=True)
                if i >= args.warmup and s.last_profile:
                    gpu[name].append(sum(s.last_profile) / 1e6)
    gpu = {k: statistics.median(v) if v else float("nan") for k, v in gpu.items()}
    base, gbase = ms[0], gpu["heuristic"]
    print(f"{Path(args.model).name} on {adapter_info().get('device', '?')} (limits {args.limits}; medians of "
          f"{args.runs}+ runs in alternating turns: host to host, and the GPU time of the dispatches):")
    for name, t in zip(sessions, ms):
        print(f"  {name:<40} host {t:9.3f} ms  {t / base:5.2f}x heuristic   GPU {gpu[name]:8.3f} ms  "
              f"{gpu[name] / gbase:5.2f}x heuristic")
    for s in sessions.values():
        s.close()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
