#!/usr/bin/env python
"""Token-by-token generation at GPT-2-small size: webiree (KV cache on the GPU, the next token
picked there) against onnxruntime CPU and PyTorch, per-token latency and tokens/s.

Usage::

    python benchmarks/generation.py [--layers 12] [--prompt 8] [--tokens 32] [--repeat 3]
        [--variants f32,fp16,int4] [--limits adapter] [--seq-opt 1] [--no-torch] [--browser]
        [--workdir DIR] [--json OUT]

The model: a GPT-2 of GPT-2-small's size (12 layers, 768 wide, 12 heads, vocabulary 50,257,
1,024 positions; `--layers` etc. shrink it) from `transformers` with seeded random weights, no hub
access (webiree.testing.models.gpt2_lm), exported with its KV cache as onnxruntime runs decoders
(export_gpt2_with_past: input_ids, attention_mask, position_ids, past_key_values.* in; logits,
present.* out; the first step runs the prompt with an empty past). Variants, each as its tool
writes it:

- `f32`: the exported file (tied embeddings: the 50,257 x 768 table for the Gather, and its
  transpose for the LM head, 154 MB each).
- `fp16`: onnxruntime's float16 converter, keep_io_types=True (float32 in and out, past and
  present included; webiree stores the weights as halves).
- `int4`: onnxruntime's MatMulNBitsQuantizer (4 bits, blocks of 32, symmetric) over MatMul and
  Gather: the LM head becomes MatMulNBits and the embedding GatherBlockQuantized. The blocks'
  projections are Gemm nodes in this export, which the quantizer does not take: they stay f32.

Each variant is built once by webiree as a *greedy* generation build (`generation=0`: ArgMax on
the GPU; the top-k head's TopK over 50,257 logits is O(vocab^2) comparisons in webiree today) with
`dims` batch=1, sequence=1..128 (kernels planned for `--seq-opt`, default 1: the decode step; the
prompt step runs the same kernels), past 0..127, total 1..128, and `--limits` (default 'adapter').
A build the adapter cannot hold (a tensor over maxStorageBufferBindingSize) is reported, not run.

Then, per variant, in alternating turns (`--repeat` generations each, after a warm-up generation
of 4 tokens each; the same prompt of `--prompt` seeded random ids, `--tokens` new tokens, greedy):

- webiree native: `InferenceSession.generate` (wgpu-py on the local adapter); per step the token
  id goes up and the next one comes back, the KV cache stays on the GPU;
- onnxruntime CPU: the same .onnx file, step by step with its own past (present fed back as
  numpy arrays), argmax of the last logits on the host;
- PyTorch (f32, and fp16 on CUDA): the same weights (gpt2_lm, same seed), `use_cache=True`,
  argmax on the device; CUDA when available, else CPU.

Reported per runtime: the first step (prompt of `--prompt` tokens, empty past) separately, the
median of the later steps (ms per generated token: the time between one token's arrival and the
next), and tokens/s over the later steps (their count / their summed time). Ratios are of those
medians, measured in this run. webiree's tokens must equal onnxruntime's (same file, same prompt)
in every generation: the script exits 1 if they differ, or if webiree refuses a file for another
reason than the adapter's limits (torch's agreement is printed, not required); onnxruntime's
smallest gap between the top two logits over the steps is printed, in units of the logits' std.
A benchmark, not a test: it asserts nothing about speed.

`--browser` runs the same webiree build's site in headless Chromium (webiree.js
`session.generate`) next to onnxruntime-web's WebGPU EP on the same .onnx file in the same page
(present.* kept on the GPU with `preferredOutputLocation: 'gpu-buffer'`, the logits read back and
argmax'd in JS), if onnxruntime-web is in benchmarks/node_modules (see browser_vs_ort_web.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("f32", "fp16", "int4")


# ------------------------------------------------------------------------------ models
def model_args(args) -> dict:
    return {"seed": args.seed, "layers": args.layers, "n_embd": args.width, "heads": args.heads, "vocab": args.vocab,
            "positions": args.positions, "std": args.std}


def model_file(variant: str, args, workdir: Path) -> Path:
    """The variant's .onnx in workdir (made once; a file of the same configuration is reused)."""
    a = model_args(args)
    stem = f"gpt2-L{a['layers']}-d{a['n_embd']}-h{a['heads']}-v{a['vocab']}-p{a['positions']}-std{a['std']}-s{a['seed']}"
    path = workdir / f"{stem}-{variant}.onnx"
    if path.exists():
        return path
    from webiree.testing import models as M
    f32 = workdir / f"{stem}-f32.onnx"
    if not f32.exists():
        M.export_gpt2_with_past(f32, **a)
    if variant == "fp16":
        onnx.save(M.float16_model(f32, keep_io_types=True), str(path))
    elif variant == "int4":
        onnx.save(M.quantize_nbits_model(f32, op_types=("MatMul", "Gather")), str(path))
    return path


