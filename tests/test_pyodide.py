"""Python in the browser: the same build folder run from Pyodide (python.html) in headless Chromium.

Sites are built with webiree.compile into one temporary root: `mlp` with
pyodide=True (Pyodide copied into mlp/pyodide/), the others without, beside a
shared root/pyodide/ (python.html falls back to ../pyodide/). The root is
served by the project's server and driven by Playwright, like
tests/test_browser.py; Pyodide comes from node_modules/pyodide (scripts/setup.sh),
never from a CDN.

Numerics: the same feeds go to onnxruntime (CPU) and to Python-in-Pyodide;
max |diff| / max |ref| <= 1e-4. Latency (Python vs JavaScript in the same page)
is a benchmark, not a test: benchmarks/pyodide_overhead.py.
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import webiree
from webiree.bundler import pyodide as P
from webiree.testing.models import mlp, sample_inputs, small_cnn

from .browser_util import serving
from .conftest import assert_close, ort_run
from .test_browser import b64_feeds, evaluate

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
SEED = Path(os.environ.get("WEBIREE_SEED_DIR", ROOT / "tests" / ".data" / "seed"))
BOOT_TIMEOUT_S = 180
RUN_TIMEOUT_S = 300
NUMPY_OF = {"float32": "<f4", "int64": "<i8", "int32": "<i4", "bool": "u1", "uint8": "u1"}


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("pysites")


def _state_model():
    """y = 2x + 1 over [4, 8]: an output that can be fed back as the input (GPU-resident tests)."""
    from onnx import TensorProto, helper

    from webiree.testing.models import make_model
    f = TensorProto.FLOAT
    return make_model([helper.make_node("Mul", ["x", "two"], ["t"]), helper.make_node("Add", ["t", "one"], ["y"])],
                      [helper.make_tensor_value_info("x", f, [4, 8])], [helper.make_tensor_value_info("y", f, [4, 8])],
                      {"two": np.array(2.0, np.float32), "one": np.array(1.0, np.float32)}, name="state")


@pytest.fixture(scope="module")
def sites(root):
    """name -> (model, feeds); mlp carries its own Pyodide, the rest share root/pyodide/."""
    built = {}
    for name, make in {"mlp": mlp, "small_cnn": small_cnn, "state": _state_model}.items():
        model = make()
        webiree.compile(model, root / name, pyodide=(name == "mlp"))
        built[name] = (model, sample_inputs(model))
    P.copy_pyodide(root / P.PYODIDE_DIR)
    return built


@pytest.fixture(scope="module")
def mobilenet(root, sites):
    """The MobileNetV2 seed model (exported once by tests/seed/export_seed_models.py)."""
    import onnx

    name = "mobilenet_v2"
    if not (SEED / f"{name}.ref.npz").exists():
        SEED.mkdir(parents=True, exist_ok=True)
        p = subprocess.run([sys.executable, str(ROOT / "tests" / "seed" / "export_seed_models.py"), "--out", str(SEED),
                            "--only", name], capture_output=True, text=True, timeout=1800)
        assert p.returncode == 0, f"seed export failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    webiree.compile(SEED / f"{name}.onnx", root / name)
    model = onnx.load(str(SEED / f"{name}.onnx"))
    feeds = dict(np.load(SEED / f"{name}.inputs.npz"))
    ref = dict(np.load(SEED / f"{name}.ref.npz"))
    return model, feeds, [ref[o.name] for o in model.graph.output]


@pytest.fixture(scope="module")
def server(root, sites):
    with serving(root) as url:
        yield url


def open_python_page(browser, url: str, init_script: str | None = None):
    """(context, page) with python.html at url booted (body[data-state=ready]) or failed."""
    ctx = browser.new_context()
    if init_script:
        ctx.add_init_script(init_script)
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(url)
    pg.wait_for_selector("body[data-state=ready], body[data-state=error]", timeout=BOOT_TIMEOUT_S * 1000)
    return ctx, pg


@pytest.fixture(scope="module")
def pypage(browser, server, sites):
    """One booted python.html (mlp's, with its own pyodide/) for the API tests."""
    ctx, pg = open_python_page(browser, server + "mlp/python.html")
    assert pg.get_attribute("body", "data-state") == "ready", pg.inner_text("#status")
    yield pg
    ctx.close()


# ---------------------------------------------------------------- helpers
def py(page, code: str, arg=None, timeout_s: float = RUN_TIMEOUT_S):
    """Run Python `code` in the page's Pyodide (ARG = json of arg); returns json.loads of its value.
    A Python exception comes back as {'error': last line of the traceback}."""
    return json.loads(evaluate(page, """async ({code, arg}) => {
      const p = globalThis.webireePy;
      p.namespace.set('ARG', JSON.stringify(arg));
      try { return await p.exec(code); } catch (e) {
        const lines = String(e.message).trim().split('\\n');
        return JSON.stringify({error: lines[lines.length - 1], traceback: String(e.message)});
      }
    }""", {"code": code, "arg": arg}, timeout_s))


RUN_PY = """
import array, base64, json, time
import webiree_runtime as wr
arg = json.loads(ARG)
CODES = {"float32": "f", "int64": "q", "int32": "i", "bool": "B"}

def tensor(f):
    a = array.array(CODES[f["type"]])
    a.frombytes(base64.b64decode(f["data"]))
    return wr.Tensor(f["type"], a, f["dims"])

feeds = {name: tensor(f) for name, f in arg["feeds"].items()}
t0 = time.perf_counter()
sess = await wr.InferenceSession.create(arg["url"], **({"variant": arg["variant"]} if arg.get("variant") else {}))
create_ms = (time.perf_counter() - t0) * 1e3
try:
    outs = await sess.run(None, feeds)
    result = {
        "create_ms": create_ms,
        "variant": sess.variant,
        "inputs": [[a.name, a.shape, a.type] for a in sess.get_inputs()],
        "outputs": [[a.name, a.shape, a.type] for a in sess.get_outputs()],
        "out": {o.name: {"type": o.type, "dims": list(o.shape), "cls": type(o.data).__name__,
                         "data": base64.b64encode(o.data.tobytes()).decode()} for o in outs},
    }
finally:
    await sess.release()
json.dumps(result)
"""


def decode(r: dict) -> dict:
    return {k: np.frombuffer(base64.b64decode(v["data"]), NUMPY_OF[v["type"]]).reshape(v["dims"])
            for k, v in r["out"].items()}


def check_outputs(r, model, feeds, ref=None, tol=1e-4):
    assert "error" not in r, r
    got = decode(r)
    ref = ref if ref is not None else ort_run(model, feeds)
    assert list(got) == [o.name for o in model.graph.output]
    errs = {}
    for o, want in zip(model.graph.output, ref, strict=True):
        errs[o.name] = assert_close(got[o.name], want, tol, name=o.name)
    return errs


# ---------------------------------------------------------------- the site files (no browser)
def test_wheel_is_pure_python_and_reproducible(tmp_path):
    data = P.build_wheel_bytes()
    assert data == P.build_wheel_bytes()
    assert len(data) < 64 * 1024, f"the runtime wheel is {len(data)} bytes"
    z = zipfile.ZipFile(io.BytesIO(data))
    names = z.namelist()
    assert "webiree_runtime/__init__.py" in names and "webiree/hal_webgpu/interpreter.py" in names
    assert {f"webiree/text/{p.name}" for p in (ROOT / "webiree" / "text").glob("*.py")} <= set(names)
    assert not [n for n in names if n.startswith(("webiree/compiler", "webiree/wgsl_codegen", "webiree/bundler"))]
    assert "webiree/session.py" not in names and "webiree/hal_webgpu/wgpu_driver.py" not in names
    info = "webiree_runtime-0.1.0.dist-info"
    assert "Tag: py3-none-any" in z.read(f"{info}/WHEEL").decode()
    record = {line.split(",")[0]: line for line in z.read(f"{info}/RECORD").decode().splitlines()}
    assert set(record) == set(names)
    for n in names:
        if n != f"{info}/RECORD":
            assert record[n] == f"{n},{P._record_hash(z.read(n))},{len(z.read(n))}"
    # it installs with pip and imports with numpy, onnx and wgpu made unimportable
    whl = P.build_wheel(tmp_path)
    lib = tmp_path / "lib"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(lib),
                    str(whl)], check=True, timeout=120)
    probe = f"""
import sys
sys.path.insert(0, {str(lib)!r})
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {P.FORBIDDEN!r}:
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
import webiree_runtime, webiree.hal_webgpu.browser_driver, webiree.hal_webgpu
assert webiree_runtime.InferenceSession.__module__ == 'webiree.runtime_py'
assert webiree.__file__.startswith({str(lib)!r}), webiree.__file__
spec = {{"model": {{"type": "WordPiece", "vocab": {{"[UNK]": 0, "hello": 1, "world": 2}}, "unk_token": "[UNK]"}},
        "pre_tokenizer": {{"type": "BertPreTokenizer"}}}}
import json
assert webiree_runtime.Tokenizer.from_str(json.dumps(spec)).encode("hello, world").ids == [1, 0, 2]
print('ok')
"""
    p = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "ok", p.stderr


