"""web/ as an npm package: web/package.json, `npm pack`, and a real bundler (esbuild) consuming it.

The bundling test builds a tiny app in tmp_path that imports `webiree` and `webiree/tokenizer` by
their package names, installs the packed tarball into the app's node_modules (offline: a local
tarball needs no registry), bundles it with the pinned esbuild from the repo's node_modules
(scripts/setup.sh installs it), and runs the bundle in headless Chromium against a built site,
comparing the outputs with onnxruntime.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import webiree
from webiree.testing.models import sample_inputs, small_cnn
from webiree.version import __version__

from .browser_util import serving
from .conftest import assert_close, ort_run
from .test_browser import b64_feeds, decode_outputs, evaluate

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT / "web"
# esbuild (npm) for the bundling test; scripts/setup.sh reads this line with sed
ESBUILD_VERSION = "0.28.2"
ESBUILD = ROOT / "node_modules" / ".bin" / "esbuild"
RUNTIME_FILES = {"webiree.js", "webiree.d.ts", "worker.js", "tokenizer.js", "tokenizer.d.ts"}
NPM_FLAGS = ["--offline", "--no-audit", "--no-fund", "--loglevel=error"]


def npm(*args, cwd) -> str:
    if shutil.which("npm") is None:
        pytest.fail("npm is missing: run scripts/setup.sh")
    proc = subprocess.run(["npm", *args, *NPM_FLAGS], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"npm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def pack(dest: Path) -> Path:
    """`npm pack` of web/ into dest (offline); returns the tarball."""
    out = json.loads(npm("pack", "--json", "--pack-destination", str(dest), cwd=WEB))
    return dest / out[0]["filename"]


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> Path:
    return pack(tmp_path_factory.mktemp("pack"))


# ---------------------------------------------------------------- package.json
def test_package_json():
    pkg = json.loads((WEB / "package.json").read_text(encoding="utf-8"))
    assert pkg["name"] == "webiree"
    assert pkg["version"] == __version__ == webiree.__version__, "web/package.json and webiree/version.py differ"
    assert pkg["type"] == "module"
    assert pkg["types"] == "./webiree.d.ts"
    assert pkg["exports"]["."] == {"types": "./webiree.d.ts", "default": "./webiree.js"}
    assert pkg["exports"]["./tokenizer"] == {"types": "./tokenizer.d.ts", "default": "./tokenizer.js"}
    assert pkg["sideEffects"] is False
    assert set(pkg["files"]) == RUNTIME_FILES
    for key in ("dependencies", "peerDependencies", "optionalDependencies", "bundleDependencies"):
        assert key not in pkg, key
    # every path the manifest names exists, and `types` is listed first in each condition map (TypeScript)
    for cond in pkg["exports"].values():
        if isinstance(cond, dict):
            assert next(iter(cond)) == "types"
            assert all((WEB / p).is_file() for p in cond.values())


def test_npm_pack_dry_run_lists_the_runtime_files():
    out = json.loads(npm("pack", "--dry-run", "--json", cwd=WEB))
    assert out[0]["name"] == "webiree" and out[0]["version"] == __version__
    assert {f["path"] for f in out[0]["files"]} == RUNTIME_FILES | {"package.json"}


def test_npm_pack_tarball_holds_exactly_the_runtime_files(tarball):
    assert tarball.name == f"webiree-{__version__}.tgz"
    with tarfile.open(tarball) as tf:
        names = {m.name for m in tf.getmembers() if m.isfile()}
        assert names == {f"package/{n}" for n in RUNTIME_FILES | {"package.json"}}
        for n in RUNTIME_FILES:  # the packed files are web/'s, byte for byte
            assert tf.extractfile(f"package/{n}").read() == (WEB / n).read_bytes(), n


# ---------------------------------------------------------------- bundled with esbuild, run in Chromium
TOKENIZER_JSON = {"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "hello": 1, "world": 2, "##s": 3},
                            "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                            "max_input_chars_per_word": 100},
                  "pre_tokenizer": {"type": "WhitespaceSplit"}}

MAIN_JS = """import {InferenceSession, Tensor} from 'webiree';
import {Tokenizer} from 'webiree/tokenizer';