def dims(args) -> dict:
    n = args.max_total
    return {"batch": 1, "sequence": (1, n, args.seq_opt), "past_sequence": (0, n - 1), "total_sequence": (1, n)}


# ------------------------------------------------------------------------------ runtimes
class OrtGreedy:
    """onnxruntime CPU, step by step with its own past; argmax on the host."""
    name = "onnxruntime-cpu"

    def __init__(self, path: Path):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.log_severity_level = 3
        self.s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        ins = {i.name: i for i in self.s.get_inputs()}
        self.past = [n for n in ins if n.startswith("past_key_values.")]
        shape = ins[self.past[0]].shape
        self.empty = np.zeros((1, shape[1], 0, shape[3]), np.float16 if "float16" in ins[self.past[0]].type
                              else np.float32)
        self.gaps = []       # (top1 - top2) / std of the last logits, per step of the last generation

    def generate(self, prompt: list, n: int):
        ids, total = np.array([prompt], np.int64), len(prompt)
        past = [self.empty] * len(self.past)
        tokens, times, logits_kept = [], [], []
        for _ in range(n):
            t0 = time.perf_counter()
            feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64),
                     "position_ids": np.arange(total - ids.shape[1], total, dtype=np.int64)[None]}
            feeds.update(zip(self.past, past))
            logits, *past = self.s.run(None, feeds)
            tok = int(np.argmax(logits[0, -1]))
            times.append(time.perf_counter() - t0)
            logits_kept.append(logits[0, -1])
            tokens.append(tok)
            ids, total = np.array([[tok]], np.int64), total + 1
        self.gaps = []
        for lg in logits_kept:
            lg = lg.astype(np.float32)
            top2 = np.partition(lg, -2)[-2:]
            self.gaps.append(float((top2[1] - top2[0]) / lg.std()))
        return tokens, times

    def close(self):
        self.s = None


class TorchGreedy:
    """The same weights in PyTorch (transformers' GPT2LMHeadModel), use_cache=True, argmax on the device."""

    def __init__(self, args, half: bool):
        import torch

        from webiree.testing.models import gpt2_lm
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = gpt2_lm(**model_args(args)).to(self.device)
        if half:
            self.model = self.model.half()
        self.name = f"torch-{self.device}" + ("-fp16" if half else "")

    def generate(self, prompt: list, n: int):
        torch = self.torch
        tokens, times = [], []
        with torch.inference_mode():
            ids, past = torch.tensor([prompt], device=self.device), None
            for _ in range(n):
                t0 = time.perf_counter()
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = int(out.logits[0, -1].argmax())          # .item(): waits for the device
                times.append(time.perf_counter() - t0)
                tokens.append(tok)
                ids = torch.tensor([[tok]], device=self.device)
        return tokens, times

    def close(self):
        self.model = None
        if self.device == "cuda":
            self.torch.cuda.empty_cache()


class WebireeGreedy:
    """webiree native: InferenceSession.generate; a step's time is from the previous token's arrival."""
    name = "webiree"

    def __init__(self, site: Path):
        import webiree
        t0 = time.perf_counter()
        self.s = webiree.InferenceSession(site)
        self.create_s = time.perf_counter() - t0

    def generate(self, prompt: list, n: int):
        stamps = []
        t0 = time.perf_counter()
        tokens = self.s.generate(prompt, n, on_token=lambda _t: stamps.append(time.perf_counter()))
        return tokens, list(np.diff([t0] + stamps))

    def close(self):
        self.s.close()


