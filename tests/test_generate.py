"""Generation (issue #18 item 3): a GPT-2 decoder from transformers (random seeded weights, a small
config, opset 17, KV cache inputs and outputs, dynamic batch / sequence / past axes) built once with
the generation head (webiree.compile(..., generation=16)) generates token by token with the KV
cache on the GPU and each token picked there, natively, in webiree.js and in Pyodide.

References: onnxruntime (CPU) runs the exported decoder (without the head) step by step with its
own past, starting from an empty past as merged decoders are run; greedy = argmax of its logits.
Sampled tokens (top-k, seeded) are checked against onnxruntime teacher-forced on them: each must be
among the k largest logits at its step.
"""

from __future__ import annotations

import gc

import numpy as np
import onnx
import pytest

import webiree
from webiree import FeedError, ModelError
from webiree.bundler import pyodide as P
from webiree.compiler.driver import compile_model
from webiree.module import generation as G
from webiree.testing.models import GPT2_DIMS, export_gpt2_with_past

from .browser_util import write_blank_page
from .test_browser import evaluate

TOP_K = 16               # the build's top-k limit
PROMPT = [5, 17, 99, 3, 42]
HEADS, HEAD_DIM, LAYERS = 4, 16, 2


# ---------------------------------------------------------------- fixtures and references
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(root, onnx path): root/gpt2/ is the build with the generation head, root/pyodide/ the shared Pyodide."""
    root = tmp_path_factory.mktemp("gen")
    path = root / "gpt2.onnx"
    export_gpt2_with_past(path)
    webiree.compile(path, root / "gpt2", dims=GPT2_DIMS, generation=TOP_K)
    write_blank_page(root)
    return root, path


@pytest.fixture(scope="module")
def site_root(built):
    return built[0]


@pytest.fixture(scope="module")
def ort_sess(built):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(built[1]), so, providers=["CPUExecutionProvider"])


@pytest.fixture
def sess(built):
    s = webiree.InferenceSession(built[0] / "gpt2")
    yield s
    s.close()


def ort_logits(ort_sess, prompt, fed):
    """onnxruntime's last-position logits at each step: step 0 runs the prompt over an empty past,
    step i feeds fed[i - 1] with the past of the steps before (len(fed) + 1 steps)."""
    past = [np.zeros((1, HEADS, 0, HEAD_DIM), np.float32) for _ in range(2 * LAYERS)]
    ids, total, out = np.array([prompt], np.int64), len(prompt), []
    for i in range(len(fed) + 1):
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.arange(total - ids.shape[1], total, dtype=np.int64)[None]}
        feeds.update({f"past_key_values.{j // 2}.{'value' if j % 2 else 'key'}": p for j, p in enumerate(past)})
        logits, *past = ort_sess.run(None, feeds)
        out.append(logits[0, -1])
        if i < len(fed):
            ids, total = np.array([[fed[i]]], np.int64), total + 1
    return out


def ort_greedy(ort_sess, prompt, n):
    """onnxruntime's greedy decode of n tokens, and the smallest gap between the top two logits."""
    tokens, gaps = [], []
    past = [np.zeros((1, HEADS, 0, HEAD_DIM), np.float32) for _ in range(2 * LAYERS)]
    ids, total = np.array([prompt], np.int64), len(prompt)
    for _ in range(n):
        feeds = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64),
                 "position_ids": np.arange(total - ids.shape[1], total, dtype=np.int64)[None]}
        feeds.update({f"past_key_values.{j // 2}.{'value' if j % 2 else 'key'}": p for j, p in enumerate(past)})
        logits, *past = ort_sess.run(None, feeds)
        last = logits[0, -1]
        top2 = np.sort(last)[-2:]
        tokens.append(int(np.argmax(last)))
        gaps.append(float(top2[1] - top2[0]))
        ids, total = np.array([[tokens[-1]]], np.int64), total + 1
    return tokens, min(gaps)


