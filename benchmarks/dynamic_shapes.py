#!/usr/bin/env python
"""What a dynamic build costs: one build for a range of sizes vs. a build pinned to one size.

Usage::

    python benchmarks/dynamic_shapes.py [--runs 20] [--limits adapter] [--json OUT.json]

Models (exported here from `transformers` configs with seeded weights, no hub access, with
symbolic axes as users export them):

- `minilm`: a BERT of MiniLM-L6's size (hidden 384, 6 layers, 12 heads), symbolic batch and
  sequence; the dynamic build takes one text of 1..512 tokens (kernels tuned for the default
  `opt` size, a quarter of the largest: 128); both run at 1 x 128.
- `minilm-batch`: the same with batch 1..4 too (a 16x larger arena at the largest sizes).
- `mobilenet_v2`: MobileNetV2 (transformers' config, 1001 classes), symbolic height and width;
  the dynamic build takes 96..512 on each side, tuned for 224 (`--dim height=96..512@224`, a
  TensorRT-style min/opt/max profile); both run at 224 x 224.

For each, `webiree.bench.bench` builds the pinned and the dynamic module, checks both against
onnxruntime CPU on the same feeds and times each; then both sessions run again in alternating
turns of 10 runs (after warm-up runs each turn: the same adapter, settings, feeds and moment,
so clock and load drift hit both alike), and the printed ratio is dynamic / pinned of those
medians.
A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

CASES = {
    "minilm": {"dims": {"batch": 1, "sequence": 128}, "dynamic": {"sequence": (1, 512)}},
    "minilm-batch": {"dims": {"batch": 1, "sequence": 128}, "dynamic": {"batch": (1, 4), "sequence": (1, 512)}},
    "mobilenet_v2": {"dims": {"height": 224, "width": 224},
                     "dynamic": {"height": (96, 512, 224), "width": (96, 512, 224)}},
}


def export(name: str, path: Path) -> None:
    import torch

    from webiree.testing.models import export_bert_dynamic
    if name == "minilm":
        export_bert_dynamic(path, hidden=384, layers=6, heads=12, attn="sdpa")
        return
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification
    torch.manual_seed(0)
    model = MobileNetV2ForImageClassification(MobileNetV2Config(num_labels=1001, image_size=224)).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(pixel_values=x).logits

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits(model), (torch.zeros(1, 3, 224, 224),), str(path), input_names=["pixel_values"],
                          output_names=["logits"], opset_version=17, dynamo=False,
                          dynamic_axes={"pixel_values": {2: "height", 3: "width"}})


def interleaved(path: Path, case: dict, args) -> tuple[float, float]:
    """Median ms of the pinned and the dynamic build, run alternately (bench checked both)."""
    from webiree.bench import _feeds, alternating_medians
    from webiree.bundler.site import compile as build
    from webiree.session import InferenceSession
    with tempfile.TemporaryDirectory() as tmp:
        build(path, Path(tmp) / "p", limits=args.limits, dims=case["dims"])
        build(path, Path(tmp) / "d", limits=args.limits, dims={**case["dims"], **case["dynamic"]})
        sessions = [InferenceSession(Path(tmp) / "p"), InferenceSession(Path(tmp) / "d")]
        pinned, dynamic = alternating_medians(sessions, _feeds(sessions[0].module, None), args.runs, args.warmup)
        for s in sessions:
            s.close()
    return pinned, dynamic


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--limits", default="adapter")
    p.add_argument("--only", action="append", choices=list(CASES))
    p.add_argument("--submit-chunk", type=int, default=0)
    p.add_argument("--json")
    args = p.parse_args(argv)
    from webiree.bench import bench
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or list(CASES):
            model = name.split("-")[0]
            path = Path(tmp) / f"{model}.onnx"
            if not path.exists():
                export(model, path)
            case = CASES[name]
            r = bench(path, args.runs, args.warmup, args.limits, dims=case["dims"], dynamic=case["dynamic"],
                      submit_chunk=args.submit_chunk, log=lambda *a: None)
            pinned, dyn = r["results"]["webiree"], r["results"]["webiree-dynamic"]
            pinned["median_ms"], dyn["median_ms"] = interleaved(path, case, args)
            ratio = dyn["median_ms"] / pinned["median_ms"]
            shape = ", ".join(f"{k}={v}" for k, v in case["dims"].items())
            print(f"{name}: pinned ({shape}) {pinned['median_ms']:.2f} ms, dynamic ({dyn['ranges']}) "
                  f"{dyn['median_ms']:.2f} ms at the same shape: {ratio:.3f}x; onnxruntime-cpu "
                  f"{r['results']['onnxruntime-cpu']['median_ms']:.2f} ms; executables {r['dynamic_executables'][0]} "
                  f"pinned / {r['dynamic_executables'][1]} dynamic; rel.err {pinned['rel_err']:.1e} / "
                  f"{dyn['rel_err']:.1e}; adapter {r['adapter'].get('device', '?')}", flush=True)
            out[name] = {"pinned_ms": pinned["median_ms"], "dynamic_ms": dyn["median_ms"], "ratio": ratio,
                         "adapter": r["adapter"], "runs": args.runs}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
