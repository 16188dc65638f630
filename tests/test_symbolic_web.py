"""Dynamic modules (sizes in ranges) on the web runtimes: one BERT build with symbolic `batch`
and `sequence` (transformers, exported as a user exports one) runs through web/webiree.js in
Chromium (and on Dawn in Node) and through Pyodide at several sizes, each compared with
onnxruntime; a feed outside the ranges or with inconsistent sizes is a feed error; and no
pipeline (nor shader) is created after the session, natively either.

The site is built once per module and served by conftest's `server` (its `site_root`); every
page.evaluate carries its own timeout (test_browser.evaluate).
"""

from __future__ import annotations

import base64

import numpy as np
import onnx
import pytest

import webiree
from webiree.hal_webgpu.feeds import bind_dims
from webiree.module import read_module
from webiree.testing.models import bert_feeds, export_bert_dynamic, small_detector

from .browser_util import write_blank_page
from .conftest import assert_close, ort_run
from .dawn_util import run_dawn
from .test_browser import b64_feeds, evaluate
from .test_pyodide import open_python_page, py

pytestmark = pytest.mark.timeout(900)

DIMS = {"batch": (1, 2), "sequence": (1, 128)}
SIZES = [(2, 7), (1, 64)]                   # (batch, sequence) of the runs compared with onnxruntime
MORE_SIZES = [(1, 3), (2, 50), (2, 128)]    # the runs that must create no pipeline
OUTPUT_NAMES = ["last_hidden_state", "pooler_output"]
NUMPY_OF = {"float32": "<f4"}
BOOT_TIMEOUT_S = 180


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """(root, model): root/bert/ is the dynamic build (with its own pyodide/), root/blank.html hosts the page."""
    root = tmp_path_factory.mktemp("dynsites")
    write_blank_page(root)
    path = root / "bert.onnx"
    export_bert_dynamic(path)
    webiree.compile(path, root / "bert", dims=DIMS, pyodide=True)
    webiree.compile(small_detector(), root / "det", dims={"height": (320, 640), "width": (320, 640)})
    return root, onnx.load(str(path))


@pytest.fixture(scope="module")
def site_root(bert):
    return bert[0]


@pytest.fixture(scope="module")
def model(bert):
    return bert[1]


@pytest.fixture(scope="module")
def schedule(bert):
    return read_module((bert[0] / "bert" / "model.wrm").read_bytes())


@pytest.fixture(scope="module")
def pypage(browser, server):
    """The build's python.html, booted once."""
    ctx, pg = open_python_page(browser, server + "bert/python.html")
    assert pg.get_attribute("body", "data-state") == "ready", pg.inner_text("#status")
    yield pg
    ctx.close()


# ---------------------------------------------------------------- helpers
# One session of site `url` through its webiree.js: (optionally) GPU object creations counted from
# before the session, then one run per feeds of `runs` (errors come back as values), outputs named
# in `keep` left on the GPU and read back with getData().
SESSION_JS = """async ({url, runs, keep, count}) => {
  const P = GPUDevice.prototype;
  const counted = ['createComputePipeline', 'createComputePipelineAsync', 'createShaderModule'];
  const orig = Object.fromEntries(counted.map((k) => [k, P[k]]));
  const calls = Object.fromEntries(counted.map((k) => [k, 0]));
  if (count) for (const k of counted) P[k] = function (...a) { calls[k]++; return orig[k].apply(this, a); };
  const bytes = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const b64 = (a) => { const u = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let s = '';
    for (let i = 0; i < u.length; i += 4096) s += String.fromCharCode(...u.subarray(i, i + 4096)); return btoa(s); };
  let session;
  try {
    const w = await import(url + 'webiree.js');
    session = await w.InferenceSession.create(url);
    if (count) await session.ready();   // the start tier's pipelines and cpu-sg4's (made between runs otherwise)
    const created = {...calls};
    const results = [];
    for (const feeds of runs) {
      const tensors = {};
      for (const [name, {type, dims, data}] of Object.entries(feeds)) {
        tensors[name] = new w.Tensor(type, new BigInt64Array(bytes(data).buffer), dims);
      }
      try {
        const r = await session.run(tensors, {keep});
        const out = {};
        for (const [k, t] of Object.entries(r)) {
          const data = await t.getData();
          out[k] = {type: t.type, dims: t.dims, size: t.size, location: t.location, data: b64(data)};
          t.dispose();
        }
        results.push({out, readbackBytes: session.lastReadbackBytes});
      } catch (e) {
        results.push({error: String(e.message), kind: e.kind ?? null});
      }
    }
    return {results, created, ran: {...calls}, inputMetadata: session.inputMetadata,
      outputMetadata: session.outputMetadata, executables: session.module.executables.length};
  } catch (e) {
    return {error: String(e.message), kind: e.kind ?? null};
  } finally {
    await session?.release();
    Object.assign(P, orig);
  }
}"""


