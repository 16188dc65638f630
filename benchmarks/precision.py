#!/usr/bin/env python
"""What a model's shipped precision costs and saves: the same model as float32, float16, int8 and
int4, each as its tool writes it, built by webiree and run on the same adapter.

Usage::

    python benchmarks/precision.py [--seed-dir tests/.data/seed] [--runs 30] [--limits adapter] [--json OUT]
                                   [--only minilm] [--variant int8-dynamic ...] [--reverse]

Variants of each seed model (tests/seed/export_seed_models.py writes them; `--seed-dir`):

- `f32`: the exported model.
- `fp16`: onnxruntime's float16 converter, keep_io_types=True (float32 in and out); with the
  adapter's limits (the default), activations are stored as halves where the adapter has
  shader-f16 (compiler/half_storage.py).
- `fp16-f32act`: the same file, built without shader-f16: activations held in f32 words.
- `int8-dynamic` (MiniLM): onnxruntime's quantize_dynamic (int8 weights; DynamicQuantizeLinear +
  MatMulInteger).
- `int8-qdq`: quantize_static in QDQ format, per channel, calibrated on 4 seeded inputs
  (MobileNetV2: noise images; MiniLM: its feeds with the ids shuffled, MatMul and Gemm only).
- `int4` (MiniLM): onnxruntime's MatMulNBitsQuantizer (4 bits, blocks of 32, symmetric).

Each variant is checked against onnxruntime CPU on the same file within the model's own tolerance
(webiree.bench.model_tolerance: four float16 steps for a half model, 4x onnxruntime's
optimizations-off/on difference for a quantized one), after the f32 build has run for 2 s to warm
the adapter (`--reverse` takes the variants in the other order); then all variants of a model run in
alternating turns of 10 runs (after warm-up each turn: same adapter, settings, feeds and moment),
and the printed ratio is variant / f32 of those medians. Sizes: `weights.bin` (what webiree's site
downloads besides the module and the runtime) next to the .onnx file (what onnxruntime-web
downloads for the same model). A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
WARM_SECONDS = 2.0
VARIANTS = {"minilm": ["f32", "fp16", "fp16-f32act", "int8-dynamic", "int8-qdq", "int4"],
            "mobilenet_v2": ["f32", "fp16", "fp16-f32act", "int8-qdq"]}


def make_variant(src: Path, variant: str, dst: Path, feeds: dict) -> Path:
    from webiree.testing import models as M
    if variant == "f32":
        return src
    if variant in ("fp16", "fp16-f32act"):
        onnx.save(M.float16_model(src, keep_io_types=True), str(dst))
    elif variant == "int8-dynamic":
        M.quantize_dynamic_model(src, dst)
    elif variant == "int8-qdq":
        rng = np.random.default_rng(0)
        if all(np.issubdtype(v.dtype, np.floating) for v in feeds.values()):    # an image model: noise
            calib = [{k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in feeds.items()} for _ in range(4)]
            M.quantize_static_qdq(src, dst, calib)
        else:   # a text model: its own feeds, the ids shuffled; its products only (the attention
            # mask's -3.4e38 would give the masked scores' QuantizeLinear an infinite scale)
            calib = [{k: (rng.permutation(v.reshape(-1)).reshape(v.shape) if k == "input_ids" else v)
                      for k, v in feeds.items()} for _ in range(4)]
            M.quantize_static_qdq(src, dst, calib, op_types_to_quantize=["MatMul", "Gemm"])
    elif variant == "int4":
        onnx.save(M.quantize_nbits_model(src), str(dst))
    else:
        raise ValueError(variant)
    return dst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed-dir", default=str(ROOT / "tests" / ".data" / "seed"))
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--limits", default="adapter")
    p.add_argument("--only", action="append", choices=list(VARIANTS))
    p.add_argument("--variant", action="append", metavar="NAME",
                   help="time only these variants (and f32, the base of every ratio); repeatable")
    p.add_argument("--reverse", action="store_true",
                   help="build, create and time the variants in reverse order (a check that the order biases no ratio)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    known = {v for vs in VARIANTS.values() for v in vs}
    if set(args.variant or ()) - known:
        p.error(f"unknown variant(s) {sorted(set(args.variant) - known)}; known: {sorted(known)}")
    warnings.simplefilter("ignore")
    from webiree.bench import alternating_medians, bench
    from webiree.bundler.site import compile as build, resolve_target
    from webiree.session import InferenceSession

    seed = Path(args.seed_dir)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for model in args.only or list(VARIANTS):
            src = seed / f"{model}.onnx"
            feeds = dict(np.load(seed / f"{model}.inputs.npz"))
            # warm the adapter first: on the H200 the first variant's profiled GPU time was 4.2 ms
            # at cold clocks against 1.3 ms once warm (the same build), and its runs 1.7x as long
            warm_site = tmp / f"{model}-warm"
            build(src, warm_site, limits=args.limits)
            with InferenceSession(warm_site) as s:
                t_end = time.perf_counter() + WARM_SECONDS
                while time.perf_counter() < t_end:
                    s.run(None, feeds)
            sessions, rows = [], []
            chosen = [v for v in VARIANTS[model] if v == "f32" or not args.variant or v in args.variant]
            for variant in (chosen[::-1] if args.reverse else chosen):
                path = make_variant(src, variant, tmp / f"{model}-{variant}.onnx", feeds)
                limits = args.limits
                if variant.endswith("-f32act"):     # the same target without shader-f16: no halves stored
                    limits = {k: v for k, v in resolve_target(args.limits).as_limits().items() if k != "shader_f16"}
                r = bench(path, 3, 1, limits, inputs_path=str(seed / f"{model}.inputs.npz"), log=lambda *a: None)
                site = tmp / f"{model}-{variant}"
                build(path, site, limits=limits)
                sessions.append(InferenceSession(site))
                rows.append({"variant": variant, "rel_err": r["results"]["webiree"]["rel_err"],
                             "tolerance": r["tolerance"], "ok": r["results"]["webiree"]["rel_err"] <= r["tolerance"],
                             "weights_bytes": (site / "weights.bin").stat().st_size,
                             "module_bytes": sum(f.stat().st_size for f in site.glob("*.wrm")),
                             "onnx_bytes": path.stat().st_size, "dispatches": r["dispatches"], "ort_ms": r["results"]["onnxruntime-cpu"]["median_ms"],
                             "adapter": r["adapter"].get("device", "?"),
                             "kinds": {k: (v["count"], round(v["ms"], 3)) for k, v in r.get("kinds", {}).items()}})
            # the builds above left the GPU idle: its clock up again before the turns, as
            # ab_sources.py does (a run without it, 7 Dec on an H100, read f32 and int8 MiniLM at
            # 2.4-2.7 ms where ab_sources.py read 1.0-1.2 ms for the same builds)
            from webiree.hal_webgpu import wgpu_driver
            wgpu_driver.hold_clocks(1.0)
            medians = alternating_medians(sessions, feeds, args.runs, args.warmup)
            for s in sessions:
                s.close()
            base = medians[[r["variant"] for r in rows].index("f32")]
            print(f"{model} on {rows[0]['adapter']} (webiree limits {args.limits}, median of {max(1, args.runs // 10) * 10} runs "
                  f"in alternating turns):")
            for row, ms in zip(rows, medians):
                row["ms"] = ms
                row["ratio"] = row["ms"] / base
                print(f"  {row['variant']:<13} {row['ms']:9.2f} ms  {row['ratio']:5.2f}x f32  {row['dispatches']:4d} dispatches  weights.bin "
                      f"{row['weights_bytes'] / 1e6:7.2f} MB (+ module {row['module_bytes'] / 1e3:5.0f} kB)  "
                      f".onnx {row['onnx_bytes'] / 1e6:7.2f} MB   onnxruntime-cpu {row['ort_ms']:7.2f} ms   "
                      f"rel.err {row['rel_err']:.1e} (tol {row['tolerance']:.1e}) {'ok' if row['ok'] else 'WRONG'}",
                      flush=True)
                top = sorted(row["kinds"].items(), key=lambda kv: -kv[1][1])[:4]
                print(f"      GPU time {sum(ms for _, ms in row['kinds'].values()):.2f} ms, by kind (bench's profiled runs): " +
                      ", ".join(f"{k} {n} x {ms:.2f} ms" for k, (n, ms) in top), flush=True)
            out[model] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0 if all(r["ok"] for rows in out.values() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
