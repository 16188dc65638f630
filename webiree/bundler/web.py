"""The browser half of a build folder: the JavaScript runtime and a demo page.

`write_site(out_dir, result)` adds, beside manifest.json / model.wrm / weights.bin:

    webiree.js     the runtime (copied from web/, the one canonical copy)
    webiree.d.ts   its TypeScript declarations
    worker.js      the Web Worker of InferenceSession.create(url, {worker: true})
    tokenizer.js   Hugging Face tokenizer.json files in the page (text -> token ids)
    tokenizer.d.ts its TypeScript declarations
    index.html     the task's page (the manifest's "task", bundler/tasks.py):
                   text-embedding and text-generation: the pages of bundler/pages.py
                   (text typed, tokenized in the page); the generic page then
                   stays as generic.html. Any other task: the generic page, which
                   loads the model with a progress bar, runs it on the sample
                   input, lets the user pick an image (one 1x3xHxW float input)
                   or type token ids (int64 inputs), shows the outputs,
                   latencies and a per-dispatch profile
    sample.json    the sample input: {"inputs": [{name, type, dims, data}]},
                   data = base64 of the little-endian values in the ONNX type.
                   Omitted for inputs over SAMPLE_MAX_ELEMENTS elements; the
                   page then makes a seeded one itself.
    python.html, webiree_runtime-*.whl (and pyodide/ when asked for)
                   the same model from Python in the browser; see bundler/pyodide.py

Every URL in the page is relative, so the folder works from any static file
server (`webiree serve DIR`, `python -m http.server`, a CDN).

Where the runtime comes from: the canonical files live in the repository's
`web/` folder and are found relative to this package (the repo root is
`Path(webiree.__file__).parents[1]`); we install editable, so no package data
is needed. A wheel build must copy the files of assets.RUNTIME_FILES from web/ into
`webiree/bundler/web_assets/` (generated, never edited); that folder is
looked at second.
"""

from __future__ import annotations

import base64
import json
import random
import struct
from pathlib import Path

from ..dtypes import RUNTIME_TYPES
from ..errors import WebireeError
from .assets import RUNTIME_FILES, runtime_dir

INDEX_FILE = "index.html"
GENERIC_FILE = "generic.html"   # the generic page, kept beside a text task's page
SAMPLE_FILE = "sample.json"
SAMPLE_MAX_ELEMENTS = 1 << 18
SAMPLE_SEED = 0



def _seeded_values(onnx_type: int, n: int, rng: random.Random) -> list:
    if onnx_type in (1, 11):
        return [rng.gauss(0.0, 1.0) for _ in range(n)]
    if onnx_type == 9:
        return [rng.random() < 0.5 for _ in range(n)]
    return [rng.randrange(10) for _ in range(n)]