def summary(times: list[list[float]]) -> dict:
    """times: per generation, per step (s). First step (median over generations), later steps."""
    first = [t[0] * 1e3 for t in times]
    later = [x * 1e3 for t in times for x in t[1:]]
    return {"first_ms": statistics.median(first), "per_token_ms": statistics.median(later) if later else float("nan"),
            "tokens_per_s": len(later) / (sum(later) / 1e3) if later else float("nan"),
            "min_ms": min(later) if later else float("nan"), "steps": len(later)}


# ------------------------------------------------------------------------------ native run
def run_variant(variant: str, args, workdir: Path, out: dict) -> bool:
    """Build, run and print one variant; False when webiree's tokens differ from onnxruntime's."""
    import webiree
    ok = True
    row = out.setdefault(variant, {})
    path = model_file(variant, args, workdir)
    row["onnx_bytes"] = path.stat().st_size + sum(p.stat().st_size for p in workdir.glob(path.name + ".data"))
    site = workdir / f"site-{args.layers}-{variant}-opt{args.seq_opt}-{args.limits}"
    t0 = time.perf_counter()
    try:
        webiree.compile(path, site, dims=dims(args), generation=0, limits=args.limits)
        row["build_s"] = time.perf_counter() - t0
        row["weights_bytes"] = (site / "weights.bin").stat().st_size
        built = True
    except webiree.WebireeError as e:     # a LimitsError is a finding; anything else a failure
        row["build_error"] = f"{type(e).__name__}: {e}"
        built = False
        ok = isinstance(e, webiree.LimitsError)
    print(f"\n{variant}: {path.name} ({row['onnx_bytes'] / 1e6:.1f} MB)", flush=True)
    if built:
        print(f"  webiree build (greedy head, generation=0; limits {args.limits}; sequence opt {args.seq_opt}): "
              f"{row['build_s']:.1f} s, weights.bin {row['weights_bytes'] / 1e6:.1f} MB", flush=True)
    else:
        print(f"  webiree does not build it: {row['build_error']}", flush=True)

    prompt = [int(t) for t in np.random.default_rng(args.seed).integers(0, args.vocab, args.prompt)]
    runners = []
    if built:
        runners.append(WebireeGreedy(site))
        row["webiree_session_s"] = runners[-1].create_s
    ort = OrtGreedy(path)
    runners.append(ort)
    if not args.no_torch and (variant == "f32" or (variant == "fp16" and _cuda())):
        runners.append(TorchGreedy(args, half=variant == "fp16"))
    tokens, every = {}, {r.name: [] for r in runners}
    times = {r.name: [] for r in runners}
    for r in runners:                   # warm-up: pipelines, allocations, caches
        r.generate(prompt, min(4, args.tokens))
    for _ in range(args.repeat):        # alternating turns: load drift hits every runtime alike
        for r in runners:
            tok, t = r.generate(prompt, args.tokens)
            times[r.name].append(t)
            every[r.name].append(tok)
            tokens.setdefault(r.name, tok)
    for r in runners:
        r.close()
    ref = tokens[ort.name]
    row["prompt"] = prompt
    row["tokens"] = tokens
    row["min_top2_gap_std"] = min(ort.gaps)
    row["results"] = {name: summary(t) for name, t in times.items()}
    base = row["results"][ort.name]["per_token_ms"]
    print(f"  prompt {args.prompt} ids, {args.tokens} new tokens, greedy; {args.repeat} generations each after a "
          f"4-token warm-up, runtimes alternating; onnxruntime's smallest top-2 logit gap: {row['min_top2_gap_std']:.4f} std")
    print(f"  {'':24}{'first step':>12}{'per token':>12}{'tokens/s':>10}{'÷ ort':>9}   tokens == onnxruntime's")
    for name, res in row["results"].items():
        same = all(t == ref for t in every[name])
        if len({tuple(t) for t in every[name]}) > 1:
            row["tokens"][name + " (all generations)"] = every[name]
            print(f"  {name}: its generations gave different tokens: {every[name]}")
        agree = "(reference)" if name == ort.name else ("yes" if same else
                                                         f"NO: first differs at step {_first_diff(tokens[name], ref)}")
        if name == "webiree" and not same:
            ok = False
        res["agrees"] = same
        print(f"  {name:24}{res['first_ms']:9.1f} ms{res['per_token_ms']:9.1f} ms{res['tokens_per_s']:10.2f}"
              f"{res['per_token_ms'] / base:8.2f}x   {agree}", flush=True)
    if "webiree" in row["results"]:
        w = row["results"]["webiree"]["per_token_ms"]
        ratios = ", ".join(f"{row['results'][n]['per_token_ms'] / w:.2f}x vs {n}" for n in row["results"] if n != "webiree")
        print(f"  webiree per-token speed: {ratios} (other's ms per token / webiree's; > 1: webiree faster)")
    return ok


