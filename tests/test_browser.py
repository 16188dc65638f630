"""The site in a real browser: web/webiree.js in headless Chromium (WebGPU on SwiftShader).

Sites are built with webiree.compile into one temporary root, served by the
project's server (webiree.bundler.server) from a uvicorn thread, and driven by
Playwright. Chromium starts once per module. Every page.evaluate carries its
own timeout (`evaluate` below) so a GPU hang fails fast instead of waiting
for pytest-timeout.

Numerics: the same feeds go to onnxruntime (CPU) and to the browser;
max |diff| / max |ref| <= 1e-4 for floats, exact for ints and bools.
"""

from __future__ import annotations

import base64
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import webiree
from webiree.module import read_module, write_module
from webiree.testing.models import make_model, mlp, sample_inputs, small_cnn

from .browser_util import CHROMIUM, CHROMIUM_ARGS, write_blank_page  # noqa: F401
from .conftest import assert_close, ort_run

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

EVAL_TIMEOUT_S = 60
NUMPY_OF = {"float32": "<f4", "int64": "<i8", "int32": "<i4", "bool": "u1", "uint8": "u1", "float16": "<f2"}
TYPE_OF = {np.dtype(np.float32): "float32", np.dtype(np.int64): "int64", np.dtype(np.int32): "int32",
           np.dtype(np.bool_): "bool", np.dtype(np.uint8): "uint8",
           np.dtype(np.float16): "float16"}   # float16 travels as its bits
# Chromium's WGSL compiler (Tint) rejects a const-expression that evaluates to inf/NaN, which naga accepts.


# ---------------------------------------------------------------- models
def relu_cnn(seed: int = 0) -> "onnx.ModelProto":  # noqa: F821
    """Conv+Relu, strided Conv, AveragePool, GlobalAveragePool, Gemm: a [1,10] classifier
    output and a [1,8,8,8] feature map (shown as a mask by the demo page)."""
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)  # noqa: E731
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["features"], name="conv2", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["features"], ["ap"], name="avgpool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["ap"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "w3", "b3"], ["logits"], name="fc", transB=1),
    ]
    inits = {"w1": w(8, 3, 3, 3), "b1": w(8), "w2": w(8, 8, 3, 3), "b2": w(8), "w3": w(10, 8), "b3": w(10)}
    return make_model(nodes, [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 16, 16])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10]),
                       helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 8, 8, 8])],
                      inits, name="relu_cnn")