const bytes = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
const b64 = (a) => { const u = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let s = '';
  for (let i = 0; i < u.length; i += 4096) s += String.fromCharCode(...u.subarray(i, i + 4096)); return btoa(s); };

// the page calls this with the site URL and base64 feeds; the result (or the error) lands on window
window.runApp = async (url, feeds, tokenizerJSON) => {
  let session;
  try {
    const ids = Tokenizer.fromJSON(tokenizerJSON).encode('hello worlds zz').ids;
    session = await InferenceSession.create(url);
    const tensors = {};
    for (const [name, {dims, data}] of Object.entries(feeds)) {
      tensors[name] = new Tensor('float32', new Float32Array(bytes(data).buffer), dims);
    }
    const r = await session.run(tensors);
    const out = {};
    for (const [k, t] of Object.entries(r)) out[k] = {type: t.type, dims: t.dims, data: b64(t.data)};
    window.appResult = {out, ids, inputNames: session.inputNames};
  } catch (e) {
    window.appResult = {error: String(e.message ?? e)};
  } finally {
    await session?.release();
  }
  return window.appResult;
};
"""

INDEX_HTML = """<!doctype html><title>webiree bundled</title><link rel=icon href='data:,'>
<script type=module src=bundle.js></script>"""


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_bundled_with_esbuild_runs_in_chromium(tmp_path, tarball, browser):
    if not ESBUILD.exists():
        pytest.fail(f"{ESBUILD} is missing: run scripts/setup.sh (esbuild@{ESBUILD_VERSION})")
    version = subprocess.run([str(ESBUILD), "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    assert version == ESBUILD_VERSION, f"esbuild {version} installed, {ESBUILD_VERSION} pinned: run scripts/setup.sh"

    # the app: its own package.json, webiree installed from the tarball (offline)
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    (app / "main.js").write_text(MAIN_JS, encoding="utf-8")
    npm("install", "--no-save", "--no-package-lock", str(tarball), cwd=app)
    installed = app / "node_modules" / "webiree"
    assert {p.name for p in installed.iterdir()} == RUNTIME_FILES | {"package.json"}

    # the site: a built model and the bundled page side by side under one root
    root = tmp_path / "root"
    model = small_cnn()
    webiree.compile(model, root / "small_cnn")
    page_dir = root / "app"
    page_dir.mkdir()
    (page_dir / "index.html").write_text(INDEX_HTML)
    proc = subprocess.run([str(ESBUILD), "main.js", "--bundle", "--format=esm", f"--outfile={page_dir / 'bundle.js'}",
                           "--log-level=warning"], cwd=app, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    bundle = (page_dir / "bundle.js").read_text(encoding="utf-8")
    # everything is inlined: no import of the package (bare or subpath) and no relative import is left
    assert not re.search(r"""(\bimport\b|\bfrom\b|\bimport\s*\()\s*['"](webiree|\./)""", bundle), "an import is left"
    assert not re.search(r"""^\s*import\b""", bundle, re.M), "a static import is left"
    # both modules come from the installed package (esbuild marks each inlined file with its path)
    assert "// node_modules/webiree/webiree.js" in bundle and "// node_modules/webiree/tokenizer.js" in bundle

    feeds = sample_inputs(model)
    with serving(root) as url:
        ctx = browser.new_context()
        try:
            page = ctx.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url + "app/index.html")
            page.wait_for_function("typeof window.runApp === 'function'", timeout=30000)
            r = evaluate(page, "async (a) => window.runApp(a.url, a.feeds, a.tok)",
                         {"url": url + "small_cnn/", "feeds": b64_feeds(feeds), "tok": TOKENIZER_JSON})
            assert page.evaluate("window.appResult") is not None
        finally:
            ctx.close()
    assert "error" not in r, r
    assert not errors, errors
    assert r["ids"] == [1, 2, 3, 0]
    assert r["inputNames"] == [i.name for i in model.graph.input]
    got = decode_outputs(r)
    ref = dict(zip([o.name for o in model.graph.output], ort_run(model, feeds)))
    assert set(got) == set(ref)
    for k in ref:
        assert_close(got[k], ref[k], name=k)