def test_import_check_rejects_numpy_at_module_level():
    files = P.wheel_contents() + [("webiree/bad.py", b"import numpy as np\n")]
    with pytest.raises(webiree.WebireeError, match="imports numpy at module level"):
        P.check_imports(files)
    files = P.wheel_contents() + [("webiree/bad.py", b"from .compiler import driver\n")]
    with pytest.raises(webiree.WebireeError, match="not in the runtime wheel"):
        P.check_imports(files)


def test_site_has_python_page(root, sites):
    site = root / "small_cnn"
    html = (site / P.PYTHON_PAGE).read_text()
    assert P.wheel_name() in html and P.PYODIDE_VERSION in html and "{{" not in html
    for absolute in ('src="/', 'href="/', "http://", "https://", "jsdelivr", "cdn."):
        assert absolute not in html.lower(), f"python.html must use relative URLs only ({absolute})"
    assert (site / P.wheel_name()).read_bytes() == P.build_wheel_bytes()
    assert not (site / P.PYODIDE_DIR).exists()   # only with pyodide=True
    for f in P.PYODIDE_FILES:
        assert (root / "mlp" / P.PYODIDE_DIR / f).read_bytes() == (P.pyodide_dist() / f).read_bytes()


def test_native_api_over_wgpu(sites, root):
    """The Pyodide API is plain async Python: natively it runs over wgpu-py under run_sync."""
    import array

    import webiree.runtime_py as wr
    from webiree.hal_webgpu.hal import run_sync
    from webiree.hal_webgpu.wgpu_driver import WgpuDriver
    from webiree.module import read_module

    model, feeds = sites["small_cnn"]
    site = root / "small_cnn"
    sess = run_sync(wr.InferenceSession.from_module(read_module((site / "model.wrm").read_bytes()),
                                                    (site / "weights.bin").read_bytes(), WgpuDriver()))
    (name, x), = feeds.items()
    outs = run_sync(sess.run(None, {name: (array.array("f", x.ravel().tolist()), x.shape)}))
    assert [o.name for o in outs] == [o.name for o in model.graph.output]
    assert all(isinstance(o.data, array.array) for o in outs)
    for o, want in zip(outs, ort_run(model, feeds), strict=True):
        assert_close(o.numpy(), want)
    with pytest.raises(webiree.FeedError, match=r"input 'image' must be float32, got float64|must be float32"):
        run_sync(sess.run(None, {name: (array.array("d", x.ravel()), x.shape)}))
    with pytest.raises(webiree.FeedError, match="unknown output name"):
        run_sync(sess.run(["nope"], {name: x}))


