"""Native reference on a CUDA GPU: the seed models in PyTorch, fp32 with TF32 off.

    python benchmarks/torch_reference.py --seed-dir DIR [--runs 50] [--json out.json]

Builds each model exactly as tests/seed/export_seed_models.py does (same seeds),
feeds the same inputs (DIR/NAME.inputs.npz) and times host -> host latency
(input upload, forward, output download) for eager mode and for CUDA graphs.
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


def timed(fn, runs, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


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
        torch.manual_seed(seed.SEED)
        model, _, _ = build()
        seed._randomize_norms(model, seed.SEED)
        seed._randomize_biases(model, seed.SEED)
        model = model.eval().cuda()
        feeds = dict(np.load(Path(a.seed_dir) / f"{name}.inputs.npz"))
        host = {k: torch.from_numpy(v) for k, v in feeds.items()}

        def eager():
            with torch.no_grad():
                res = model(**{k: v.cuda(non_blocking=False) for k, v in host.items()})
                return [r.cpu() for r in (res.values() if hasattr(res, "values") else res) if torch.is_tensor(r)]
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
        gouts = [r for r in (gout.values() if hasattr(gout, "values") else gout) if torch.is_tensor(r)]

        def graphed():
            for k, v in host.items():
                static[k].copy_(v)
            g.replay()
            return [r.cpu() for r in gouts]
        graph_ms = timed(graphed, a.runs)
        out["models"][name] = {"eager_ms": eager_ms, "cuda_graph_ms": graph_ms}
        print(f"torch {name}: eager {eager_ms:.2f} ms, CUDA graph {graph_ms:.2f} ms", flush=True)
    n = 4096
    x, y = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    ms = timed(lambda: x @ y, 20)
    out["matmul_4096_tflops"] = 2 * n ** 3 / (ms / 1e3) / 1e12
    print(f"torch fp32 4096^3 matmul (TF32 off): {out['matmul_4096_tflops']:.1f} TFLOP/s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