def assert_within_top_k(ort_sess, prompt, tokens, k):
    for step, (logits, t) in enumerate(zip(ort_logits(ort_sess, prompt, tokens[:-1]), tokens, strict=True)):
        kth = np.sort(logits)[-k]
        assert logits[t] >= kth - 1e-5 * np.abs(logits).max(), \
            f"step {step}: token {t} (logit {logits[t]:.5f}) is not among the {k} largest (k-th {kth:.5f})"


# ---------------------------------------------------------------- (a) greedy = onnxruntime
def test_greedy_equals_onnxruntime_over_64_steps(sess, ort_sess, capsys):
    want, gap = ort_greedy(ort_sess, PROMPT, 64)
    streamed = []
    got = sess.generate(np.array(PROMPT), 64, on_token=streamed.append)
    assert got == want and streamed == want
    assert len(set(want)) > 10           # a decode that moves, not one token repeated
    with capsys.disabled():
        print(f"\n[generate] greedy 64 tokens = onnxruntime's; smallest top-2 logit gap {gap:.4f}")
    assert sess.generate(PROMPT, 5, strategy="top-k", k=1, seed=3) == want[:5]     # top-1 sampling is greedy
    assert sess.generate(PROMPT, 0) == []


# ---------------------------------------------------------------- (b) top-k
def test_top_k_is_seeded_and_within_the_top_k(sess, ort_sess):
    a = sess.generate(PROMPT, 24, strategy="top-k", k=8, seed=1)
    assert a == sess.generate(PROMPT, 24, strategy="top-k", k=8, seed=1)
    b = sess.generate(PROMPT, 24, strategy="top-k", k=8, seed=2)
    assert a != b
    greedy, _ = ort_greedy(ort_sess, PROMPT, 24)
    assert a != greedy and b != greedy
    assert_within_top_k(ort_sess, PROMPT, a, 8)
    assert_within_top_k(ort_sess, PROMPT, b, 8)
    c = sess.generate(PROMPT, 24, strategy="top-k", k=3, seed=7, temperature=0.7)
    assert_within_top_k(ort_sess, PROMPT, c, 3)
    d = sess.generate(PROMPT, 24, strategy="top-k", k=TOP_K, seed=7, temperature=2.0)
    assert_within_top_k(ort_sess, PROMPT, d, TOP_K)
    assert len(set(d)) > len(set(c))     # a hotter, wider sampler wanders more


# ---------------------------------------------------------------- (c) per-step traffic
def test_per_step_host_gpu_traffic_is_the_token_id(sess, monkeypatch, capsys):
    """Bytes read back and written per step after the first: 4 read (the token id); 4 written (the
    token id) plus the symbols' values for the kernels' dims buffer (4 bytes a symbol: the
    sequence, past and total lengths). The first step writes the prompt, its mask and positions,
    k, temperature and the seed's state."""
    reads, writes = [], []
    real_read, real_write = sess.driver.read_buffer, sess.driver.write_buffer
    monkeypatch.setattr(sess.driver, "read_buffer", lambda b, off, n: reads.append(n) or real_read(b, off, n))
    monkeypatch.setattr(sess.driver, "write_buffer", lambda b, off, d: writes.append(len(d)) or real_write(b, off, d))
    n_params = sum(b.kind == "params" for b in sess.module.buffers)
    dims_bytes = 4 * len(sess.module.symbols) * n_params
    assert len(sess.module.symbols) == 3
    per_step = []
    for token in sess.generate_stream(PROMPT, 12, strategy="top-k", k=4, seed=5):
        per_step.append((sum(reads), sum(writes), token))
        reads.clear()
        writes.clear()
    first, rest = per_step[0], per_step[1:]
    n = len(PROMPT)
    assert first[0] == 4 and first[1] == 3 * 4 * n + 3 * 4 + dims_bytes
    assert [(r, w) for r, w, _ in rest] == [(4, 4 + dims_bytes)] * 11
    with capsys.disabled():
        print(f"\n[generate] per step: {rest[0][0]} bytes read back, {rest[0][1]} written "
              f"(token id 4 + dims {dims_bytes}); first step {first[0]} read, {first[1]} written")