# ---------------------------------------------------------------- in the browser
@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_matches_onnxruntime(pypage, server, sites, name):
    model, feeds = sites[name]
    r = py(pypage, RUN_PY, {"url": f"../{name}/", "feeds": b64_feeds(feeds)})
    check_outputs(r, model, feeds)
    assert {v["cls"] for v in r["out"].values()} == {"array"}
    assert r["inputs"] == [[i.name, [d.dim_value for d in i.type.tensor_type.shape.dim], "tensor(float)"]
                           for i in model.graph.input if i.name in feeds]
    assert not pypage.errors


def test_kernel_variant_picked_by_the_adapter(pypage, server, sites):
    """A default build's kernel variants under Pyodide: SwiftShader (a fallback adapter whose
    subgroups are exactly 4 invocations) picks 'cpu-sg4', 'gpu' can be forced, and both match
    onnxruntime."""
    model, feeds = sites["small_cnn"]
    for option, want in ((None, "cpu-sg4"), ("gpu", "gpu")):
        r = py(pypage, RUN_PY, {"url": "../small_cnn/", "feeds": b64_feeds(feeds), "variant": option})
        check_outputs(r, model, feeds)
        assert r["variant"] == want, r
    r = py(pypage, RUN_PY, {"url": "../small_cnn/", "feeds": b64_feeds(feeds), "variant": "tpu"})
    assert "no kernel variant 'tpu' (it has: gpu, cpu, cpu-sg8, cpu-sg4, cpu-sg4-start)" in r["error"], r
    assert not pypage.errors