# ------------------------------------------------------------------------------ browser
ORT_DIST = ROOT / "benchmarks" / "node_modules" / "onnxruntime-web" / "dist"
ORT_FILES = ("ort.webgpu.min.mjs", "ort-wasm-simd-threaded.asyncify.mjs", "ort-wasm-simd-threaded.asyncify.wasm")
CHROMIUM = "/usr/bin/chromium"
ORT_WASM_THREADS = 1  # the page is not cross-origin isolated: no SharedArrayBuffer, no wasm threads

ADAPTER_JS = """async () => { const a = await navigator.gpu.requestAdapter();
  return {name: `${a.info.vendor} ${a.info.architecture}`, maxStorageBufferBindingSize: a.limits.maxStorageBufferBindingSize,
          maxBufferSize: a.limits.maxBufferSize, shaderF16: a.features.has('shader-f16')}; }"""

BROWSER_JS = """async ({withWebiree, prompt, n, repeat, ortThreads, past, heads, headDim, ortModels}) => {
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
  const out = {webiree: {gens: []}, ort: {gens: []}};
  // webiree: session.generate, the KV cache on the GPU, the token picked there
  let t0 = performance.now();
  let ws = null;
  if (withWebiree) {
    const w = await import('./webiree/webiree.js');
    ws = await w.InferenceSession.create('./webiree/', {timeoutMs: 1800000});
    out.webiree.createMs = performance.now() - t0;
  }
  const wgen = async (k) => {
    const stamps = []; const t = performance.now();
    const tokens = await ws.generate(prompt, {maxNewTokens: k, onToken: () => { stamps.push(performance.now()); }});
    return {tokens, steps: stamps.map((s, i) => s - (i ? stamps[i - 1] : t))};
  };
  // onnxruntime-web: WebGPU EP, present.* kept on the GPU (IO binding: 'gpu-buffer' outputs fed back
  // as the next past), logits read back and argmax'd here. The models are tried in order: the
  // first that creates and runs is timed (the others' errors are reported).
  const ort = await import('./ort/ort.webgpu.min.mjs');
  ort.env.wasm.wasmPaths = new URL('./ort/', location.href).href;
  ort.env.wasm.numThreads = ortThreads;
  ort.env.logLevel = 'error';
  const presents = past.map((p) => p.replace('past_key_values', 'present'));
  const i64 = (xs) => BigInt64Array.from(xs.map((x) => BigInt(x)));
  let os = null;
  const ogen = async (k) => {
    const tokens = [], steps = [];
    let ids = prompt, total = prompt.length, held = [];
    let pastFeeds = Object.fromEntries(past.map((p) => [p, new ort.Tensor('float32', new Float32Array(0), [1, heads, 0, headDim])]));
    try {
      for (let i = 0; i < k; i++) {
        const t = performance.now();
        const feeds = {input_ids: new ort.Tensor('int64', i64(ids), [1, ids.length]),
          attention_mask: new ort.Tensor('int64', i64(Array(total).fill(1)), [1, total]),
          position_ids: new ort.Tensor('int64', i64(ids.map((_, j) => total - ids.length + j)), [1, ids.length]),
          ...pastFeeds};
        const r = await os.run(feeds);
        const lg = r.logits.data, v = r.logits.dims[2], off = lg.length - v;
        let best = 0;
        for (let j = 1; j < v; j++) if (lg[off + j] > lg[off + best]) best = j;
        for (const h of held) h.dispose();
        held = presents.map((p) => r[p]);
        pastFeeds = Object.fromEntries(past.map((p, j) => [p, held[j]]));
        steps.push(performance.now() - t);
        tokens.push(best);
        ids = [best]; total += 1;
      }
    } finally {
      for (const h of held) h.dispose();
    }
    return {tokens, steps};
  };
  out.ort.errors = {};
  for (const url of ortModels) {
    t0 = performance.now();
    try {
      os = await ort.InferenceSession.create(url, {executionProviders: ['webgpu'],
        preferredOutputLocation: Object.fromEntries([['logits', 'cpu'], ...presents.map((p) => [p, 'gpu-buffer'])])});
      out.ort.createMs = performance.now() - t0;
      await ogen(1);
      out.ort.model = url;
      break;
    } catch (e) {
      out.ort.errors[url] = String(e.message || e).slice(0, 400);
      if (os) { try { await os.release(); } catch (_) {} }
      os = null;
    }
  }
  const runners = (ws ? [[out.webiree, wgen]] : []).concat(os ? [[out.ort, ogen]] : []);
  // the first generation (every length new to the session: what per-shape caches cost) is reported
  // apart; then `repeat` generations each, alternating
  for (const [x, g] of runners) x.cold = await g(n);
  for (let r = 0; r < repeat; r++) for (const [x, g] of runners) x.gens.push(await g(n));
  for (const [x] of runners) {
    x.firstMs = median(x.gens.map((g) => g.steps[0]));
    const later = x.gens.flatMap((g) => g.steps.slice(1));
    x.perTokenMs = median(later);
    x.tokensPerS = later.length / (later.reduce((s, y) => s + y, 0) / 1e3);
    x.coldFirstMs = x.cold.steps[0];
    x.coldPerTokenMs = median(x.cold.steps.slice(1));
    x.tokens = x.gens[0].tokens;
    x.tokensSame = x.gens.every((g) => g.tokens.join() === x.tokens.join()) && x.cold.tokens.join() === x.tokens.join();
    delete x.gens; delete x.cold;
  }
  if (ws) await ws.release();
  if (os) await os.release();
  return out;
}"""