def tokens(seed: int = 0, vocab: int = 50, seq: int = 8, dim: int = 16, classes: int = 5):
    """int64 token ids through a Gather embedding, a bool mask through Where; outputs in
    float32 (logits), int64 (ids + 1) and bool (positive logits)."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
        helper.make_node("Unsqueeze", ["mask", "ax2"], ["m3"], name="mask_unsq"),
        helper.make_node("Where", ["m3", "e", "zero"], ["em"], name="mask_where"),
        helper.make_node("Reshape", ["em", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "w"], ["logits"], name="head"),
        helper.make_node("Add", ["ids", "one"], ["next_ids"], name="next_ids"),
        helper.make_node("Greater", ["logits", "zero"], ["positive"], name="positive"),
    ]
    inits = {"emb": rng.standard_normal((vocab, dim)).astype(np.float32),
             "w": (rng.standard_normal((seq * dim, classes)) / 8).astype(np.float32),
             "zero": np.array(0.0, np.float32), "one": np.array(1, np.int64), "ax2": np.array([2], np.int64),
             "flat_shape": np.array([1, seq * dim], np.int64)}
    return make_model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq]),
                              helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, seq])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes]),
                       helper.make_tensor_value_info("next_ids", TensorProto.INT64, [1, seq]),
                       helper.make_tensor_value_info("positive", TensorProto.BOOL, [1, classes])],
                      inits, name="tokens")


def token_feeds():
    feeds = sample_inputs(tokens())
    feeds["ids"][0, :3] = [49, -3, 0]  # the last row, a negative (wrapping) index, row 0
    return feeds


MODELS = {"mlp": mlp, "small_cnn": small_cnn, "relu_cnn": relu_cnn, "tokens": tokens}


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """root: one folder per model (built once), and blank.html to host API tests."""
    root = tmp_path_factory.mktemp("sites")
    write_blank_page(root)
    built = {}
    for name, make in MODELS.items():
        model = make()
        res = webiree.compile(model, root / name)
        built[name] = (model, res)
    return root, built


@pytest.fixture(scope="module")
def site_root(sites):
    return sites[0]


# ---------------------------------------------------------------- helpers
def evaluate(page, fn: str, arg=None, timeout_s: float = EVAL_TIMEOUT_S):
    """page.evaluate of the async JS function `fn`, failing after timeout_s."""
    wrapped = f"""async (arg) => {{
      const fn = {fn};
      let timer;
      const limit = new Promise((_, reject) => {{
        timer = setTimeout(() => reject(new Error('page.evaluate timed out after {timeout_s} s')), {int(timeout_s * 1000)});
      }});
      try {{ return await Promise.race([fn(arg), limit]); }} finally {{ clearTimeout(timer); }}
    }}"""
    return page.evaluate(wrapped, arg)


def b64_feeds(feeds: dict) -> dict:
    return {k: {"type": TYPE_OF[v.dtype], "dims": list(v.shape),
                "data": base64.b64encode(np.ascontiguousarray(v).astype(NUMPY_OF[TYPE_OF[v.dtype]]).tobytes()).decode()}
            for k, v in feeds.items()}


# Runs a site in the page: create, run (feeds given as base64), release. Errors come back as values.
RUN_JS = """async ({url, runtime, feeds, profile, tweak, options}) => {
  const w = await import(runtime);
  const ARR = {float32: Float32Array, int64: BigInt64Array, int32: Int32Array, bool: Uint8Array, uint8: Uint8Array,
    float16: Uint16Array};
  const bytes = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const b64 = (a) => { const u = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let s = '';
    for (let i = 0; i < u.length; i += 4096) s += String.fromCharCode(...u.subarray(i, i + 4096)); return btoa(s); };
  const progress = [];
  let session;
  try {
    session = await w.InferenceSession.create(url, {onProgress: (p) => progress.push(p), ...options});
    const tensors = {};
    for (const [name, {type, dims, data}] of Object.entries(feeds)) {
      tensors[name] = new w.Tensor(type, new ARR[type](bytes(data).buffer), dims);
    }
    if (tweak) eval(tweak);
    const r = await session.run(tensors, {profile});
    const out = {};
    for (const [k, t] of Object.entries(r)) out[k] = {type: t.type, dims: t.dims, data: b64(t.data), cls: t.data.constructor.name};
    return {out, profile: r.profile ?? null, trace: r.trace ?? null, progress, hasTimestamps: session.hasTimestamps,
      variant: session.variant,
      inputNames: session.inputNames, outputNames: session.outputNames,
      inputMetadata: session.inputMetadata, outputMetadata: session.outputMetadata};
  } catch (e) {
    return {error: String(e.message), kind: e.kind ?? null, errorName: e.name};
  } finally {
    await session?.release();
  }
}"""


def run_site(page, server, name, feeds, profile=False, tweak=None, timeout_s=EVAL_TIMEOUT_S,
             runtime="relu_cnn", options=None) -> dict:
    """Run site `name` with the webiree.js of site `runtime` (every site holds the same copy);
    options: more InferenceSession.create options (e.g. {"variant": "gpu"})."""
    return evaluate(page, RUN_JS, {"url": f"{server}{name}/", "runtime": f"{server}{runtime}/webiree.js",
                                   "feeds": b64_feeds(feeds), "profile": profile, "tweak": tweak,
                                   "options": options or {}}, timeout_s)


def decode_outputs(got: dict) -> dict:
    return {k: np.frombuffer(base64.b64decode(v["data"]), NUMPY_OF[v["type"]]).reshape(v["dims"])
            .astype(bool if v["type"] == "bool" else NUMPY_OF[v["type"]]) for k, v in got["out"].items()}


def check_no_error(r: dict):
    assert "error" not in r, r


# ---------------------------------------------------------------- tests
def test_chromium_has_webgpu(page):
    info = evaluate(page, """async () => {
      if (!navigator.gpu) return {error: 'navigator.gpu missing'};
      const a = await navigator.gpu.requestAdapter();
      return a ? {arch: a.info.architecture, vendor: a.info.vendor, features: [...a.features]} : {error: 'no adapter'};
    }""")
    assert "error" not in info, f"Chromium has no WebGPU here: {info} (flags {CHROMIUM_ARGS})"


@pytest.mark.parametrize("name", list(MODELS))
def test_matches_onnxruntime(page, server, sites, name):
    model, res = sites[1][name]
    feeds = token_feeds() if name == "tokens" else sample_inputs(model)
    r = run_site(page, server, name, feeds)
    check_no_error(r)
    got = decode_outputs(r)
    ref = ort_run(model, feeds)
    assert list(got) == [o.name for o in model.graph.output]
    for o, want in zip(model.graph.output, ref, strict=True):
        assert_close(got[o.name], want, name=f"{name}:{o.name}")
    assert not page.errors


def test_kernel_variant_picked_by_the_adapter(page, server, sites):
    """A default build carries GPU- and CPU-class kernels: SwiftShader (a fallback adapter whose
    subgroups are exactly 4 invocations) picks 'cpu-sg4'; the variants, the picked one and the
    others forced, match onnxruntime, each creating only its own pipelines; an unknown variant is
    a 'model' error."""
    from webiree.module.format import variant_counts
    from webiree.testing.models import tiny_attention

    built = {"small_cnn": sites[1]["small_cnn"]}
    model = tiny_attention()
    built["tiny_attention"] = (model, webiree.compile(model, sites[0] / "tiny_attention"))
    adapter = evaluate(page, f"""async () => {{
      const w = await import('{server}relu_cnn/webiree.js'); const a = await navigator.gpu.requestAdapter();
      return {{cls: w.adapterClass(a), sg: w.adapterSubgroupSize(a), architecture: a.info.architecture}};
    }}""")
    assert (adapter["cls"], adapter["sg"]) == ("cpu", 4), adapter
    # count the pipelines each session creates
    page.evaluate("""() => { const orig = GPUDevice.prototype.createComputePipelineAsync; window.__orig = orig;
      GPUDevice.prototype.createComputePipelineAsync = function (d) { window.__made++; return orig.call(this, d); }; }""")
    try:
        for name, (model, res) in built.items():
            feeds = sample_inputs(model)
            ref = ort_run(model, feeds)
            counts = {c["name"]: c["executables"] for c in variant_counts(res.module)}
            assert len(res.module.executables) < sum(counts.values())
            for option, want in ((None, "cpu-sg4"), ("gpu", "gpu"), ("cpu", "cpu")):
                page.evaluate("() => { window.__made = 0; }")
                # without its start tier (test_start_tier_runs_first_then_the_variant), to count exactly
                r = run_site(page, server, name, feeds, options={"variant": option} if option else {"startTier": False})
                check_no_error(r)
                assert (r["variant"], page.evaluate("window.__made")) == (want, counts[want]), r
                got = decode_outputs(r)
                for o, want_out in zip(model.graph.output, ref, strict=True):
                    assert_close(got[o.name], want_out, name=f"{name} {o.name} ({want})")
    finally:
        page.evaluate("() => { GPUDevice.prototype.createComputePipelineAsync = window.__orig; }")
    r = run_site(page, server, "small_cnn", sample_inputs(built["small_cnn"][0]), options={"variant": "tpu"})
    assert r["kind"] == "model" and "no kernel variant 'tpu' (it has: gpu, cpu, cpu-sg8, cpu-sg4, cpu-sg4-start)" \
        in r["error"], r


def _one_dispatch_in_every_variant(page, server, sites, name, model, feeds, strategies, ref=None):
    """Build `model` for every adapter, run it in Chromium in the variant picked (cpu-sg4 on
    SwiftShader), in 'gpu' and in 'cpu', and check each against onnxruntime (or against `ref`,
    element for element) and that its one dispatch is the expected strategy (strategies: variant
    -> strategy, or the list of its dispatches' strategies). Returns the build."""
    res = webiree.compile(model, sites[0] / name)
    by_variant = {v.name: [d["config"]["strategy"] for d in v.info["dispatches"]] for v in res.module.variants}
    want_out = ort_run(model, feeds)[0] if ref is None else ref
    for option, want in ((None, "cpu-sg4"), ("gpu", "gpu"), ("cpu", "cpu")):
        assert by_variant[want] == (strategies[want] if isinstance(strategies[want], list) else [strategies[want]]), by_variant
        r = run_site(page, server, name, feeds, options={"variant": option} if option else {"startTier": False})
        check_no_error(r)
        assert r["variant"] == want, r
        got = decode_outputs(r)[model.graph.output[0].name]
        if ref is None:
            assert_close(got, want_out, name=f"{name} ({want})")
        else:
            np.testing.assert_array_equal(got, want_out, err_msg=f"{name} ({want})")
    return res


def test_integer_products_in_every_variant(page, server, sites):
    """An integer product whose sums of A'B' pass 2^24 (test_quant.extreme_integer_product) on
    SwiftShader in each kernel variant, equal to numpy's int64 product: subgroup-broadcast in
    'cpu-sg4' (exact f32 sums flushed to i32 every 1,024 values of K), dot4I8Packed in 'gpu' and
    'cpu'; the CPU variants after the elementwise dispatch that packs A into words, 'gpu' packing A
    where it loads it (passes.pack_in_products)."""
    from .test_quant import extreme_integer_product
    model, feeds, ref = extreme_integer_product()
    _one_dispatch_in_every_variant(page, server, sites, "int8_extreme", model, feeds,
                                   {"cpu-sg4": ["elementwise", "subgroup-broadcast"], "gpu": ["split-k"],
                                    "cpu": ["elementwise", "register-blocked"]},
                                   ref=ref)


def _assert_words_in_cpu_sg4(res):
    """The one dispatch of the build's 'cpu-sg4' variant reads B as vec4<u32> words."""
    (sg4,) = [v for v in res.module.variants if v.name == "cpu-sg4"]
    (d,) = sg4.info["dispatches"]
    assert "array<vec4<u32>>" in res.module.executables[d["exec"]].code.decode(), d


def test_half_weights_read_in_pairs_in_every_variant(page, server, sites):
    """A product of a constant whose values are halves (stored as f16 pairs) on SwiftShader in
    each kernel variant against onnxruntime; in 'cpu-sg4' the subgroup kernel reads B as
    vec4<u32> words, two slots a load (matmul._half_pairs)."""
    w = np.random.default_rng(13).standard_normal((72, 48)).astype(np.float16).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["a", "w"], ["y"])],
                       [helper.make_tensor_value_info("a", TensorProto.FLOAT, [33, 72])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [33, 48])], {"w": w})
    res = _one_dispatch_in_every_variant(page, server, sites, "half_pairs", model, sample_inputs(model),
                                         {"cpu-sg4": "subgroup-broadcast", "gpu": "tiled-shared",
                                          "cpu": "register-blocked"})
    _assert_words_in_cpu_sg4(res)


