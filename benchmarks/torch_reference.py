"""Native reference on a CUDA GPU: the seed models in PyTorch, fp32 with TF32 off.

    python benchmarks/torch_reference.py --seed-dir DIR [--runs 50] [--json out.json]

Builds each model exactly as tests/seed/export_seed_models.py does (same seeds),
feeds the same inputs (DIR/NAME.inputs.npz), checks that eager mode and the CUDA
graph both reproduce onnxruntime CPU's outputs (DIR/NAME.ref.npz, written by the
export script) to TOLERANCE (max |torch - ref| / max |ref| per output, 1e-4, above
which `webiree bench` marks webiree's result WRONG), and exits 1 before timing a
model that does not. Then it times host -> host latency (input upload, forward, output
download) for eager mode and for CUDA graphs, after at least 3 runs and 1 s of
warm-up, as `webiree bench` warms up webiree. The fp32 4096^3 matmul is checked
against fp64 and reported as GPU time (CUDA events, like webiree's timestamp
queries) and as host time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "seed"))
import export_seed_models as seed  # noqa: E402


TOLERANCE = 1e-4


def timed(fn, runs, warmup=3, warm_seconds=1.0):
    """Median host time (ms) of fn() + synchronize, after `warmup` calls and at least
    `warm_seconds` of calls (GPUs raise their clocks only under sustained load)."""
    t_end = time.perf_counter() + warm_seconds
    n = 0
    while n < warmup or time.perf_counter() < t_end:
        fn()
        torch.cuda.synchronize()
        n += 1
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def gpu_timed(fn, runs):
    """Median GPU time (ms) of fn() between two CUDA events (call after timed(): warm)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(runs):
        start.record()
        fn()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end))
    return statistics.median(ts)


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| (inf if the shapes differ; NaN stays NaN)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return float("inf")
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)) if ref.size else 0.0


def check(what: str, outs: dict, ref) -> float:
    """The worst rel_err of `outs` {output name: tensor} against `ref`; exits 1 above TOLERANCE."""
    errs = {k: rel_err(outs[k].cpu().numpy(), ref[k]) if k in outs else float("inf") for k in ref.files}
    worst = max(errs.values())
    if not worst <= TOLERANCE:  # NaN fails too
        sys.exit(f"FAILED: torch {what} differs from onnxruntime's outputs: {errs} > {TOLERANCE:.0e} "
                 "(max |torch - ref| / max |ref|); not the model webiree runs, or not fp32: not timed")
    return worst


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seed-dir", required=True)
    p.add_argument("--runs", type=int, default=50)
    p.add_argument("--json")
    p.add_argument("--only", nargs="*")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "models": {}}
    for name, build in seed.MODELS.items():
        if a.only and name not in a.only:
            continue
        torch.manual_seed(seed.SEED)  # the seeds of export_seed_models.export_one
        np.random.seed(seed.SEED)
        model, _, names = build()
        seed._randomize_norms(model, seed.SEED + 1)
        seed._randomize_biases(model, seed.SEED + 2)
        model = model.eval().cuda()
        feeds = dict(np.load(Path(a.seed_dir) / f"{name}.inputs.npz"))
        ref_path = Path(a.seed_dir) / f"{name}.ref.npz"
        if not ref_path.is_file():
            sys.exit(f"FAILED: no reference outputs {ref_path}; run tests/seed/export_seed_models.py --out {a.seed_dir}")
        ref = np.load(ref_path)
        host = {k: torch.from_numpy(v) for k, v in feeds.items()}

        def eager():
            with torch.no_grad():
                res = model(**{k: v.cuda(non_blocking=False) for k, v in host.items()})
                return {k: res[k].cpu() for k in names}
        eager_err = check(f"{name} eager", eager(), ref)
        eager_ms = timed(eager, a.runs)
        # CUDA graphs: static input buffers, one replay, outputs copied back
        static = {k: v.cuda() for k, v in host.items()}
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(3):
                model(**static)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g), torch.no_grad():
            gout = model(**static)
        gouts = {k: gout[k] for k in names}

        def graphed():
            for k, v in host.items():
                static[k].copy_(v)
            g.replay()
            return {k: r.cpu() for k, r in gouts.items()}
        graph_err = check(f"{name} CUDA graph", graphed(), ref)
        graph_ms = timed(graphed, a.runs)
        out["models"][name] = {"eager_ms": eager_ms, "cuda_graph_ms": graph_ms,
                               "rel_err": {"eager": eager_err, "cuda_graph": graph_err}}
        print(f"torch {name}: eager {eager_ms:.2f} ms, CUDA graph {graph_ms:.2f} ms (host to host; outputs "
              f"match onnxruntime to {max(eager_err, graph_err):.1e})", flush=True)
    n = 4096
    x, y = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    err = rel_err((x @ y).cpu().numpy(), (x.double() @ y.double()).cpu().numpy())
    if not err <= TOLERANCE:
        sys.exit(f"FAILED: torch's fp32 4096^3 matmul differs from fp64 by {err:.1e} > {TOLERANCE:.0e} (TF32 on?)")
    ms = timed(lambda: x @ y, 20)
    gpu_ms = gpu_timed(lambda: x @ y, 20)
    out["matmul_4096_tflops"] = 2 * n ** 3 / (ms / 1e3) / 1e12  # host time
    out["matmul_4096_gpu_tflops"] = 2 * n ** 3 / (gpu_ms / 1e3) / 1e12
    print(f"torch fp32 4096^3 matmul (TF32 off, rel. error vs fp64 {err:.1e}): "
          f"{out['matmul_4096_gpu_tflops']:.1f} TFLOP/s GPU time (CUDA events), "
          f"{out['matmul_4096_tflops']:.1f} TFLOP/s host time", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
