"""Build the demos into one folder that any static file server can serve.

    .venv/bin/python demo/build.py all OUT        # or: digits | bench | python | embedding | generation (several allowed)
    .venv/bin/webiree serve OUT                   # then open http://127.0.0.1:8000/

OUT/index.html           links to the demos
OUT/digits/              "draw a digit": demo/digits/train.py trains and exports the CNN
                         (OUT/digits.onnx, OUT/digits.json), webiree compiles it, and
                         demo/digits/index.html becomes the page (webiree's generic page
                         stays as generic.html)
OUT/digits/python.html   the same model from Python in the browser (Pyodide): the site's
                         python.html with its editable cell set to demo/python_snippet.py
                         ("python"; Pyodide itself is copied to OUT/pyodide/, 13 MB)
OUT/embedding/           the text-embedding page (webiree's page for the task): a BERT encoder with
                         random weights and a WordPiece tokenizer trained here on a little text
                         (webiree.testing.text_models; OUT/embedding.onnx, OUT/embedding.tokenizer.json)
OUT/generation/          the text-generation page: a GPT-2 decoder with random weights, a KV cache
                         and the generation head, and a byte-level BPE tokenizer trained here
                         (OUT/generation.onnx, OUT/generation.tokenizer.json)
OUT/bench/               the benchmark page (demo/bench/index.html) and one build folder per
                         model: MobileNetV2 and MiniLM, the seed models of
                         tests/seed/export_seed_models.py (found in $WEBIREE_SEED_DIR,
                         tests/.data/seed; exported there when missing),
                         and the digits CNN when it was built

Everything is local: no CDN, relative URLs only.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

DEMO = Path(__file__).resolve().parent
ROOT = DEMO.parent
BENCH_MODELS = {"mobilenet_v2": "MobileNetV2 (1×3×224×224)", "minilm": "MiniLM (BERT, 6 layers, seq 128)"}
DIGITS_LABEL = "digits CNN (1×1×8×8, demo/digits)"


def _log(msg: str) -> None:
    print(msg, flush=True)


def seed_dir(names) -> Path:
    """A folder holding NAME.onnx for every name (exported with the seed script when none has)."""
    env = os.environ.get("WEBIREE_SEED_DIR")
    candidates = [Path(env)] if env else []
    candidates += [ROOT / "tests" / ".data" / "seed"]
    for d in candidates:
        if all((d / f"{n}.onnx").is_file() for n in names):
            return d
    out = candidates[0]
    for n in names:
        _log(f"exporting the seed model {n} into {out} (tests/seed/export_seed_models.py)")
        subprocess.run([sys.executable, str(ROOT / "tests" / "seed" / "export_seed_models.py"), "--out", str(out),
                        "--only", n], check=True)
    return out


def build_digits(out: Path, epochs: int | None = None) -> dict:
    import webiree

    sys.path.insert(0, str(DEMO / "digits"))
    import train

    onnx_path = out / "digits.onnx"
    info = train.main(["--out", str(onnx_path)] + (["--epochs", str(epochs)] if epochs else []))
    site = out / "digits"
    if site.exists():
        shutil.rmtree(site)
    webiree.compile(onnx_path, site)
    shutil.move(site / "index.html", site / "generic.html")
    shutil.copyfile(DEMO / "digits" / "index.html", site / "index.html")
    return info


def build_python(out: Path) -> str:
    """Set digits/python.html's cell to the DigitReader example; copy Pyodide to OUT/pyodide/."""
    from webiree.bundler import pyodide as P

    page = out / "digits" / "python.html"
    info = json.loads((out / "digits.json").read_text())
    samples = {label: [v for row in info["samples"][label][0] for v in row] for label in ("0", "7")}
    code = (DEMO / "python_snippet.py").read_text().replace("{SAMPLES}", json.dumps(samples))
    text = page.read_text()
    new, n = re.subn(r'(<textarea id="code"[^>]*>\n?)(.*?)(</textarea>)',
                     lambda m: m.group(1) + html.escape(code, quote=False) + m.group(3), text, flags=re.S)
    if n != 1:
        raise SystemExit(f"{page}: no <textarea id=\"code\"> to put the example in (python.html changed?)")
    page.write_text(new)
    try:
        P.copy_pyodide(out / P.PYODIDE_DIR)
    except Exception as e:  # noqa: BLE001  (a WebireeError: Pyodide not installed)
        _log(f"note: Pyodide not copied ({e}); python.html will say so")
        return "no pyodide"
    return "ok"