def test_4bit_weights_read_as_words_in_every_variant(page, server, sites):
    """A MatMulNBits product (packed zero points, bias, blocks of 16: shorter than a step of K,
    and a tail of K) on SwiftShader in each kernel variant against onnxruntime; in 'cpu-sg4' the
    subgroup kernel reads B's words, eight values of K for four columns, as vec4<u32>
    (matmul._nibbles), the others dequantize B in their loads through its prologue."""
    from .test_contrib_quant import nbits_model
    model, feeds = nbits_model(96, 40, 16, zp="packed", bias=True, a_shape=(33,), seed=3)
    res = _one_dispatch_in_every_variant(page, server, sites, "nibbles", model, feeds,
                                         {"cpu-sg4": "subgroup-broadcast", "gpu": "tiled-shared",
                                          "cpu": "register-blocked"})
    _assert_words_in_cpu_sg4(res)


def test_chained_products_in_every_variant(page, server, sites):
    """A feed-forward block as one chained-product dispatch (kernels/matmul_chain.py) on
    SwiftShader in each kernel variant: chain-subgroup with subgroups of 4 in 'cpu-sg4' (the one
    picked), chain-shared in 'gpu' (128 invocations, H split in 4 slices) and in 'cpu', each
    against onnxruntime; ragged rows and chunks (33 rows, H = 200)."""
    from .test_matmul_chain import ffn
    model = ffn(33, 64, 200, 64)
    _one_dispatch_in_every_variant(page, server, sites, "ffn", model, sample_inputs(model),
                                   {"cpu-sg4": "chain-subgroup", "gpu": "chain-shared", "cpu": "chain-shared"})


@pytest.mark.parametrize("shape", [(2, 3, 33, 45, 20, 12), (1, 2, 40, 50, 64, 64)])
def test_fused_attention_in_every_variant(page, server, sites, shape):
    """Scaled dot-product attention as one dispatch (kernels/attention.py) on SwiftShader in each
    kernel variant: attention-subgroup with subgroups of 4 in 'cpu-sg4' (the one picked),
    attention-online in 'gpu' and 'cpu', against onnxruntime: rows, keys and head sizes off the
    blocks, and heads of 64 values (BERT-base's: 'gpu' takes 32 invocations of 8 splits in the
    default limits, config.py _attention_online), rows whose every key is masked with -inf (0
    after the NaN guard)."""
    import numpy as np

    from webiree.testing.models import sdpa_block
    model = sdpa_block(*shape)
    feeds = sample_inputs(model)
    feeds["mask"][0, 0, :3, :] = -np.inf
    res = _one_dispatch_in_every_variant(page, server, sites, f"sdpa{shape[-1]}", model, feeds,
                                         {"cpu-sg4": "attention-subgroup", "gpu": "attention-online",
                                          "cpu": "attention-online"})
    (gpu,) = [v.info["dispatches"][0]["config"] for v in res.module.variants if v.name == "gpu"]
    assert list(gpu["workgroup_size"]) == ([32, 1, 1] if shape[-1] == 64 else [64, 1, 1]), gpu