def run_session(page, server, runs, keep=(), count=False) -> dict:
    r = evaluate(page, SESSION_JS, {"url": f"{server}bert/", "runs": [b64_feeds(f) for f in runs],
                                    "keep": list(keep), "count": count}, timeout_s=300)
    assert "error" not in r, r
    return r


def check_run(out: dict, model, feeds) -> None:
    """One run's outputs (name -> {type, dims, size, data}) against onnxruntime's: dims, element count, values."""
    ref = ort_run(model, feeds)
    assert sorted(out) == sorted(OUTPUT_NAMES)
    for name, want in zip(OUTPUT_NAMES, ref, strict=True):
        o = out[name]
        got = np.frombuffer(base64.b64decode(o["data"]), NUMPY_OF[o["type"]])
        assert list(o["dims"]) == list(want.shape), (name, o["dims"], want.shape)
        assert got.size == want.size, (name, got.size, want.size)
        assert_close(got.reshape(want.shape), want, name=f"{name} at {list(want.shape)}")


def python_error(module, feeds) -> str:
    """Python's bind_dims error for these feeds, as webiree.js words a WebireeError (message (hint))."""
    with pytest.raises(webiree.FeedError) as e:
        bind_dims(module, {k: v.shape for k, v in feeds.items()})
    return f"{e.value.message} ({e.value.hint})"


# ---------------------------------------------------------------- webiree.js in Chromium
@pytest.mark.browser
def test_webiree_js_runs_two_lengths(page, server, model):
    """One session at batch 2 x 7 and 1 x 64: outputs at their run's dims, equal to onnxruntime's;
    pooler_output kept on the GPU carries its run's dims too; only this run's bytes are read back."""
    runs = [bert_feeds(b, s) for b, s in SIZES]
    r = run_session(page, server, runs, keep=["pooler_output"])
    assert [m["shape"] for m in r["inputMetadata"]] == [["batch", "sequence"]] * 3
    assert [m["shape"] for m in r["outputMetadata"]] == [["batch", "sequence", 64], ["batch", 64]]
    for (b, s), feeds, res in zip(SIZES, runs, r["results"], strict=True):
        assert "error" not in res, res
        check_run(res["out"], model, feeds)
        assert res["out"]["pooler_output"]["location"] == "gpu-buffer"
        assert res["out"]["pooler_output"]["size"] == b * 64
        assert res["readbackBytes"] == 4 * b * s * 64    # last_hidden_state at this run's size, nothing more
    assert not page.errors


@pytest.mark.browser
def test_webiree_js_feed_errors(page, server, model, schedule):
    """A sequence of 129 (the range is 1..128) and an attention_mask shorter than input_ids are
    feed errors with Python's words; the session runs on afterwards."""
    too_long = bert_feeds(1, 129)
    mixed = bert_feeds(1, 7)
    mixed["attention_mask"] = np.ones((1, 5), np.int64)
    ok = bert_feeds(2, 5)
    r = run_session(page, server, [too_long, mixed, ok])
    long_err, mixed_err, fine = r["results"]
    assert long_err == {"error": python_error(schedule, too_long), "kind": "feed"}
    assert "dim 1 (sequence) is 129, outside the build's range 1..128" in long_err["error"]
    assert mixed_err == {"error": python_error(schedule, mixed), "kind": "feed"}
    assert "dim sequence is 5 in input 'attention_mask' (dim 1) but 7 in input 'input_ids'" in mixed_err["error"]
    assert "error" not in fine, fine
    check_run(fine["out"], model, ok)


@pytest.mark.browser
def test_webiree_js_creates_no_pipeline_per_length(page, server, model):
    """Every pipeline and shader module is made once, by the time session.ready() resolves (the
    start tier's and its variant's); runs at three lengths create none."""
    runs = [bert_feeds(b, s) for b, s in MORE_SIZES]
    r = run_session(page, server, runs, count=True)
    created, ran, n = r["created"], r["ran"], r["executables"]
    assert n > 0
    assert created["createShaderModule"] == n
    assert created["createComputePipelineAsync"] + created["createComputePipeline"] == n
    assert ran == created
    for feeds, res in zip(runs, r["results"], strict=True):
        assert "error" not in res, res
        check_run(res["out"], model, feeds)


@pytest.mark.browser
def test_webiree_js_on_dawn(server, model):
    """The same webiree.js on Dawn in Node (tests/dawn/run_site.mjs, OpenGL ES compatibility mode)."""
    for b, s in SIZES:
        feeds = bert_feeds(b, s)
        got = run_dawn(f"{server}bert/", feeds)
        for name, want in zip(OUTPUT_NAMES, ort_run(model, feeds), strict=True):
            assert_close(got[name], want, name=f"{name} at {list(want.shape)} on Dawn")