@pytest.mark.slow
def test_mobilenet_v2_matches_onnxruntime(pypage, server, mobilenet):
    model, feeds, ref = mobilenet
    r = py(pypage, RUN_PY, {"url": "../mobilenet_v2/", "feeds": b64_feeds(feeds)})
    errs = check_outputs(r, model, feeds, ref)
    print(f"\n[pyodide] mobilenet_v2: rel. error {errs}, session create {r['create_ms']:.0f} ms")


API_PY = """
import array, json
import webiree_runtime as wr
from js import Float32Array
sess = await wr.InferenceSession.create("../mlp/")
x = [((i * 7) % 11) / 11 - 0.5 for i in range(4 * 64)]
r = {}
try:
    a = await sess.run(None, {"x": (array.array("f", x), [4, 64])})
    b = await sess.run(["logits"], {"x": (Float32Array.new(x), [4, 64])})      # a JS typed array
    c = await sess.run(None, {"x": wr.Tensor("float32", array.array("f", x), (4, 64))})
    d = await sess.run(None, {"x": array.array("f", x)})                          # the model's shape
    from pyodide.code import run_js
    from pyodide.ffi import to_js
    e = await sess.run(None, run_js("(x) => ({x: [Float32Array.from(x), [4, 64]]})")(to_js(x)))   # a JS object
    f = await sess.run(None, {"x": run_js(\"\"\"(x) => { class Tensor { constructor(type, data, dims) {
        Object.assign(this, {type, data, dims}); } }; return new Tensor('float32', Float32Array.from(x), [4, 64]); }
        \"\"\")(to_js(x))})                                                          # a webiree.js-style Tensor
    r["same"] = [a[1].data == b[0].data, a[0].data == c[0].data, a[0].data == d[0].data,
                 a[0].data == e[0].data, a[0].data == f[0].data]
    r["result"] = [a[0].name, a[0].type, list(a[0].shape), type(a[0].data).__name__, a[0].data.typecode,
                   len(a[0].memoryview()), repr(a[0])[:20]]
    try:
        a[0].numpy()
        r["numpy"] = "present"
    except ImportError as e:
        r["numpy"] = str(e)
    r["js"] = str(a[0].to_js().constructor.name)
    g = await sess.run(None, {"x": (array.array("f", x), [4, 64])}, profile=True)
    r["profile"] = [sess.driver.has_timestamps, [name for name, _ in sess.last_profile],
                    [d["name"] for d in sess.module.info["dispatches"]], all(ms >= 0 for _, ms in sess.last_profile),
                    g[0].data == a[0].data]
    errors = {}
    for label, feeds in {"wrong name": {"y": (array.array("f", x), [4, 64])},
                         "missing": {},
                         "wrong shape": {"x": (array.array("f", x), [2, 128])},
                         "wrong type": {"x": (array.array("d", x), [4, 64])},
                         "wrong count": {"x": (array.array("f", x[:10]), [4, 64])}}.items():
        try:
            await sess.run(None, feeds)
            errors[label] = "ran"
        except wr.WebireeError as e:
            errors[label] = [e.kind, str(e)]
    r["errors"] = errors
finally:
    await sess.release()
try:
    await sess.run(None, {"x": (array.array("f", x), [4, 64])})
except wr.WebireeError as e:
    r["released"] = str(e)
try:
    await wr.InferenceSession.create("../no_such_model/")
except wr.WebireeError as e:
    r["missing_site"] = [e.kind, str(e)]
json.dumps(r)
"""


def test_api(pypage, server):
    r = py(pypage, API_PY)
    assert "error" not in r, r
    assert r["same"] == [True] * 5
    assert r["result"][:6] == ["probs", "float32", [4, 10], "array", "f", 40]
    assert r["numpy"].startswith("numpy is not available here")   # Pyodide offline has no numpy
    assert r["js"] == "Float32Array"
    has_ts, names, dispatches, nonneg, same = r["profile"]
    assert has_ts, "SwiftShader's WebGPU offers timestamp-query"
    assert names == dispatches and nonneg and same
    e = r["errors"]
    assert e["wrong name"] == ["feed", "unknown input name(s) ['y']"]
    assert e["missing"] == ["feed", "missing input(s) ['x']"]
    assert e["wrong shape"] == ["feed", "input 'x' has shape (2, 128); the model was compiled for (4, 64)"]
    assert e["wrong type"] == ["feed", "input 'x' must be float32, got float64"]
    assert e["wrong count"][0] == "feed" and "has 10 elements" in e["wrong count"][1]
    assert r["released"] == "the session was released"
    assert r["missing_site"][0] == "model" and "manifest.json: HTTP 404" in r["missing_site"][1]