START_TIER_JS = """async ({url, runtime, feeds, options}) => {
  const w = await import(runtime);
  const bytes = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const b64 = (a) => { const u = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let s = '';
    for (let i = 0; i < u.length; i += 4096) s += String.fromCharCode(...u.subarray(i, i + 4096)); return btoa(s); };
  const made = [];
  const orig = GPUDevice.prototype.createComputePipelineAsync;
  GPUDevice.prototype.createComputePipelineAsync = function (d) { made.push(d.label); return orig.call(this, d); };
  let s;
  try {
    s = await w.InferenceSession.create(url, options);
    const tensors = Object.fromEntries(Object.entries(feeds).map(([k, {type, dims, data}]) =>
      [k, new w.Tensor(type, new Float32Array(bytes(data).buffer), dims)]));
    const enc = (r) => Object.fromEntries(Object.entries(r).map(([k, t]) => [k, {type: t.type, dims: t.dims, data: b64(t.data)}]));
    const tiers = [s.runningVariant];
    const first = enc(await s.run(tensors));
    const atFirst = made.length;
    // no ready(): the variant's own pipelines are created between runs, then runs switch to them
    const t0 = performance.now();
    while (s.runningVariant !== s.variant && performance.now() - t0 < 60000) await new Promise((r) => setTimeout(r, 50));
    tiers.push(s.runningVariant);
    await s.ready();
    const second = enc(await s.run(tensors));
    return {tiers, variant: s.variant, first, second, atFirst, made: made.length};
  } catch (e) {
    return {error: String(e.message), kind: e.kind ?? null};
  } finally {
    GPUDevice.prototype.createComputePipelineAsync = orig;
    await s?.release();
  }
}"""


def test_start_tier_runs_first_then_the_variant(page, server, sites):
    """SwiftShader picks 'cpu-sg4'; its start tier 'cpu-sg4-start' (small register blocks, compiled
    several times faster) runs first while cpu-sg4's own pipelines are created between runs, then
    runs switch to cpu-sg4 without ready() being called. Both tiers match onnxruntime; each
    pipeline of the two is created once; {startTier: false} runs cpu-sg4 from the first run."""
    from webiree.module.format import OP_DISPATCH

    model, res = sites[1]["small_cnn"]
    feeds = sample_inputs(model)
    ref = ort_run(model, feeds)
    used = {v.name: {c[1] for c in v.commands if c[0] == OP_DISPATCH} for v in res.module.variants}
    assert used["cpu-sg4"] != used["cpu-sg4-start"], used
    n_both = len(used["cpu-sg4"] | used["cpu-sg4-start"])
    args = {"url": f"{server}small_cnn/", "runtime": f"{server}relu_cnn/webiree.js", "feeds": b64_feeds(feeds)}
    r = evaluate(page, START_TIER_JS, {**args, "options": {}})
    check_no_error(r)
    assert (r["tiers"], r["variant"]) == (["cpu-sg4-start", "cpu-sg4"], "cpu-sg4"), r["tiers"]
    assert r["made"] == n_both and r["atFirst"] < n_both, r
    for run in ("first", "second"):
        got = decode_outputs({"out": r[run]})
        assert_close(got["probs"], ref[0], name=f"probs ({run} run)")
    r = evaluate(page, START_TIER_JS, {**args, "options": {"startTier": False}})
    check_no_error(r)
    assert r["tiers"] == ["cpu-sg4", "cpu-sg4"] and r["made"] == len(used["cpu-sg4"]), r
    assert_close(decode_outputs({"out": r["first"]})["probs"], ref[0], name="probs (no start tier)")


def test_half_variant_needs_shader_f16(page, server, sites):
    """Chromium's SwiftShader has no shader-f16: a build carrying '-f16' variants (halves stored,
    compiler/half_storage.py) runs its f32-storage kernels there, and a forced '-f16' variant is a
    'limits' error naming the feature, before anything is created."""
    from .test_half_storage import feeds, half_model
    model = half_model()
    webiree.compile(model, sites[0] / "halves", variants="cpu,cpu-sg4,cpu-f16,cpu-sg4-f16")
    has = evaluate(page, "async () => (await navigator.gpu.requestAdapter()).features.has('shader-f16')")
    assert has is False, "SwiftShader now offers shader-f16: run the -f16 variant here instead"
    r = run_site(page, server, "halves", feeds())
    check_no_error(r)
    assert r["variant"] == "cpu-sg4", r["variant"]
    assert_close(decode_outputs(r)["y"], ort_run(model, feeds())[0], tol=4 * 2.0 ** -10, name="y")
    r = run_site(page, server, "halves", feeds(), options={"variant": "cpu-sg4-f16"})
    assert r["kind"] == "limits" and "need the shader-f16 feature" in r["error"], r


def test_metadata_types_and_progress(page, server, sites):
    r = run_site(page, server, "tokens", token_feeds())
    check_no_error(r)
    assert r["inputNames"] == ["ids", "mask"]
    assert r["outputNames"] == ["logits", "next_ids", "positive"]
    assert r["inputMetadata"] == [{"name": "ids", "isTensor": True, "type": "int64", "shape": [1, 8]},
                                  {"name": "mask", "isTensor": True, "type": "bool", "shape": [1, 8]}]
    assert [m["type"] for m in r["outputMetadata"]] == ["float32", "int64", "bool"]
    assert {k: v["cls"] for k, v in r["out"].items()} == {
        "logits": "Float32Array", "next_ids": "BigInt64Array", "positive": "Uint8Array"}
    assert decode_outputs(r)["next_ids"][0, 1] == -2  # -3 + 1: negative int64 results keep their sign
    site = sites[0] / "tokens"
    total = sum((site / f).stat().st_size for f in ("manifest.json", "model.wrm", "weights.bin"))
    loaded = [p["loaded"] for p in r["progress"]]
    assert loaded == sorted(loaded) and loaded[-1] == total
    assert r["progress"][-1]["total"] == total