def run_browser(variant: str, args, workdir: Path, out: dict) -> bool:
    """webiree.js generate vs onnxruntime-web (WebGPU EP, IO binding) on the same .onnx in one page."""
    import shutil

    row = out.setdefault(variant, {}).setdefault("browser", {})
    missing = [f for f in ORT_FILES if not (ORT_DIST / f).is_file()]
    if missing:
        row["error"] = f"onnxruntime-web is not in {ORT_DIST.parent.parent} (missing {missing})"
        print(f"\n{variant} in the browser: not run: {row['error']}; install it with\n  cd {ROOT / 'benchmarks'} && "
              f"npm install --no-save --no-package-lock --prefix . onnxruntime-web@1.30.0")
        return True
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    import webiree
    from webiree.bundler.server import serve_in_thread
    path = model_file(variant, args, workdir)
    root = workdir / f"browser-{args.layers}-{variant}-opt{args.seq_opt}"
    print(f"\n{variant} in headless Chromium: {path.name}", flush=True)
    (root / "ort").mkdir(parents=True, exist_ok=True)
    for f in ORT_FILES:
        shutil.copyfile(ORT_DIST / f, root / "ort" / f)
    models = {"model.onnx": path}
    if variant != "f32":    # if onnxruntime-web cannot run this file, it is timed on the f32 one (same weights)
        models["model-f32.onnx"] = model_file("f32", args, workdir)
    for name, src in models.items():
        if not (root / name).exists():
            try:
                os.link(src, root / name)
            except OSError:
                shutil.copyfile(src, root / name)
    (root / "index.html").write_text("<!doctype html><title>bench</title><link rel=icon href='data:,'>")
    m = onnx.load(str(path), load_external_data=False)
    past = [i.name for i in m.graph.input if i.name.startswith("past_key_values.")]
    prompt = [int(t) for t in np.random.default_rng(args.seed).integers(0, args.vocab, args.prompt)]
    n = args.browser_tokens or args.tokens
    timeout = args.browser_timeout
    wrapped = f"""async (arg) => {{
      const fn = {BROWSER_JS};
      let timer;
      const limit = new Promise((_, reject) => {{ timer = setTimeout(
        () => reject(new Error('the benchmark timed out after {timeout} s')), {int(timeout * 1000)}); }});
      try {{ return await Promise.race([fn(arg), limit]); }} finally {{ clearTimeout(timer); }}
    }}"""
    stack = contextlib.ExitStack()
    base = stack.enter_context(serve_in_thread(root))
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--enable-unsafe-webgpu", "--no-sandbox"])
            page = browser.new_page()
            page.goto(base)
            adapter = page.evaluate(ADAPTER_JS)
            # the page's build: CPU-adapter kernels; with --browser-limits adapter the page adapter's
            # binding and buffer limits (as `--limits adapter` natively), else WebGPU's defaults
            limits = {"device_class": "cpu"}
            if args.browser_limits == "adapter":
                limits.update(max_storage_buffer_binding_size=adapter["maxStorageBufferBindingSize"],
                              max_buffer_size=adapter["maxBufferSize"])
            row["webiree_limits"] = limits
            site = root / ("webiree-" + "-".join(str(v) for v in limits.values()))
            built = True
            if not (site / "weights.bin").exists():
                try:
                    webiree.compile(path, site, dims=dims(args), generation=0, limits=limits)
                except webiree.WebireeError as e:
                    row["build_error"] = f"{type(e).__name__}: {e}"
                    print(f"  webiree does not build it for this page (limits {limits}): {row['build_error']}")
                    built = False
            if (root / "webiree").is_symlink():
                (root / "webiree").unlink()
            elif (root / "webiree").exists():
                shutil.rmtree(root / "webiree")
            if built:
                (root / "webiree").symlink_to(site.name)
            arg = {"withWebiree": built, "prompt": prompt, "n": n, "repeat": args.browser_repeat,
                   "ortThreads": ORT_WASM_THREADS, "past": past, "heads": args.heads,
                   "headDim": args.width // args.heads, "ortModels": [f"./{name}" for name in models]}
            try:
                res = page.evaluate(wrapped, arg)
            except PlaywrightError as e:
                row["error"] = f"failed in the page: {str(e).splitlines()[0][:400]}"
                print(f"  {row['error']}")
                return True
            finally:
                version = browser.version
                browser.close()
    finally:
        stack.close()
    w, o = res["webiree"], res["ort"]
    ref = out[variant].get("tokens", {}).get("onnxruntime-cpu")
    keys = ("createMs", "firstMs", "perTokenMs", "tokensPerS", "coldFirstMs", "coldPerTokenMs", "tokens", "tokensSame")
    row.update({"chromium": version, "adapter": adapter, "webiree": {k: w[k] for k in keys if k in w},
                "ort_web": {k: o[k] for k in keys + ("model",) if k in o}, "ort_web_errors": o["errors"]})
    ort_version = json.loads((ORT_DIST.parent / "package.json").read_text()).get("version", "?")
    print(f"  Chromium {version}, WebGPU adapter {adapter['name']} (maxStorageBufferBindingSize "
          f"{adapter['maxStorageBufferBindingSize']}, maxBufferSize {adapter['maxBufferSize']}, shader-f16 "
          f"{adapter['shaderF16']}); webiree.js: built with {args.browser_limits} limits, CPU-adapter kernels; "
          f"onnxruntime-web {ort_version}: WebGPU EP, present.* as 'gpu-buffer' outputs, logits read back, wasm part "
          f"on {ORT_WASM_THREADS} thread; prompt {args.prompt} ids, {n} new tokens; one generation each (reported "
          f"apart), then {args.browser_repeat} each, alternating")
    for url, err in o["errors"].items():
        print(f"  onnxruntime-web cannot run {url}: {err}")
    print(f"  {'':32}{'session':>9}{'first step':>12}{'per token':>12}{'tokens/s':>10}   first generation: "
          f"first step, per token")
    rows = ([("webiree.js", w)] if "tokens" in w else []) + \
        ([(f"onnxruntime-web ({o['model'][2:]})", o)] if "model" in o else [])
    for name, x in rows:
        print(f"  {name:32}{x['createMs'] / 1e3:7.1f} s{x['firstMs']:9.1f} ms{x['perTokenMs']:9.1f} ms"
              f"{x['tokensPerS']:10.2f}   {x['coldFirstMs']:9.1f} ms, {x['coldPerTokenMs']:.1f} ms"
              + ("" if x["tokensSame"] else "   (generations gave different tokens)"))
    if "model" in o and "tokens" in w:
        row["ratio"] = w["perTokenMs"] / o["perTokenMs"]
        row["agree"] = w["tokens"] == o["tokens"]
        what = "the same file" if o["model"] == "./model.onnx" else "the f32 file (same weights, not the same file)"
        print(f"  webiree.js per-token latency / onnxruntime-web's on {what}: {row['ratio']:.3f}x (issue #18's "
              f"bar: <= 0.5x); tokens {'agree' if row['agree'] else 'differ'} between the two")
    same = ref is None or "tokens" not in w or (w["tokens"] == ref[:n] and w["tokensSame"])
    if ref is not None and "tokens" in w:
        print(f"  webiree.js tokens {'==' if same else '!='} onnxruntime CPU's on the same file", flush=True)
    return same


def _first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--std", type=float, default=0.1, help="weight std (gpt2_lm; LayerNorms and biases perturbed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt", type=int, default=8, help="prompt length (seeded random ids)")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per generation")
    p.add_argument("--repeat", type=int, default=3, help="measured generations per runtime")
    p.add_argument("--max-total", type=int, default=128, help="the build's largest prompt + new tokens")
    p.add_argument("--seq-opt", type=int, default=1,
                   help="the sequence size webiree's kernels are planned for (1: the decode step; the "
                        "default of a range without one is a quarter of its largest)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--limits", default="adapter")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--browser", action="store_true", help="also webiree.js vs onnxruntime-web in headless Chromium")
    p.add_argument("--browser-tokens", type=int, default=None, help="new tokens in the browser (default --tokens)")
    p.add_argument("--browser-repeat", type=int, default=1, help="measured generations per runtime in the browser")
    p.add_argument("--browser-timeout", type=float, default=1800, help="seconds for one variant's page")
    p.add_argument("--browser-limits", choices=["adapter", "default"], default="adapter",
                   help="the page's webiree build: the page adapter's binding and buffer limits, or WebGPU's defaults")
    p.add_argument("--workdir", help="keep the models and builds here (reused by later runs)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        p.error(f"unknown variants {bad}; choose from {VARIANTS}")
    if args.prompt + args.tokens > args.max_total:
        p.error("--prompt + --tokens must be at most --max-total")
    warnings.simplefilter("ignore")
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp/webiree-xdg")
    os.makedirs(os.environ["XDG_RUNTIME_DIR"], exist_ok=True)

    from webiree.hal_webgpu.wgpu_driver import adapter_info, adapter_limits
    info, lim = adapter_info(), adapter_limits()
    out = {"config": {k: v for k, v in vars(args).items() if k != "json"}, "adapter": info,
           "limits": {k: lim.get(k) for k in ("max_storage_buffer_binding_size", "max_buffer_size")}, "variants": {}}
    import onnxruntime
    print(f"GPT-2 decoder: {args.layers} layers, width {args.width}, {args.heads} heads, vocabulary {args.vocab}, "
          f"{args.positions} positions, weights N(0, {args.std}) seed {args.seed}")
    print(f"adapter {info.get('device', '?')} ({info.get('backend_type', '?')}): maxStorageBufferBindingSize "
          f"{lim.get('max_storage_buffer_binding_size')}, maxBufferSize {lim.get('max_buffer_size')}; "
          f"onnxruntime {onnxruntime.__version__} CPU ({os.cpu_count()} cores)", flush=True)
    ok = True
    with tempfile.TemporaryDirectory(prefix="webiree-gen-") as tmp:
        workdir = Path(args.workdir) if args.workdir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for v in variants:
            ok &= run_variant(v, args, workdir, out["variants"])
        if args.browser:
            for v in variants:
                ok &= run_browser(v, args, workdir, out["variants"])
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if not ok:
        print("FAILED: webiree's greedy tokens differ from onnxruntime's on the same model file, or webiree "
              "refused a file for another reason than the adapter's limits (above)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