DETECTOR_JS = """async ({url, runs}) => {
  const bytes = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const b64 = (a) => { const u = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let s = '';
    for (let i = 0; i < u.length; i += 4096) s += String.fromCharCode(...u.subarray(i, i + 4096)); return btoa(s); };
  const w = await import(url + 'webiree.js');
  const session = await w.InferenceSession.create(url);
  const results = [];
  try {
    for (const {dims, data} of runs) {
      try {
        const r = await session.run({image: new w.Tensor('float32', new Float32Array(bytes(data).buffer), dims)});
        const out = {};
        for (const [k, t] of Object.entries(r)) out[k] = {dims: t.dims, data: b64(await t.getData())};
        results.push({out});
      } catch (e) { results.push({error: String(e.message), kind: e.kind ?? null}); }
    }
  } finally { await session.release(); }
  return results;
}"""


@pytest.mark.browser
def test_webiree_js_checks_sizes_the_graph_needs_equal(page, server, site_root):
    """The detector concatenates its upsampled 1/8 features with its 1/4 features: webiree.js runs
    it at 320 x 352 like onnxruntime and refuses 324 x 320 (ASSERT_EQ) with Python's words."""
    model = small_detector()
    good = np.random.default_rng(1).standard_normal((1, 3, 320, 352)).astype(np.float32)
    bad = np.zeros((1, 3, 324, 320), np.float32)
    runs = [{"dims": list(x.shape), "data": base64.b64encode(x.tobytes()).decode()} for x in (good, bad)]
    ok, refused = evaluate(page, DETECTOR_JS, {"url": f"{server}det/", "runs": runs}, timeout_s=300)
    assert "error" not in ok, ok
    for (name, o), want in zip(ok["out"].items(), ort_run(model, {"image": good}), strict=True):
        assert list(o["dims"]) == list(want.shape)
        assert_close(np.frombuffer(base64.b64decode(o["data"]), "<f4").reshape(want.shape), want, name=name)
    det = read_module((site_root / "det" / "model.wrm").read_bytes())
    assert refused == {"error": python_error(det, {"image": bad}), "kind": "feed"}
    assert refused["error"].startswith("the model cannot take these sizes (height=324, width=320): Concat")
    assert not page.errors


# ---------------------------------------------------------------- Pyodide
RUN_PY = """
import array, base64, json
import webiree_runtime as wr
arg = json.loads(ARG)

def tensor(f):
    a = array.array("q")
    a.frombytes(base64.b64decode(f["data"]))
    return wr.Tensor(f["type"], a, f["dims"])

sess = await wr.InferenceSession.create("./")
try:
    runs = []
    for feeds in arg["runs"]:
        try:
            outs = await sess.run(None, {name: tensor(f) for name, f in feeds.items()})
            runs.append({"out": {o.name: {"type": o.type, "dims": list(o.shape),
                                          "data": base64.b64encode(o.data.tobytes()).decode()} for o in outs}})
        except wr.WebireeError as e:
            runs.append({"error": str(e), "hint": e.hint, "kind": e.kind})
    result = {"runs": runs, "inputs": [[a.name, a.shape] for a in sess.get_inputs()],
              "outputs": [[a.name, a.shape] for a in sess.get_outputs()]}
finally:
    await sess.release()
json.dumps(result)
"""


@pytest.mark.browser
def test_pyodide_runs_two_lengths(pypage, model, schedule):
    runs = [bert_feeds(b, s) for b, s in SIZES] + [bert_feeds(1, 129)]
    r = py(pypage, RUN_PY, {"runs": [b64_feeds(f) for f in runs]})
    assert "error" not in r, r
    assert r["inputs"] == [[n, ["batch", "sequence"]] for n in ("input_ids", "attention_mask", "token_type_ids")]
    assert r["outputs"] == [["last_hidden_state", ["batch", "sequence", 64]], ["pooler_output", ["batch", 64]]]
    for feeds, res in zip(runs[:2], r["runs"][:2], strict=True):
        assert "error" not in res, res
        check_run(res["out"], model, feeds)
    err = r["runs"][2]
    assert f"{err['error']} ({err['hint']})" == python_error(schedule, runs[2]) and err["kind"] == "feed"
    assert not pypage.errors


# ---------------------------------------------------------------- natively (wgpu-py)
def test_native_creates_no_pipeline_per_length(bert, model, monkeypatch):
    from webiree.hal_webgpu.wgpu_driver import WgpuDriver

    made = []
    create = WgpuDriver.create_pipeline
    monkeypatch.setattr(WgpuDriver, "create_pipeline",
                        lambda self, name, *a: made.append(name) or create(self, name, *a))
    sess = webiree.InferenceSession(bert[0] / "bert")
    created = list(made)
    assert len(created) == len(sess.module.executables) > 0
    for b, s in MORE_SIZES:
        feeds = bert_feeds(b, s)
        got = sess.run(None, feeds)
        for name, g, want in zip(OUTPUT_NAMES, got, ort_run(model, feeds), strict=True):
            assert_close(g, want, name=f"{name} at {list(want.shape)}")
    assert made == created
    sess.close()