def test_profile_names_every_dispatch(page, server, sites):
    r = run_site(page, server, "relu_cnn", sample_inputs(sites[1]["relu_cnn"][0]), profile=True)
    check_no_error(r)
    assert r["hasTimestamps"], "SwiftShader's WebGPU offers timestamp-query"
    names = [d["name"] for d in sites[1]["relu_cnn"][1].module.info["dispatches"]]
    assert [p["name"] for p in r["profile"]] == names
    assert all(p["ms"] >= 0 for p in r["profile"])


def test_profile_trace_is_the_native_one(page, server, sites):
    """results.trace of a profiled run is the Chrome trace webiree builds natively: the same events
    (names, kinds, fused ONNX nodes, strategies) in the same form; only the times differ."""
    model, res = sites[1]["relu_cnn"]
    feeds = sample_inputs(model)
    r = run_site(page, server, "relu_cnn", feeds, profile=True)
    check_no_error(r)
    sess = webiree.InferenceSession(sites[0] / "relu_cnn")
    sess.run(None, feeds, profile=True)
    native = sess.last_trace
    assert native is not None, "lavapipe offers timestamp-query"
    strip = lambda t: [{k: v for k, v in e.items() if k not in ("ts", "dur")} for e in t["traceEvents"]]  # noqa: E731
    assert strip(r["trace"]) == strip(native)
    assert r["trace"]["displayTimeUnit"] == native["displayTimeUnit"] == "ms"
    spans = [(e["ts"], e["dur"]) for e in r["trace"]["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(res.module.info["dispatches"]) and all(d >= 0 for _, d in spans)
    assert min(ts for ts, _ in spans) == 0


FEED_ERRORS = [
    ("wrong name", "tensors.idz = tensors.ids; delete tensors.ids", "unknown input name(s) [\"idz\"]"),
    ("missing", "delete tensors.mask", "missing input(s) [\"mask\"]"),
    ("wrong shape", "tensors.ids = new w.Tensor('int64', new BigInt64Array(16), [2, 8])",
     "input 'ids' has shape [2, 8]; the model was compiled for [1, 8]"),
    ("wrong type", "tensors.ids = new w.Tensor('int32', new Int32Array(8), [1, 8])", "input 'ids' must be int64, got int32"),
    ("int64 too big", "tensors.ids.data[5] = 2n ** 31n",
     "input 'ids' holds 2147483648, outside the int32 range WebGPU can compute with"),
    ("int64 too small", "tensors.ids.data[0] = -(2n ** 31n) - 1n",
     "input 'ids' holds -2147483649, outside the int32 range"),
    ("not a tensor", "tensors.mask = [1, 0]", "input 'mask' must be a webiree.Tensor"),
    ("bad typed array", "tensors.ids = {type: 'int64', dims: [1, 8], data: new Int32Array(8)}",
     "input 'ids' has 8 Int32Array elements"),
]


@pytest.mark.parametrize("case,tweak,message", FEED_ERRORS, ids=[c[0] for c in FEED_ERRORS])
def test_feed_errors(page, server, case, tweak, message):
    r = run_site(page, server, "tokens", token_feeds(), tweak=tweak)
    assert r.get("kind") == "feed", r
    assert message in r["error"]


def test_int64_edges_of_the_int32_range_are_accepted(page, server, sites):
    """ids at both ends of the int32 range are accepted and give the native runtime's values
    (indices out of the table clamp in both runtimes)."""
    feeds = token_feeds()
    r = run_site(page, server, "tokens", feeds,
                 tweak="tensors.ids.data[6] = 2n ** 31n - 1n; tensors.ids.data[7] = -(2n ** 31n)")
    check_no_error(r)
    feeds["ids"][0, 6], feeds["ids"][0, 7] = 2**31 - 1, -(2**31)
    sess = webiree.InferenceSession(sites[0] / "tokens")
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    got = decode_outputs(r)
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w, err_msg=name)


def test_no_webgpu(browser, server):
    ctx = browser.new_context()
    ctx.add_init_script("delete Navigator.prototype.gpu;")
    try:
        pg = ctx.new_page()
        pg.goto(server + "blank.html")
        r = run_site(pg, server, "relu_cnn", sample_inputs(relu_cnn()))
        assert r["kind"] == "device" and "WebGPU is not available in this browser (navigator.gpu is missing)" in r["error"]
        pg.goto(server + "relu_cnn/")  # the demo page says so too
        pg.wait_for_selector("body[data-state=error]", timeout=EVAL_TIMEOUT_S * 1000)
        assert "navigator.gpu is missing" in pg.inner_text("#status")
    finally:
        ctx.close()


def _variant(sites, src: str, dst: str, edit) -> str:
    """A copy of site `src` named `dst` whose model.wrm bytes went through edit(bytes)."""
    root = sites[0]
    if not (root / dst).exists():
        shutil.copytree(root / src, root / dst)
        wrm = root / dst / "model.wrm"
        wrm.write_bytes(edit(wrm.read_bytes()))
    return dst


def _huge_limits(data: bytes) -> bytes:
    m = read_module(data)
    m.limits["max_compute_workgroup_storage_size"] = 1 << 30
    return write_module(m)


def test_adapter_limits_too_small(page, server, sites):
    name = _variant(sites, "relu_cnn", "relu_cnn_huge_limits", _huge_limits)
    r = run_site(page, server, name, sample_inputs(relu_cnn()))
    assert r["kind"] == "limits", r
    assert "the model needs maxComputeWorkgroupStorageSize (max_compute_workgroup_storage_size) = 1073741824" in r["error"]
    assert "this adapter offers" in r["error"]


@pytest.mark.parametrize("case,edit,message", [
    ("bad magic", lambda b: b"NOPE" + b[4:], "not a webiree schedule module (bad magic)"),
    ("version", lambda b: b[:4] + b"\x07\x00" + b[6:], "schedule module version 7; this runtime reads version 1"),
    ("truncated", lambda b: b[:-9], "model.wrm is truncated"),
    ("no CMDS", lambda b: b.replace(b"CMDS", b"CMDX"), "model.wrm has no CMDS section"),
])
def test_malformed_module(page, server, sites, case, edit, message):
    name = _variant(sites, "relu_cnn", f"relu_cnn_{case.replace(' ', '_')}", edit)
    r = run_site(page, server, name, sample_inputs(relu_cnn()))
    assert r["kind"] == "model", r
    assert message in r["error"]


def test_unknown_sections_are_skipped(page, server, sites):
    def extra_section(b: bytes) -> bytes:
        return b[:16] + b"ZZZZ" + (8).to_bytes(4, "little") + b"\x01" * 8 + b[16:]

    name = _variant(sites, "relu_cnn", "relu_cnn_extra_section", extra_section)
    model = sites[1]["relu_cnn"][0]
    feeds = sample_inputs(model)
    r = run_site(page, server, name, feeds)
    check_no_error(r)
    assert_close(decode_outputs(r)["logits"], ort_run(model, feeds)[0])


def test_missing_build_folder(page, server):
    r = run_site(page, server, "no_such_model", {})
    assert r["kind"] == "model" and "manifest.json: HTTP 404" in r["error"]


def test_device_lost_and_release(page, server):
    r = evaluate(page, """async (url) => {
      const w = await import(url + 'webiree.js');
      const s = await w.InferenceSession.create(url);
      const feeds = {image: new w.Tensor('float32', new Float32Array(3 * 16 * 16), [1, 3, 16, 16])};
      const ok = await s.run(feeds);
      s.device.destroy();
      await s.device.lost;
      const lost = await s.run(feeds).then(() => 'ran', (e) => e.message);
      const s2 = await w.InferenceSession.create(url);
      await s2.release();
      const released = await s2.run(feeds).then(() => 'ran', (e) => e.message);
      return {ok: Object.keys(ok), lost, released};
    }""", server + "relu_cnn/")
    assert r["ok"] == ["logits", "features"]
    assert r["lost"].startswith("the WebGPU device was lost (destroyed)")
    assert r["released"].startswith("the session was released")


def test_concurrent_runs_are_serialized(page, server, sites):
    model = sites[1]["relu_cnn"][0]
    r = evaluate(page, """async (url) => {
      const w = await import(url + 'webiree.js');
      const s = await w.InferenceSession.create(url);
      const feed = (v) => ({image: new w.Tensor('float32', new Float32Array(3 * 16 * 16).fill(v), [1, 3, 16, 16])});
      const rs = await Promise.all([0, 1, 2, 3].map((v) => s.run(feed(v))));
      await s.release();
      return rs.map((r) => Array.from(r.logits.data));
    }""", server + "relu_cnn/")
    for v, got in zip(range(4), r, strict=True):
        want = ort_run(model, {"image": np.full((1, 3, 16, 16), v, np.float32)})[0]
        assert_close(np.array(got, np.float32).reshape(1, 10), want)


def _open_demo(page, url: str, tmp_path, shot: str) -> str:
    page.goto(url)
    page.wait_for_selector("body[data-state=done], body[data-state=error]", timeout=EVAL_TIMEOUT_S * 1000)
    page.screenshot(path=str(tmp_path / shot), full_page=True)
    if page.get_attribute("body", "data-state") == "error":
        check_no_error({"error": page.inner_text("#status")})
    return page.inner_text("body")


@pytest.mark.parametrize("name", ["small_cnn", "relu_cnn"])
def test_demo_page_classifier(page, server, tmp_path, name):
    text = _open_demo(page, f"{server}{name}/", tmp_path, f"{name}.png")
    assert "top-5 of 10 classes" in page.inner_text("#outputs")
    timing = page.inner_text("#timing")
    assert "first run" in timing and "median of 10 runs" in timing
    assert "GPU time per dispatch" in page.inner_text("#profile")
    assert "Ran the sample input (sample.json)" in text
    assert float(page.get_attribute("#progress", "value")) == float(page.get_attribute("#progress", "max")) > 0
    assert page.is_visible("#image")
    if name == "relu_cnn":
        assert "segmentation mask: argmax over 8 classes" in page.inner_text("#outputs")
    assert not page.errors
    assert (tmp_path / f"{name}.png").stat().st_size > 1000


def _png(w: int, h: int) -> bytes:
    """An RGB gradient as a PNG file (zlib + CRC by hand; no imaging library needed)."""
    import struct
    import zlib

    rows = b"".join(b"\0" + bytes(v for x in range(w) for v in (x * 255 // w, y * 255 // h, 128)) for y in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_demo_page_image_upload(page, server, tmp_path):
    _open_demo(page, f"{server}relu_cnn/", tmp_path, "before.png")
    (tmp_path / "pic.png").write_bytes(_png(40, 30))
    page.evaluate("() => { document.body.dataset.state = 'picking'; }")
    page.set_input_files("#image", str(tmp_path / "pic.png"))
    page.wait_for_selector("body[data-state=done], body[data-state=error]", timeout=EVAL_TIMEOUT_S * 1000)
    assert "Ran the image pic.png" in page.inner_text("#status")
    assert page.is_visible("#preview")


def test_demo_page_token_ids(page, server, tmp_path):
    _open_demo(page, f"{server}tokens/", tmp_path, "tokens.png")
    assert page.is_visible("#ids-ids") and not page.is_visible("#image")
    page.fill("#ids-ids", "3, 1 4")
    page.evaluate("() => { document.body.dataset.state = 'typing'; }")
    page.click("#run")
    page.wait_for_selector("body[data-state=done], body[data-state=error]", timeout=EVAL_TIMEOUT_S * 1000)
    assert "token ids typed above" in page.inner_text("#status")
    got = evaluate(page, "async () => Array.from(webireeDemo.feeds.ids.data, String)")
    assert got == ["3", "1", "4", "0", "0", "0", "0", "0"]
    assert "min" in page.inner_text("#outputs")  # non-classifier outputs get summary stats


def test_demo_page_without_sample(page, server, sites, tmp_path):
    root = sites[0]
    if not (root / "relu_cnn_nosample").exists():
        shutil.copytree(root / "relu_cnn", root / "relu_cnn_nosample")
        (root / "relu_cnn_nosample" / "sample.json").unlink()
    _open_demo(page, f"{server}relu_cnn_nosample/", tmp_path, "nosample.png")
    assert "Ran a seeded random input" in page.inner_text("#status")


# ---------------------------------------------------------------- the site files (no browser)
def test_site_files(sites):
    root, built = sites
    site = root / "tokens"
    for f in ("index.html", "webiree.js", "webiree.d.ts", "sample.json"):
        assert (site / f).is_file(), f
    repo_web = Path(webiree.__file__).resolve().parents[1] / "web"
    assert (site / "webiree.js").read_bytes() == (repo_web / "webiree.js").read_bytes()
    html = (site / "index.html").read_text()
    for absolute in ('src="/', 'href="/', "http://", "https://", "fetch('/"):
        assert absolute not in html, f"index.html must use relative URLs only ({absolute})"
    sample = json.loads((site / "sample.json").read_text())
    assert [(e["name"], e["type"], e["dims"]) for e in sample["inputs"]] == [("ids", "int64", [1, 8]),
                                                                              ("mask", "bool", [1, 8])]
    ids = np.frombuffer(base64.b64decode(sample["inputs"][0]["data"]), "<i8")
    assert ids.shape == (8,) and ids.min() >= 0 and ids.max() < 10


def test_site_is_reproducible(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    webiree.compile(relu_cnn(), a)
    webiree.compile(relu_cnn(), b)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_write_site_with_sample_feeds(tmp_path, sites):
    from webiree.bundler.web import write_site

    model, res = sites[1]["tokens"]
    feeds = token_feeds()
    write_site(tmp_path, res, sample_feeds=feeds)
    entries = json.loads((tmp_path / "sample.json").read_text())["inputs"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(entries[0]["data"]), "<i8").reshape(1, 8), feeds["ids"])
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(entries[1]["data"]), "u1").reshape(1, 8), feeds["mask"])
    with pytest.raises(webiree.WebireeError, match="unknown input"):
        write_site(tmp_path, res, sample_feeds={"nope": feeds["ids"]})


def test_runtime_is_tiny():
    web = Path(webiree.__file__).resolve().parents[1] / "web"
    gz = len(gzip.compress((web / "webiree.js").read_bytes(), 9))
    # 16 KiB until it ran dynamic modules (symbols, registers, bind_dims' feed checks): about 2 KiB more;
    # token-by-token generation (its checks and step loop, docs/generation.md): about 2.7 KiB more;
    # kernel variants chosen at load (VARS rules of several conditions, the subgroup probe): 0.3 KiB more;
    # a start tier run while its variant's pipelines compile (_upgrade, two streams): 0.95 KiB more
    assert gz < 23 * 1024, f"webiree.js is {gz} bytes gzipped"


def test_module_with_subgroup_kernels(page, server, sites):
    """A build for a CPU adapter with subgroups (lavapipe's subgroup-broadcast matmul) runs and
    matches onnxruntime where the adapter guarantees subgroups of exactly 8 invocations, and is
    refused as a limits error naming the size elsewhere; the adapter in hand decides which outcome
    is asserted. Chromium's SwiftShader (the CI adapter: subgroups of exactly 4) must refuse it."""
    from webiree.testing.models import make_model
    from onnx import TensorProto, helper

    rng = np.random.default_rng(11)
    model = make_model([helper.make_node("MatMul", ["a", "w"], ["y"])],
                       [helper.make_tensor_value_info("a", TensorProto.FLOAT, [20, 64])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [20, 24])],
                       {"w": rng.standard_normal([64, 24]).astype(np.float32)})
    res = webiree.compile(model, sites[0] / "subgroup_mm", limits={"device_class": "cpu", "subgroup_size": 8})
    assert res.module.limits["subgroup_size"] == 8
    adapter = evaluate(page, """async () => {
      const a = await navigator.gpu.requestAdapter();
      return {subgroups: a.features.has('subgroups'), min: a.info.subgroupMinSize ?? null,
              max: a.info.subgroupMaxSize ?? null, architecture: a.info.architecture};
    }""")
    guaranteed = adapter["subgroups"] and adapter["min"] == adapter["max"] == 8
    feeds = sample_inputs(model)
    r = run_site(page, server, "subgroup_mm", feeds)
    if guaranteed:
        check_no_error(r)
        assert_close(decode_outputs(r)["y"], ort_run(model, feeds)[0], name="y")
    else:
        assert r.get("kind") == "limits", (adapter, r)
        assert "broadcast within subgroups of 8 invocations" in r["error"]
    if adapter["architecture"] == "swiftshader":
        assert not guaranteed and r.get("kind") == "limits", (adapter, r)


PIPELINE_DELAY_JS = """async ({url, runtime, delayMs, timeoutMs, ready}) => {
  // every pipeline resolves delayMs after the previous one (a slow compiler), or never (delayMs < 0)
  const w = await import(runtime);
  const orig = GPUDevice.prototype.createComputePipelineAsync;
  let queue = Promise.resolve();
  GPUDevice.prototype.createComputePipelineAsync = function (desc) {
    if (delayMs < 0) return new Promise(() => {});
    const p = queue.then(() => new Promise((r) => setTimeout(r, delayMs))).then(() => orig.call(this, desc));
    queue = p;
    return p;
  };
  const t0 = performance.now();
  let s = null;
  try {
    // create returns once the weights are in: the pipelines compile meanwhile and after, and the
    // first run waits for those it reaches
    s = await w.InferenceSession.create(url, {timeoutMs, startTier: false});   // cpu-sg4's pipelines only
    const created = performance.now() - t0;
    if (ready) await s.ready();      // every pipeline created: the run then records all in one go
    const readyMs = performance.now() - t0 - created;
    const feeds = Object.fromEntries(s.inputMetadata.map((m) => [m.name,
      new w.Tensor('float32', new Float32Array(m.shape.reduce((a, b) => a * b, 1)), m.shape)]));
    const submit = GPUQueue.prototype.submit;
    let submits = 0;
    GPUQueue.prototype.submit = function (b) { submits++; return submit.call(this, b); };
    let out;
    try { out = await s.run(feeds); } finally { GPUQueue.prototype.submit = submit; }
    return {ok: true, ms: performance.now() - t0, created, readyMs, submits, outputs: Object.keys(out).length};
  } catch (e) {
    return {error: String(e.message), kind: e.kind ?? null};
  } finally {
    GPUDevice.prototype.createComputePipelineAsync = orig;
    await s?.release();
  }
}"""


def test_pipeline_timeout_is_about_progress(page, server, sites):
    """Pipelines that finish one after another, each within the timeout, never time out even
    when all of them take longer than it; pipelines that never finish fail the first run with a
    clear error. create() does not wait for them (they compile in the background); ready() does."""
    from webiree.module.format import select_variant

    args = {"url": f"{server}small_cnn/", "runtime": f"{server}relu_cnn/webiree.js"}
    n = len(select_variant(sites[1]["small_cnn"][1].module, "cpu-sg4").executables)   # SwiftShader's variant
    # 4 s: SwiftShader takes a second or two for the CPU variants' register-blocked or subgroup 1x1
    # conv alone (more on a loaded machine); 0.6 s a pipeline makes all of them longer than that
    slow = evaluate(page, PIPELINE_DELAY_JS, {**args, "delayMs": 600, "timeoutMs": 4000, "ready": False})
    assert slow.get("ok") and slow["outputs"] == 1, slow
    assert n >= 7 and slow["ms"] > 4000, (n, slow)     # longer in all than the timeout
    assert slow["created"] < 600 * n, slow              # create did not wait for all of them
    # the run submitted what it could record while later pipelines were still compiling
    assert slow["submits"] > 1, slow
    # session.ready() waits for every pipeline; the run after it submits once
    warm = evaluate(page, PIPELINE_DELAY_JS, {**args, "delayMs": 300, "timeoutMs": 4000, "ready": True})
    assert warm.get("ok") and warm["outputs"] == 1, warm
    assert warm["readyMs"] > 300 * (n - 2) and warm["submits"] == 1, (n, warm)
    hung = evaluate(page, PIPELINE_DELAY_JS, {**args, "delayMs": -1, "timeoutMs": 1500, "ready": False})
    assert hung["kind"] == "device", hung
    assert f"no pipeline finished compiling for 1500 ms (0 of {n} ready)" in hung["error"]


@pytest.mark.slow
def test_vgg19_of_the_light_zoo(page, server, sites):
    """onnx's light VGG-19 (575 MB of weights, every one a ConstantOfShape fill; fc6 alone 411 MB,
    above WebGPU's default maxBufferSize): the fills are computed where they are read
    (compiler/lowering.py is_large_fill), so the site ships a 66 KB weights.bin, and the page's
    probabilities and logits match onnxruntime's. CPU kernels alone (limits="cpu") keep
    SwiftShader's pipeline compilation short; the variants are tested above."""
    import onnx

    from .test_light_zoo import LIGHT, _with_logits

    model = _with_logits(onnx.load(LIGHT / "light_vgg19.onnx"))
    res = webiree.compile(model, sites[0] / "vgg19", limits="cpu")
    assert res.manifest["sizes"]["weights_bytes"] < 1 << 20
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    inits = {i.name for i in model.graph.initializer}
    (inp,) = [i.name for i in model.graph.input if i.name not in inits]
    feeds = {inp: x}
    ref = dict(zip([o.name for o in model.graph.output], ort_run(model, feeds), strict=True))
    r = run_site(page, server, "vgg19", feeds, timeout_s=240, options={"timeoutMs": 200_000})
    check_no_error(r)
    got = decode_outputs(r)
    assert sorted(got) == sorted(ref) and len(got) == 2, (list(got), list(ref))
    for k in ref:
        assert_close(got[k], ref[k], 1e-4, f"vgg19:{k}")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["parts_of_300kb", "parts_of_139mb"])
