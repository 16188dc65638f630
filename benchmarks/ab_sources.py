"""Two compilers, one adapter: a model built by another commit's webiree and by this tree's, run in turns.

    git worktree add /tmp/old COMMIT          # or: git archive COMMIT webiree | tar -x -C /tmp/old
    python benchmarks/ab_sources.py --old /tmp/old --seed-dir tests/.data/seed mobilebert [minilm ...]

For each model (DIR/NAME.onnx with DIR/NAME.inputs.npz and DIR/NAME.ref.npz, as
tests/seed/export_seed_models.py writes them) it builds with the other tree's compiler (a subprocess
with PYTHONPATH=OLD) and with this one's, default settings; loads both builds in this process (this
tree's runtime runs both: what differs is the compiler's output); checks every output of both
against onnxruntime's (max |diff| / max |ref| <= 1e-4 or --tolerance, else exit 1); then, after 1 s of
warm-up each (and the GPU's clock raised), times host to host in alternating turns of 10 runs (median of
--runs each; webiree.bench.alternating_medians) and prints the ratio, and each build's GPU time by op kind
and kernel strategy (timestamp queries, 10 profiled runs). Same model, inputs, adapter and runtime;
the builds are the only difference.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import webiree  # noqa: E402
from webiree.bench import alternating_medians  # noqa: E402
from webiree.hal_webgpu import wgpu_driver  # noqa: E402

TOLERANCE = 1e-4


def build(src: Path, onnx_path: Path, out: Path, label: str) -> None:
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    p = subprocess.run([sys.executable, "-m", "webiree.cli", "build", str(onnx_path.resolve()), "--out", str(out.resolve())],
                       cwd=src, env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"build with {src} failed:\n{p.stderr[-2000:]}")
    # the build's own line, without this machine's folders (reports are kept in docs/perf/)
    print(f"  {label}: {p.stdout.strip().splitlines()[-1].replace(str(out.resolve()), out.name)}")


def warm(sessions, feeds, seconds: float = 1.0) -> None:
    """The GPU's clock up (hold_clocks), then each session's runs for `seconds`: a GPU that idled
    through the builds runs at its idle clock (an H100's SM at 345 MHz against 1,980): without this,
    MobileNetV2's 80 runs read 2.22 ms on an H100, and 0.658 ms warm in a later call there
    (docs/performance.md)."""
    wgpu_driver.hold_clocks(seconds)
    for s in sessions:
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            s.run(None, feeds)


def gpu_time_by_kind(sess, feeds, runs: int = 10) -> tuple[float, list]:
    total, per = [], collections.Counter()
    counts = collections.Counter(f"{d['kind']}:{d['config']['strategy']}" for d in sess.module.info["dispatches"])
    for _ in range(runs):
        sess.run(None, feeds, profile=True)
        total.append(sum(sess.last_profile))
        for d, ns in zip(sess.module.info["dispatches"], sess.last_profile):
            per[f"{d['kind']}:{d['config']['strategy']}"] += ns / runs
    return float(np.median(total)) / 1e6, [(k, v / 1e6, counts[k]) for k, v in per.most_common()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="a folder holding the other commit's webiree/")
    ap.add_argument("--seed-dir", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--tolerance", type=float, default=TOLERANCE,
                    help="max |diff| / max |ref| allowed (a float16 model: its own noise against onnxruntime's)")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models:
            print(f"{name}:")
            dirs = {"old": Path(tmp) / f"{name}-old", "new": Path(tmp) / f"{name}-new"}
            build(a.old.resolve(), a.seed_dir / f"{name}.onnx", dirs["old"], "old")
            build(ROOT, a.seed_dir / f"{name}.onnx", dirs["new"], "new")
            feeds = dict(np.load(a.seed_dir / f"{name}.inputs.npz"))
            ref = dict(np.load(a.seed_dir / f"{name}.ref.npz"))
            sessions = {k: webiree.InferenceSession(d) for k, d in dirs.items()}
            for k, s in sessions.items():
                outs = s.run(None, feeds)
                err = max(float(np.abs(o - ref[m.name]).max() / np.abs(ref[m.name]).max())
                          for o, m in zip(outs, s.get_outputs()))
                ok = err <= a.tolerance
                status |= not ok
                print(f"  {k}: variant {s.variant}, {len(s.module.info['dispatches'])} dispatches, "
                      f"rel. error {err:.1e} {'ok' if ok else 'WRONG'}")
            warm(sessions.values(), feeds)
            med = dict(zip(sessions, alternating_medians(list(sessions.values()), feeds, a.runs, warmup=3)))
            print(f"  host to host, median of {a.runs} in turns of 10: old {med['old']:.3f} ms, new {med['new']:.3f} ms, "
                  f"new / old {med['new'] / med['old']:.3f}")
            for k, s in sessions.items():
                total, kinds = gpu_time_by_kind(s, feeds)
                print(f"  {k} GPU time {total:.3f} ms: " + ", ".join(f"{kk} {ms:.3f} ms x{n}" for kk, ms, n in kinds[:6]))
    return status


if __name__ == "__main__":
    sys.exit(main())