# ---------------------------------------------------------------- (d) no leaks
def test_no_buffer_growth_over_1000_steps(built, ort_sess):
    """8 generations of 125 tokens (a 3-token prompt fills the 128 positions) = 1,000 steps: the
    live GPU buffers are the same after every step of a generation and back to the session's own
    after each; each generation equals onnxruntime's greedy decode."""
    from webiree.hal_webgpu.wgpu_driver import WgpuDriver

    gc.collect()
    process0 = WgpuDriver.process_live_buffers()
    sess = webiree.InferenceSession(built[0] / "gpt2")
    base = sess.driver.live_buffers
    steps = 0
    for round_ in range(8):
        prompt = [round_ * 13 % 128, 7, (round_ * 31 + 1) % 128]
        got, counts = [], set()
        for token in sess.generate_stream(prompt, 125):
            got.append(token)
            counts.add(sess.driver.live_buffers)
            steps += 1
        assert counts == {base + 2 + 2 * LAYERS + 3}, counts   # k, temperature; present.*, rng, mask, positions
        assert sess.driver.live_buffers == base
        assert got == ort_greedy(ort_sess, prompt, 125)[0], f"round {round_}"
    assert steps == 1000
    stream = sess.generate_stream(PROMPT, 20)      # a generation left early frees its tensors too
    assert [next(stream) for _ in range(3)] == ort_greedy(ort_sess, PROMPT, 3)[0]
    stream.close()
    assert sess.driver.live_buffers == base
    sess.close()
    assert sess.driver.live_buffers == 0 and WgpuDriver.process_live_buffers() == process0


# ---------------------------------------------------------------- errors
def test_what_generation_refuses(built, sess, tmp_path):
    with pytest.raises(FeedError, match=r"a prompt of 100 tokens and 40 new tokens do not fit this build \(the last step"):
        sess.generate(list(range(100)), 40)
    with pytest.raises(FeedError, match="k=17 is above the build's top-k limit of 16"):
        sess.generate(PROMPT, 4, strategy="top-k", k=17)
    with pytest.raises(FeedError, match="unknown strategy 'beam'"):
        sess.generate(PROMPT, 4, strategy="beam")
    with pytest.raises(FeedError, match="the prompt is empty"):
        sess.generate([], 4)
    with pytest.raises(FeedError, match="temperature must be > 0"):
        sess.generate(PROMPT, 4, strategy="top-k", k=2, temperature=0)
    plain = compile_model(str(built[1]), dims=GPT2_DIMS)                 # built without the head
    with webiree.InferenceSession.from_module(plain.module, plain.weights) as s:
        with pytest.raises(ModelError, match="this build cannot generate: it has no generation head"):
            s.generate(PROMPT, 4)
    greedy_only = compile_model(str(built[1]), dims=GPT2_DIMS, generation=0)
    assert greedy_only.module.info[G.TOP_K_INFO] == 0
    with webiree.InferenceSession.from_module(greedy_only.module, greedy_only.weights) as s:
        assert s.generate(PROMPT, 6) == sess.generate(PROMPT, 6)
        with pytest.raises(FeedError, match="greedy only"):
            s.generate(PROMPT, 4, strategy="top-k", k=2)
    model = onnx.load(str(built[1]))
    model.graph.input.append(onnx.helper.make_tensor_value_info("token_type_ids", onnx.TensorProto.INT64, [1, "sequence"]))
    with pytest.raises(ModelError, match=r"inputs \['token_type_ids'\] are not ones generation knows how to feed"):
        compile_model(model, dims=GPT2_DIMS, generation=True)
    from webiree.testing.models import mlp
    with pytest.raises(ModelError, match=r"the model cannot generate: it has no input_ids input; it has no "
                                         r"past_key_values.*inputs \['x'\] are not ones generation knows"):
        compile_model(mlp(), generation=True)