def sample_entries(module, sample_feeds=None, seed: int = SAMPLE_SEED) -> list[dict] | None:
    """The sample.json entries for the module's inputs, or None when too large.

    sample_feeds: {name: array-like} (numpy arrays, as for onnxruntime); inputs
    it lacks are made with a seeded generator (floats ~ N(0,1), ints in [0,10),
    bools random), reproducibly.
    """
    sample_feeds = dict(sample_feeds or {})
    unknown = sorted(set(sample_feeds) - {io.name for io in module.inputs})
    if unknown:
        raise WebireeError(f"sample feeds name unknown input(s) {unknown}",
                           hint=f"the model's inputs are {[io.name for io in module.inputs]}")
    if sum(_count(io.shape) for io in module.inputs) > SAMPLE_MAX_ELEMENTS:
        return None
    rng = random.Random(seed)
    entries = []
    for io in module.inputs:
        d = RUNTIME_TYPES.get(io.onnx_type)
        if d is None:
            return None
        type_name, code = d.name, d.host_code
        n = _count(io.shape)
        if io.name in sample_feeds:
            import numpy as np

            a = np.asarray(sample_feeds[io.name])
            if tuple(a.shape) != tuple(io.shape):
                raise WebireeError(f"sample feed {io.name!r} has shape {tuple(a.shape)}; "
                                   f"the model was compiled for {tuple(io.shape)}")
            data = np.ascontiguousarray(a.astype(d.numpy)).tobytes()
        else:
            data = struct.pack(f"<{n}{code}", *_seeded_values(io.onnx_type, n, rng))
        entries.append({"name": io.name, "type": type_name, "dims": list(io.shape),
                        "data": base64.b64encode(data).decode("ascii")})
    return entries


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def write_site(out_dir, result, sample_feeds=None, pyodide=False, task: dict | None = None) -> list[str]:
    """Write the runtime, the demo page and the sample input into the build folder
    `out_dir` (already holding the files of `result`). Returns the names written.

    sample_feeds: {input name: array} for sample.json (default: seeded values, see sample_entries).
    pyodide: also copy Pyodide itself into pyodide/ (the runtime wheel and
    python.html are always written; they are small).
    task: the manifest's "task" (bundler/tasks.py); None: the generic page.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src = runtime_dir()
    written = []
    for name in RUNTIME_FILES:
        (out / name).write_bytes((src / name).read_bytes())
        written.append(name)
    from .pages import TASK_PAGES
    page = TASK_PAGES.get((task or {}).get("name"))
    (out / INDEX_FILE).write_text(page or INDEX_HTML, encoding="utf-8")
    written.append(INDEX_FILE)
    if page:
        (out / GENERIC_FILE).write_text(INDEX_HTML, encoding="utf-8")
        written.append(GENERIC_FILE)
    else:
        (out / GENERIC_FILE).unlink(missing_ok=True)   # no stale page from an earlier build
    module = result.module
    entries = sample_entries(module, sample_feeds)
    sample_path = out / SAMPLE_FILE
    if entries is None:
        sample_path.unlink(missing_ok=True)  # no stale sample from an earlier build
    else:
        sample_path.write_text(json.dumps({"inputs": entries}, separators=(",", ":")) + "\n", encoding="ascii")
        written.append(SAMPLE_FILE)
    from .pyodide import write_pyodide_files  # Python in the browser: the runtime wheel and python.html
    written += write_pyodide_files(out, copy_runtime=pyodide)
    return written


INDEX_HTML = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>webiree demo</title>
<link rel="icon" href="data:,">
<style>
  body { font: 15px/1.45 system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
  h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.5rem; }
  progress { width: 100%; height: 1rem; }
  table { border-collapse: collapse; margin: .5rem 0; } td, th { padding: .15rem .7rem; border-bottom: 1px solid #ddd; text-align: left; }
  td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
  .bar { display: inline-block; height: .7rem; background: #4a7bd0; }
  .error { color: #b00020; font-weight: 600; white-space: pre-wrap; }
  #controls > * { margin: .3rem 1rem .3rem 0; } input[type=text] { width: 100%; font-family: monospace; }
  canvas { image-rendering: pixelated; border: 1px solid #ccc; margin-right: 1rem; vertical-align: top; }
  .muted { color: #666; }
</style>
</head>
<body>
<h1>webiree: <span id="model">model</span></h1>
<p id="status">Loading…</p>
<progress id="progress" max="1" value="0"></progress>
<section id="controls" hidden>
  <div id="image-row" hidden><label>Pick an image: <input type="file" id="image" accept="image/*"></label>
    <canvas id="preview" width="1" height="1" hidden></canvas></div>
  <div id="token-rows"></div>
  <label>Timed runs: <input type="number" id="runs" value="10" min="1" max="1000"></label>
  <button id="run" type="button">Run</button>
</section>
<section id="outputs"></section>
<section id="timing"></section>
<section id="profile"></section>
<p class="muted">Runs entirely in this browser with WebGPU; the model was compiled ahead of time by webiree.
  Files: <a href="manifest.json">manifest.json</a>, <a href="webiree.d.ts">webiree.d.ts</a>.</p>
<script type="module">
import * as webiree from './webiree.js';

const $ = (id) => document.getElementById(id);
const demo = globalThis.webireeDemo = {session: null, feeds: null, results: null, error: null};
const MEAN = [0.485, 0.456, 0.406], STD = [0.229, 0.224, 0.225];  // ImageNet normalization
const ARRAYS = {float32: Float32Array, int64: BigInt64Array, int32: Int32Array, bool: Uint8Array, uint8: Uint8Array,
  int8: Int8Array, uint16: Uint16Array, int16: Int16Array, uint32: Uint32Array, float64: Float64Array};
const count = (dims) => dims.reduce((a, b) => a * b, 1);
const el = (tag, attrs = {}, ...kids) => { const e = Object.assign(document.createElement(tag), attrs); e.append(...kids); return e; };
const fmt = (v) => (Number.isInteger(v) && Math.abs(v) < 1e9 ? String(v) : Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : v.toFixed(4));
const setState = (s) => { document.body.dataset.state = s; };

function table(head, rows) {
  const t = el('table');
  t.append(el('tr', {}, ...head.map((h) => el('th', {className: /ms|value|%/.test(h) ? 'num' : ''}, h))));
  for (const r of rows) t.append(el('tr', {}, ...r.map((c) => (c instanceof Node ? el('td', {}, c) : el('td', {className: typeof c === 'number' ? 'num' : ''}, String(typeof c === 'number' ? fmt(c) : c))))));
  return t;
}

function seeded(seed) {  // mulberry32
  return () => { seed |= 0; seed = (seed + 0x6D2B79F5) | 0; let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t; return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
}

function generated(meta) {  // no sample.json: a seeded input from the shapes
  const rand = seeded(0);
  const feeds = {};
  for (const {name, type, shape} of meta) {
    const n = count(shape), Cls = ARRAYS[type];
    let data;
    if (type === 'float32' || type === 'float64') data = Cls.from({length: n}, () => Math.sqrt(-2 * Math.log(1 - rand())) * Math.cos(2 * Math.PI * rand()));
    else if (type === 'bool') data = Cls.from({length: n}, () => (rand() < 0.5 ? 1 : 0));
    else if (type === 'int64') data = BigInt64Array.from({length: n}, () => BigInt(Math.floor(rand() * 10)));
    else data = Cls.from({length: n}, () => Math.floor(rand() * 10));
    feeds[name] = new webiree.Tensor(type, data, shape);
  }
  return feeds;
}

async function loadSample(session) {
  try {
    const r = await fetch('sample.json');
    if (r.ok) {
      const {inputs} = await r.json();
      const feeds = {};
      for (const {name, type, dims, data} of inputs) {
        const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
        feeds[name] = new webiree.Tensor(type, new ARRAYS[type](bytes.buffer), dims);
      }
      if (session.inputNames.every((n) => n in feeds)) return {feeds, source: 'the sample input (sample.json)'};
    }
  } catch (e) { console.warn('sample.json unusable:', e); }
  return {feeds: generated(session.inputMetadata), source: 'a seeded random input'};
}

function imageInput(session) {  // the one 1x3xHxW float input, if the model has exactly that
  const m = session.inputMetadata;
  return m.length === 1 && m[0].type === 'float32' && m[0].shape.length === 4 && m[0].shape[0] === 1 && m[0].shape[1] === 3 ? m[0] : null;
}

async function imageFeed(file, meta) {
  const [, , h, w] = meta.shape;
  const bitmap = await createImageBitmap(file);
  const canvas = $('preview');
  Object.assign(canvas, {width: w, height: h, hidden: false});
  canvas.style.width = `${Math.max(w, 128)}px`;
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  ctx.drawImage(bitmap, 0, 0, w, h);  // resize to the compiled H x W
  const px = ctx.getImageData(0, 0, w, h).data;
  const data = new Float32Array(3 * h * w);
  for (let c = 0; c < 3; c++) for (let i = 0; i < h * w; i++) data[c * h * w + i] = (px[4 * i + c] / 255 - MEAN[c]) / STD[c];
  return new webiree.Tensor('float32', data, meta.shape);
}

function showOutput(name, t) {
  const box = el('div', {}, el('h2', {}, `${name} `, el('span', {className: 'muted'}, `${t.type} [${t.dims.join(', ')}]`)));
  const values = Array.from(t.data, Number);
  const d = t.dims;
  if (d.length === 2 && d[0] === 1 && d[1] > 1 && t.type.startsWith('float')) {
    const top = values.map((v, i) => [v, i]).sort((a, b) => b[0] - a[0]).slice(0, 5);
    const max = Math.max(...top.map(([v]) => Math.abs(v)), 1e-30);
    box.append(el('p', {}, `top-5 of ${d[1]} classes`),
      table(['rank', 'class', 'value', ''], top.map(([v, i], r) => [`${r + 1}`, `#${i}`, v, el('span', {className: 'bar', style: `width:${(120 * Math.abs(v) / max).toFixed(0)}px`})])));
  } else if (d.length === 4 && d[0] === 1 && d[1] > 1 && d[2] * d[3] > 1) {
    const [, c, h, w] = d;
    const canvas = el('canvas', {width: w, height: h});
    canvas.style.width = `${Math.max(w, 256)}px`;
    const img = canvas.getContext('2d').createImageData(w, h);
    const seen = new Set();
    for (let i = 0; i < h * w; i++) {
      let best = 0;
      for (let k = 1; k < c; k++) if (values[k * h * w + i] > values[best * h * w + i]) best = k;
      seen.add(best);
      const hue = (best * 137.508) % 360, rgb = [0, 8, 4].map((n) => { const k = (n + hue / 30) % 12; return 255 * (0.5 - 0.45 * Math.max(-1, Math.min(k - 3, 9 - k, 1))); });
      img.data.set([...rgb, 255], 4 * i);
    }
    canvas.getContext('2d').putImageData(img, 0, 0);
    box.append(el('p', {}, `segmentation mask: argmax over ${c} classes, ${seen.size} present`), canvas);
  } else {
    const n = values.length || 1;
    const mean = values.reduce((a, b) => a + b, 0) / n;
    box.append(table(['min', 'max', 'mean', 'first values'],
      [[Math.min(...values), Math.max(...values), mean, values.slice(0, 8).map(fmt).join(', ') + (values.length > 8 ? ' …' : '')]]));
  }
  return box;
}

async function runAndShow() {
  const {session, feeds} = demo;
  setState('running');
  $('run').disabled = true;
  $('status').textContent = 'Running…';
  const runs = Math.min(Math.max(Math.floor(Number($('runs').value)) || 10, 1), 1000);
  let t0 = performance.now();
  const results = await session.run(feeds);
  const first = performance.now() - t0;
  const times = [];
  for (let i = 0; i < runs; i++) { t0 = performance.now(); await session.run(feeds); times.push(performance.now() - t0); }
  times.sort((a, b) => a - b);
  const median = times.length % 2 ? times[times.length >> 1] : (times[times.length / 2 - 1] + times[times.length / 2]) / 2;
  demo.results = results;
  $('outputs').replaceChildren(...session.outputNames.map((n) => showOutput(n, results[n])));
  $('timing').replaceChildren(el('h2', {}, 'Latency'), table(['', 'ms'], [
    [demo.runCount++ ? 'first run of this batch' : 'first run (includes warm-up)', first], [`median of ${runs} runs`, median]]));
  if (session.hasTimestamps) {
    const {profile} = await session.run(feeds, {profile: true});
    const total = profile.reduce((a, p) => a + p.ms, 0);
    $('profile').replaceChildren(el('h2', {}, 'GPU time per dispatch'), table(['dispatch', 'ms', '%'],
      [...profile.map((p) => [p.name, p.ms, (total ? 100 * p.ms / total : 0).toFixed(1)]), ['total', total, '100.0']]));
  } else {
    $('profile').replaceChildren(el('p', {className: 'muted'}, 'Per-dispatch timing needs the adapter feature timestamp-query.'));
  }
  $('status').textContent = `Ran ${demo.source}.`;
  $('run').disabled = false;
  setState('done');
}

function showError(e) {
  demo.error = e;
  console.error(e);
  $('status').className = 'error';
  $('status').textContent = `Error: ${e.message}`;
  $('run').disabled = false;
  setState('error');
}

async function main() {
  setState('loading');
  const progress = $('progress');
  const session = demo.session = await webiree.InferenceSession.create('./', {onProgress: ({loaded, total, file}) => {
    progress.max = total || 1;
    progress.value = loaded;
    $('status').textContent = `Loading ${file}: ${(loaded / 1e6).toFixed(2)} of ${(total / 1e6).toFixed(2)} MB`;
  }});
  progress.value = progress.max;
  $('model').textContent = document.title = `${session.manifest.model ?? 'model'}`;
  const sample = await loadSample(session);
  Object.assign(demo, sample, {runCount: 0});
  const image = imageInput(session);
  if (image) {
    $('image-row').hidden = false;
    $('image').onchange = async (ev) => {
      if (!ev.target.files.length) return;
      try {
        demo.feeds = {[image.name]: await imageFeed(ev.target.files[0], image)};
        demo.source = `the image ${ev.target.files[0].name}`;
        await runAndShow();
      } catch (e) { showError(e); }
    };
  }
  for (const meta of session.inputMetadata.filter((m) => m.type === 'int64' || m.type === 'int32')) {
    const box = el('input', {type: 'text', id: `ids-${meta.name}`, value: Array.from(demo.feeds[meta.name].data).join(' ')});
    $('token-rows').append(el('label', {}, `${meta.name} (token ids, ${meta.type} [${meta.shape.join(', ')}]; padded with 0):`, box));
  }
  $('run').onclick = () => { try {
    for (const meta of session.inputMetadata.filter((m) => m.type === 'int64' || m.type === 'int32')) {
      const words = $(`ids-${meta.name}`).value.split(/[\s,]+/).filter(Boolean);
      const n = count(meta.shape);
      const cast = meta.type === 'int64' ? BigInt : Number;
      const data = ARRAYS[meta.type].from({length: n}, (_, i) => cast(i < words.length ? words[i] : 0));
      demo.feeds = {...demo.feeds, [meta.name]: new webiree.Tensor(meta.type, data, meta.shape)};
      demo.source = 'the token ids typed above';
    }
    runAndShow().catch(showError);
  } catch (e) { showError(e); } };
  $('controls').hidden = false;
  await runAndShow();
}

main().catch(showError);
</script>
</body>
</html>
"""