def build_embedding(out: Path) -> dict:
    """OUT/embedding/: the text-embedding page over a random-weight BERT and a WordPiece tokenizer
    trained here. Returns text_models.export_embedder's info and the build's manifest task."""
    import webiree
    from webiree.testing import text_models as T

    onnx_path, tok_path = out / "embedding.onnx", out / "embedding.tokenizer.json"
    info = T.export_embedder(onnx_path, tok_path)
    res = webiree.compile(onnx_path, out / "embedding", dims=T.EMBEDDER_DIMS, tokenizer=tok_path,
                          task="text-embedding")
    return {**info, "onnx": onnx_path, "tokenizer": tok_path, "task": res.manifest["task"]}


def build_generation(out: Path) -> dict:
    """OUT/generation/: the text-generation page over a random-weight GPT-2 (KV cache, generation
    head) and a byte-level BPE tokenizer trained here. Returns text_models.export_generator's info and
    the build's manifest task."""
    import webiree
    from webiree.testing import text_models as T
    from webiree.testing.models import GPT2_DIMS

    onnx_path, tok_path = out / "generation.onnx", out / "generation.tokenizer.json"
    info = T.export_generator(onnx_path, tok_path)
    res = webiree.compile(onnx_path, out / "generation", dims=GPT2_DIMS, generation=True, tokenizer=tok_path,
                          task="text-generation")
    return {**info, "onnx": onnx_path, "tokenizer": tok_path, "task": res.manifest["task"]}


def build_bench(out: Path, models=None) -> list[str]:
    """Compile the benchmark models into OUT/bench/NAME/ (default: MobileNetV2, MiniLM, and the
    digits CNN when OUT/digits.onnx exists) and write the page and models.json (every model
    built there so far). Returns the names in models.json."""
    import webiree

    site = out / "bench"
    site.mkdir(parents=True, exist_ok=True)
    if models is None:
        models = list(BENCH_MODELS) + (["digits"] if (out / "digits.onnx").is_file() else [])
    seeds = [m for m in models if m in BENCH_MODELS]
    seeds_at = seed_dir(seeds) if seeds else None
    for name in models:
        t0 = time.perf_counter()
        src = out / "digits.onnx" if name == "digits" else seeds_at / f"{name}.onnx"
        webiree.compile(src, site / name)
        _log(f"bench: compiled {name} in {time.perf_counter() - t0:.1f} s")
    labels = dict(BENCH_MODELS, digits=DIGITS_LABEL)
    present = [n for n in labels if (site / n / "manifest.json").is_file()]
    (site / "models.json").write_text(json.dumps(
        {"models": [{"name": n, "label": labels[n]} for n in present]}, indent=1) + "\n")
    shutil.copyfile(DEMO / "bench" / "index.html", site / "index.html")
    return present


INDEX = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>webiree demos</title>
<link rel="icon" href="data:,"><style>body{font:15px/1.5 system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem}</style>
</head><body><h1>webiree demos</h1><ul>
<li><a href="digits/">Draw a digit</a>: a CNN trained on scikit-learn's digits, live in WebGPU</li>
<li><a href="digits/python.html">The same model from Python</a> (Pyodide)</li>
<li><a href="embedding/">Sentence embeddings</a>: two sentences, tokenized in the page, their cosine similarity
  (a BERT encoder with random weights)</li>
<li><a href="generation/">Text generation</a>: a prompt, tokens streamed into the page as the GPU picks them
  (a GPT-2 decoder with random weights: the text is noise)</li>
<li><a href="bench/">Benchmark</a>: MobileNetV2 and MiniLM, latency distribution and per-dispatch GPU times</li>
</ul></body></html>
"""


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Build webiree's demos into one folder.")
    ap.add_argument("what", nargs="+", choices=["all", "digits", "python", "bench", "embedding", "generation"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--epochs", type=int, default=None, help="digits: training epochs (default: train.py's)")
    args = ap.parse_args(argv)
    what = {"digits", "python", "bench", "embedding", "generation"} if "all" in args.what else set(args.what)
    args.out.mkdir(parents=True, exist_ok=True)
    if "python" in what and not (args.out / "digits").is_dir():
        what.add("digits")
    if "digits" in what:
        build_digits(args.out, args.epochs)
    if "python" in what:
        build_python(args.out)
    if "embedding" in what:
        build_embedding(args.out)
    if "generation" in what:
        build_generation(args.out)
    if "bench" in what:
        build_bench(args.out)
    (args.out / "index.html").write_text(INDEX)
    _log(f"built {', '.join(sorted(what))} into {args.out}; serve it with: webiree serve {args.out}")


if __name__ == "__main__":
    main()