# ---------------------------------------------------------------- (e) webiree.js and Pyodide
GENERATE_JS = """async ({url, prompt, topK}) => {
  const w = await import(url + 'webiree.js');
  const session = await w.InferenceSession.create(url);
  const out = {};
  try {
    out.readback = [];
    out.greedy = await session.generate(prompt, {maxNewTokens: 16, onToken: () => { out.readback.push(session.lastReadbackBytes); }});
    out.sampled = [];
    for await (const t of session.generateStream(prompt, {maxNewTokens: 12, strategy: 'top-k', k: topK, seed: 1})) out.sampled.push(t);
    out.early = [];
    for await (const t of session.generateStream(prompt, {maxNewTokens: 10})) { out.early.push(t); if (out.early.length === 3) break; }
    out.resident = session._resident.size;      // every GPU tensor of the generations freed
    try { await session.generate(prompt, {maxNewTokens: 4, strategy: 'top-k', k: 99}); } catch (e) { out.error = [e.kind, e.message]; }
  } catch (e) {
    out.failed = String(e.message);
  } finally {
    await session.release();
  }
  return out;
}"""


@pytest.mark.browser
def test_webiree_js_generates_like_onnxruntime(page, server, sess, ort_sess):
    got = evaluate(page, GENERATE_JS, {"url": f"{server}gpt2/", "prompt": PROMPT, "topK": 8}, timeout_s=300)
    assert "failed" not in got, got
    want = ort_greedy(ort_sess, PROMPT, 16)[0]
    assert got["greedy"] == want
    assert got["readback"] == [4] * 16
    assert got["sampled"] == sess.generate(PROMPT, 12, strategy="top-k", k=8, seed=1)   # the same sampler
    assert_within_top_k(ort_sess, PROMPT, got["sampled"], 8)
    assert got["early"] == want[:3] and got["resident"] == 0
    assert got["error"] == ["feed", "k=99 is above the build's top-k limit of 16 (use k <= 16, or rebuild with "
                                    "generation=99)"]
    assert not page.errors


GENERATE_PY = """
import json
import webiree_runtime as wr
arg = json.loads(ARG)
sess = await wr.InferenceSession.create("./")
try:
    streamed = []
    greedy = await sess.generate(arg["prompt"], 8, on_token=streamed.append)
    sampled = [t async for t in sess.generate_stream(arg["prompt"], 8, strategy="top-k", k=8, seed=1)]
    try:
        await sess.generate(arg["prompt"], 4, strategy="top-k", k=99)
        error = None
    except wr.FeedError as e:
        error = str(e)
    result = {"greedy": greedy, "streamed": streamed, "sampled": sampled, "error": error,
              "resident": len(sess.interp._resident)}
finally:
    await sess.release()
json.dumps(result)
"""


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_pyodide_generates_like_onnxruntime(browser, server, site_root, sess, ort_sess):
    from .test_pyodide import open_python_page, py

    P.copy_pyodide(site_root / P.PYODIDE_DIR)         # python.html finds ../pyodide/
    ctx, pg = open_python_page(browser, server + "gpt2/python.html")
    try:
        assert pg.get_attribute("body", "data-state") == "ready", pg.inner_text("#status")
        got = py(pg, GENERATE_PY, {"prompt": PROMPT})
        assert "traceback" not in got, got
        want = ort_greedy(ort_sess, PROMPT, 8)[0]
        assert got["greedy"] == want and got["streamed"] == want
        assert got["sampled"] == sess.generate(PROMPT, 8, strategy="top-k", k=8, seed=1)
        assert got["error"].startswith("k=99 is above the build's top-k limit of 16")
        assert got["resident"] == 0
        assert not pg.errors
    finally:
        ctx.close()