REUSE_PY = """
import array, json, js
from pyodide.code import run_js
import webiree_runtime as wr
restore = run_js(\"\"\"(() => {
  const P = GPUDevice.prototype, orig = {...Object.fromEntries(['createBindGroup', 'createComputePipelineAsync',
    'createCommandEncoder', 'createBuffer'].map((k) => [k, P[k]]))};
  globalThis.gpuCalls = {createBindGroup: 0, createComputePipelineAsync: 0, createCommandEncoder: 0, createBuffer: 0};
  for (const k of Object.keys(orig)) P[k] = function (...a) { gpuCalls[k]++; return orig[k].apply(this, a); };
  return () => Object.assign(P, orig);
})()\"\"\")
counts = lambda: dict(js.Object.entries(js.gpuCalls).to_py())
try:
    sess = await wr.InferenceSession.create("../small_cnn/")
    created = counts()
    x = array.array("f", [0.5] * (3 * 32 * 32))
    for _ in range(3):
        await sess.run(None, {"image": (x, [1, 3, 32, 32])})
    ran = counts()
    await sess.release()
finally:
    restore()
json.dumps({"created": created, "ran": ran, "dispatches": len(sess.module.info["dispatches"]),
            "executables": len(sess.module.executables), "buffers": len(sess.module.buffers)})
"""


def test_runs_reuse_prepared_work(pypage, server):
    """Pipelines (all started before any is awaited), buffers and bind groups are made once per
    session; each run records the prepared list into one new command encoder."""
    r = py(pypage, REUSE_PY)
    assert "error" not in r, r
    c, n = r["created"], r["dispatches"]
    assert c == {"createBindGroup": n, "createComputePipelineAsync": r["executables"], "createCommandEncoder": 0,
                 "createBuffer": r["buffers"] + 1}   # + the one readback buffer
    assert r["ran"] == {**c, "createCommandEncoder": 3}


KEEP_PY = """
import array, json
import webiree_runtime as wr
sess = await wr.InferenceSession.create("../state/")
x = array.array("f", [float(i % 5) for i in range(32)])
(kept,) = await sess.run(None, {"x": (x, [4, 8])}, keep=["y"])
first, t = await kept.read_value()
(second,) = await sess.run(None, {"x": kept})          # copied on the GPU into the input
kept.release()
try:
    await sess.run(None, {"x": kept})
    released = "ran"
except wr.FeedError as e:
    released = e.message
try:
    await sess.run(None, {"x": (x, [4, 8])}, keep=["z"])
    bad_keep = "ran"
except wr.FeedError as e:
    bad_keep = e.message
await sess.release()
json.dumps({"type": type(kept).__name__, "shape": list(kept.shape), "first": list(first), "onnx": t,
            "second": list(second.data), "second_shape": list(second.shape), "released": released,
            "bad_keep": bad_keep})
"""


def test_outputs_stay_on_the_gpu(pypage, server):
    """keep= in Pyodide: the output comes back as a DeviceTensor (not read back), reads back on
    demand, feeds the next run on the GPU; a released one and an unknown keep name are feed errors."""
    r = py(pypage, KEEP_PY)
    assert "error" not in r, r
    x = np.array([float(i % 5) for i in range(32)], np.float32)
    assert r["type"] == "DeviceTensor" and r["shape"] == [4, 8] and r["onnx"] == 1
    np.testing.assert_array_equal(np.array(r["first"], np.float32), 2 * x + 1)
    np.testing.assert_array_equal(np.array(r["second"], np.float32), 2 * (2 * x + 1) + 1)
    assert r["second_shape"] == [4, 8]
    assert "was released" in r["released"]
    assert r["bad_keep"].startswith("keep names ['z']")