def test_a_constant_larger_than_a_binding_in_chromium(page, server, sites, case):
    """A token embedding over the binding limit (compiler/passes.py split_large_constants) read in
    parts by Gather, MatMul and Gemm: a 300 KB one under a 128 KiB limit (three parts), and one of
    139 MB under Chromium's default 128 MiB (two parts, a 139 MB weights.bin streamed to the page)."""
    from .test_large_tensors import SMALL_BINDING, _feeds, _parts, tied_lm

    vocab, dim, seq, small = (1200, 64, 8, True) if case == "parts_of_300kb" else (34000, 1024, 4, False)
    model = tied_lm(vocab, dim, seq=seq, transpose=small)
    res = webiree.compile(model, sites[0] / case, limits=SMALL_BINDING if small else "cpu")
    assert _parts(res), "no constant was cut into parts"
    feeds = _feeds(vocab, seq=seq, rows=(0, 511, 512, 1024, vocab - 1) if small else (0, 32767, 32768, vocab - 1))
    ref = dict(zip([o.name for o in model.graph.output], ort_run(model, feeds), strict=True))
    r = run_site(page, server, case, feeds, timeout_s=240, options={"timeoutMs": 200_000})
    check_no_error(r)
    got = decode_outputs(r)
    assert sorted(got) == sorted(ref) and len(got) == (3 if small else 2), (list(got), list(ref))
    for k in ref:
        assert_close(got[k], ref[k], name=f"{case}:{k}", elementwise=True)