def test_cli_build_with_pyodide(tmp_path, monkeypatch):
    from onnx import save

    from webiree.cli import main

    save(mlp(), str(tmp_path / "m.onnx"))
    assert main(["build", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "plain")]) == 0
    assert (tmp_path / "plain" / P.wheel_name()).is_file() and (tmp_path / "plain" / P.PYTHON_PAGE).is_file()
    assert not (tmp_path / "plain" / P.PYODIDE_DIR).exists()
    assert main(["build", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "full"), "--pyodide"]) == 0
    assert sorted(p.name for p in (tmp_path / "full" / P.PYODIDE_DIR).iterdir()) == sorted(P.PYODIDE_FILES)
    monkeypatch.setenv("WEBIREE_PYODIDE_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(webiree.WebireeError, match=f"Pyodide {P.PYODIDE_VERSION} is not installed") as e:
        webiree.compile(mlp(), tmp_path / "again", pyodide=True)
    assert "scripts/setup.sh" in e.value.hint


def test_adapter_limits_too_small(pypage, server, root, sites):
    from webiree.module import read_module, write_module

    dst = root / "mlp_huge_limits"
    if not dst.exists():
        shutil.copytree(root / "small_cnn", dst)
        m = read_module((dst / "model.wrm").read_bytes())
        m.limits["max_compute_workgroup_storage_size"] = 1 << 30
        (dst / "model.wrm").write_bytes(write_module(m))
    r = py(pypage, """
import json, webiree_runtime as wr
try:
    await wr.InferenceSession.create("../mlp_huge_limits/")
    out = "created"
except wr.WebireeError as e:
    out = [e.kind, str(e), e.hint]
json.dumps(out)""")
    assert r[0] == "limits", r
    assert "the model needs max_compute_workgroup_storage_size = 1073741824, the adapter offers" in r[1]


def test_no_webgpu(browser, server, sites):
    ctx, pg = open_python_page(browser, server + "mlp/python.html", "delete Navigator.prototype.gpu;")
    try:
        r = py(pg, """
import json, webiree_runtime as wr
try:
    await wr.InferenceSession.create("./")
    out = "created"
except wr.WebireeError as e:
    out = [e.kind, str(e)]
json.dumps(out)""")
        assert r == ["device", "WebGPU is not available in this browser (navigator.gpu is missing)"]
    finally:
        ctx.close()


def test_python_page_snippet(browser, server, sites, tmp_path):
    """The page itself: boots from the shared ../pyodide/, runs the editable snippet, reports timings."""
    ctx, pg = open_python_page(browser, server + "small_cnn/python.html")
    try:
        assert pg.get_attribute("body", "data-state") == "ready", pg.inner_text("#status")
        boot_ms = float(pg.inner_text("#boot-ms"))
        assert boot_ms > 0
        assert evaluate(pg, "async () => webireePy.indexURL").endswith("/pyodide/")
        pg.click("#run")
        pg.wait_for_selector("body[data-state=done], body[data-state=error]", timeout=RUN_TIMEOUT_S * 1000)
        out = pg.inner_text("#output")
        assert pg.get_attribute("body", "data-state") == "done", pg.inner_text("#status") + out
        assert "Tensor(probs: float32 [1, 10]" in out and "argmax" in out and "latency:" in out
        latency = float(pg.inner_text("#latency-ms"))
        assert latency > 0
        pg.screenshot(path=str(tmp_path / "python.png"), full_page=True)
        # an edited snippet with a mistake shows the Python error in the page
        pg.fill("#code", "import webiree_runtime as wr\nsess = await wr.InferenceSession.create('./')\n"
                         "await sess.run(None, {'nope': [1.0]})")
        pg.click("#run")
        pg.wait_for_selector("body[data-state=done], body[data-state=error]", timeout=RUN_TIMEOUT_S * 1000)
        assert pg.get_attribute("body", "data-state") == "error"
        assert "FeedError: unknown input name(s) ['nope']" in pg.inner_text("#status")
        assert not pg.errors
        print(f"\n[pyodide] python.html: Pyodide boot {boot_ms:.0f} ms, small_cnn latency {latency:.2f} ms (snippet)")
    finally:
        ctx.close()


def test_python_page_without_pyodide(browser, server, root, sites):
    """A site without pyodide/ and without a shared copy beside it says how to get one."""
    lone = root / "lone" / "small_cnn"
    if not lone.exists():
        shutil.copytree(root / "small_cnn", lone)
    ctx, pg = open_python_page(browser, server + "lone/small_cnn/python.html")
    try:
        assert pg.get_attribute("body", "data-state") == "error"
        assert "rebuild it with `webiree build --pyodide`" in pg.inner_text("#status")
    finally:
        ctx.close()


# ---------------------------------------------------------------- tokenizers in the browser
TOKENIZER_CASES = {"tok_wordpiece": "wordpiece-uncased-template", "tok_bpe": "bytelevel-bpe"}
TOKENIZER_STRINGS = 300     # every 4th of test_tokenizers.py's 1,200 seeded strings (its hand-picked ones first)


@pytest.fixture(scope="module")
def tokenizer_sites(root):
    """site name -> (the `tokenizers` library's tokenizer, the strings): sites built by webiree.compile
    with tokenizer=, trained on test_tokenizers.py's seeded corpus."""
    import tokenizers  # noqa: F401  (set-up installs it: the reference the tokenizers are compared with)
    from .test_tokenizers import CASES, corpus, make_strings

    rng = random.Random(1234)
    lines, strings = corpus(rng, 3000), make_strings(rng, 1200)[::4][:TOKENIZER_STRINGS]
    built = {}
    for site, case in TOKENIZER_CASES.items():
        ref = CASES[case](lines)
        path = root / f"{site}.json"
        ref.save(str(path))
        webiree.compile(mlp(), root / site, validate=False, tokenizer=path)
        built[site] = (ref, strings)
    return built


TOKENIZE_PY = """
import json, time
import webiree_runtime as wr
arg = json.loads(ARG)
t0 = time.perf_counter()
tok = await wr.Tokenizer.from_url(arg["url"])
load_ms = (time.perf_counter() - t0) * 1e3
t0 = time.perf_counter()
encs = [tok.encode(s) for s in arg["strings"]]
encode_ms = (time.perf_counter() - t0) * 1e3
r = {"cls": [type(tok).__module__, type(tok).__name__], "load_ms": load_ms, "encode_ms": encode_ms,
     "ids": [e.ids for e in encs], "offsets": [[list(o) for o in e.offsets] for e in encs],
     "tokens": [e.tokens for e in encs], "decoded": [tok.decode(e.ids) for e in encs[:50]]}
try:
    await wr.Tokenizer.from_url("../mlp/")          # a build without --tokenizer
    r["missing"] = "loaded"
except wr.WebireeError as e:
    r["missing"] = [e.kind, str(e)]
json.dumps(r)
"""


@pytest.mark.parametrize("site", sorted(TOKENIZER_CASES))
def test_tokenizer_in_pyodide_matches_the_library(pypage, server, tokenizer_sites, site):
    """The site's tokenizer.json, fetched by `await wr.Tokenizer.from_url` in the page's Pyodide: ids,
    offsets and tokens identical to the `tokenizers` library's (run natively here) on 300 seeded strings."""
    ref, strings = tokenizer_sites[site]
    # the build folder's URL for one, the file's URL for the other
    url = f"../{site}/" if site == "tok_wordpiece" else f"../{site}/tokenizer.json"
    r = py(pypage, TOKENIZE_PY, {"url": url, "strings": strings}, timeout_s=120)
    assert "error" not in r, r
    assert r["cls"] == ["webiree.runtime_py", "Tokenizer"]
    theirs = [ref.encode(s) for s in strings]
    bad = [i for i, t in enumerate(theirs)
           if (r["ids"][i], [tuple(o) for o in r["offsets"][i]], r["tokens"][i]) != (t.ids, t.offsets, t.tokens)]
    for i in bad[:3]:
        print(f"\n{strings[i]!r}\n pyodide {list(zip(r['tokens'][i], r['offsets'][i]))}\n"
              f" library {list(zip(theirs[i].tokens, theirs[i].offsets))}")
    assert not bad, f"{len(bad)} of {len(strings)} strings differ"
    assert r["decoded"] == [ref.decode(t.ids) for t in theirs[:50]]
    assert r["missing"][0] == "model" and "tokenizer.json: HTTP 404" in r["missing"][1]
    assert not pypage.errors
    ntok = sum(len(t.ids) for t in theirs)
    print(f"\n[pyodide] {TOKENIZER_CASES[site]}: {len(strings)} strings ({ntok} tokens) identical; "
          f"load {r['load_ms']:.0f} ms, encode {r['encode_ms']:.0f} ms")
