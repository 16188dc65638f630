"""Pages by task (issue #18 item 4): `webiree build` picks the site's page from the model's inputs and
outputs or from --task, and the two text pages work end to end in headless Chromium.

The demos of demo/build.py are built here (build_embedding, build_generation: a random-weight BERT
with a WordPiece tokenizer and a random-weight GPT-2 with a byte-level BPE tokenizer, both tokenizers
trained in code by webiree.testing.text_models), served by the project's server and driven by
Playwright: text is typed into the page, the button clicked, and what the page shows is checked
against the Python `tokenizers` library (the ids) and onnxruntime (CPU) run on those ids. Every wait
on the page has a timeout (and the session's own GPU operations time out after 30 s), so a hang
fails fast. WEBIREE_UPDATE_SCREENSHOTS=1 refreshes demo/screenshots/{embedding,generation}.png.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import webiree
from webiree import ModelError
from webiree.testing.models import make_model, mlp, small_cnn

from .conftest import assert_close
from .test_browser import EVAL_TIMEOUT_S
from .test_demos import screenshot
from .test_generate import assert_within_top_k, ort_greedy

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
WAIT_MS = EVAL_TIMEOUT_S * 1000
N_NEW = 12
PROMPT = "Once upon a time, a small dragon"
PAIRS = [
    ("A man is playing a guitar on the stage.", "Someone plays music in front of a crowd!"),
    # the first is longer than the build's 128 tokens: cut to 128, [CLS] and [SEP] kept
    (" ".join(["The little robot walked along the quiet river and talked about music, books and tea."] * 12),
     "Café naïve: the cat slept on the warm roof."),
]


def _demo_build():
    spec = importlib.util.spec_from_file_location("webiree_demo_build", ROOT / "demo" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ort(path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def site_root(tmp_path_factory):
    return tmp_path_factory.mktemp("taskpages")


@pytest.fixture(scope="module")
def demos(site_root):
    build = _demo_build()
    return {"embedding": build.build_embedding(site_root), "generation": build.build_generation(site_root)}


@pytest.fixture(scope="module")
def hf(demos):
    """The Python `tokenizers` library's tokenizers, the reference for the page's ids."""
    from tokenizers import Tokenizer
    return {k: Tokenizer.from_file(str(v["tokenizer"])) for k, v in demos.items()}


def open_page(browser, url: str):
    ctx = browser.new_context(viewport={"width": 900, "height": 800})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(url)
    pg.wait_for_selector("body[data-state=ready], body[data-state=error]", timeout=WAIT_MS)
    assert pg.get_attribute("body", "data-state") == "ready", pg.inner_text("#status")
    return ctx, pg


def click_and_wait(pg, button: str) -> None:
    """Click; wait (with a timeout) until the page has finished one more run."""
    before = pg.evaluate("() => webireeDemo.runs")
    pg.click(button)
    pg.wait_for_function(f"() => webireeDemo.runs > {before} || document.body.dataset.state === 'error'", timeout=WAIT_MS)
    assert pg.get_attribute("body", "data-state") == "done", pg.inner_text("#status")


# ---------------------------------------------------------------- the embedding page
def ort_embedding(sess, ids: list[int]) -> np.ndarray:
    """onnxruntime's last_hidden_state for one sentence, mean-pooled over the mask, L2-normalized."""
    x = np.array([ids], np.int64)
    (hidden,) = sess.run(["last_hidden_state"], {"input_ids": x, "attention_mask": np.ones_like(x),
                                                 "token_type_ids": np.zeros_like(x)})
    v = hidden[0].astype(np.float64).mean(axis=0)
    return v / np.linalg.norm(v)


def test_embedding_page(browser, server, demos, hf, tmp_path):
    d = demos["embedding"]
    assert d["task"] == {"name": "text-embedding", "max_length": 128, "padded": False, "output": "last_hidden_state",
                         "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                    "token_type_ids": "token_type_ids"}, "pooling": "mean", "normalize": True}
    tok = hf["embedding"]
    tok.enable_truncation(max_length=128)
    sess = _ort(d["onnx"])
    ctx, pg = open_page(browser, server + "embedding/")
    try:
        assert "[CLS]" in pg.inner_text("#method") and "128" in pg.inner_text("#method")
        for i, (a, b) in enumerate(PAIRS):
            pg.fill("#text-a", a)
            pg.fill("#text-b", b)
            click_and_wait(pg, "#embed")
            got = pg.evaluate("() => webireeDemo.results")
            refs = []
            for key, text in (("a", a), ("b", b)):
                want_ids = tok.encode(text).ids
                assert got[key]["ids"] == want_ids, f"{text[:40]!r}: page ids differ from the tokenizers library's"
                ref = ort_embedding(sess, want_ids)
                emb = np.array(got[key]["embedding"])
                assert_close(emb, ref, name=f"embedding {key}", elementwise=True)
                assert abs(np.linalg.norm(emb) - 1) < 1e-6
                shown = [float(v) for v in pg.inner_text(f"#values-{key}").split("…")[0].strip(", ").split(",")]
                np.testing.assert_allclose(shown, ref[:8], atol=6e-5)
                refs.append(ref)
            sim = float(refs[0] @ refs[1])
            assert abs(got["similarity"] - sim) < 1e-5, (got["similarity"], sim)
            assert abs(float(pg.inner_text("#similarity")) - sim) < 6e-5
            if i == 0:
                screenshot(pg, tmp_path, "embedding.png")   # WEBIREE_UPDATE_SCREENSHOTS=1: demo/screenshots/
        assert len(got["a"]["ids"]) == 128 and got["a"]["untruncated"] > 128   # the long sentence was cut
        assert f"(cut from {got['a']['untruncated']})" in pg.inner_text("#tokens-a")
        assert not pg.errors
    finally:
        ctx.close()


# ---------------------------------------------------------------- the generation page
def generate_on_page(pg, prompt: str, n: int, strategy: str = "greedy", k: int = 8, seed: int = 0, stop_eos=False):
    pg.fill("#prompt", prompt)
    pg.fill("#max-new", str(n))
    pg.select_option("#strategy", strategy)
    if strategy == "top-k":
        pg.fill("#k", str(k))
        pg.fill("#seed", str(seed))
    pg.set_checked("#stop-eos", stop_eos)
    click_and_wait(pg, "#generate")
    ids = json.loads(pg.get_attribute("#token-ids", "data-ids"))
    state = pg.evaluate("() => ({promptIds: webireeDemo.promptIds, ids: webireeDemo.ids, stats: webireeDemo.stats, "
                        "options: webireeDemo.options})")
    assert state["ids"] == ids
    return ids, state


def test_generation_page_greedy(browser, server, demos, hf, tmp_path):
    d = demos["generation"]
    assert d["task"] == {"name": "text-generation", "max_length": 129, "max_prompt": 128, "top_k": 64}
    tok = hf["generation"]
    prompt_ids = tok.encode(PROMPT).ids
    want, gap = ort_greedy(_ort(d["onnx"]), prompt_ids, N_NEW)
    assert gap > 1e-2 and len(set(want)) > N_NEW // 2, (gap, want)   # no near-ties; a decode that moves
    ctx, pg = open_page(browser, server + "generation/")
    try:
        assert pg.inner_text("#eos-token") == "<|endoftext|>"
        ids, state = generate_on_page(pg, PROMPT, N_NEW)
        assert state["promptIds"] == prompt_ids, "page ids differ from the tokenizers library's"
        assert ids == want, f"page {ids} != onnxruntime's greedy decode {want}"
        assert state["options"] == {"maxNewTokens": N_NEW}
        # the text shown is the decoded ids (as the tokenizers library decodes them)
        full, head = tok.decode(prompt_ids + ids), tok.decode(prompt_ids)
        assert full.startswith(head)
        assert pg.text_content("#generated") == full[len(head):]
        assert pg.text_content("#prompt-text") == head
        stats = state["stats"]
        assert stats["tokens"] == N_NEW and stats["tokensPerSecond"] > 0 and 0 < stats["firstTokenMs"] <= stats["totalMs"]
        shown = pg.inner_text("#stats")
        assert f"{N_NEW} tokens in" in shown and f"{stats['tokensPerSecond']:.1f} tokens/s" in shown, shown
        screenshot(pg, tmp_path, "generation.png")
        assert not pg.errors
    finally:
        ctx.close()


def test_generation_page_top_k(browser, server, demos, hf):
    """Seeded top-k on the page = the native runtime's with the same seed (the sampler runs in the
    build's kernels), each token within onnxruntime's 8 largest logits (teacher-forced); the page stops
    at <|endoftext|> as the native generate(eos_token_id=0) does."""
    d = demos["generation"]
    prompt_ids = hf["generation"].encode(PROMPT).ids
    sess = webiree.InferenceSession(d["onnx"].parent / "generation")
    try:
        want = {seed: sess.generate(prompt_ids, N_NEW, strategy="top-k", k=8, seed=seed, eos_token_id=0)
                for seed in (1, 2)}
    finally:
        sess.close()
    assert want[1] != want[2]
    ctx, pg = open_page(browser, server + "generation/")
    try:
        for seed in (1, 2):
            ids, state = generate_on_page(pg, PROMPT, N_NEW, "top-k", k=8, seed=seed, stop_eos=True)
            assert state["options"] == {"maxNewTokens": N_NEW, "strategy": "top-k", "k": 8, "seed": seed, "eosTokenId": 0}
            assert ids == want[seed], f"seed {seed}: page {ids} != native {want[seed]}"
            assert_within_top_k(_ort(d["onnx"]), prompt_ids, ids, 8)
        assert not pg.errors
    finally:
        ctx.close()


# ---------------------------------------------------------------- picking the task
def segmenter() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    return make_model([helper.make_node("Conv", ["image", "w"], ["mask"], pads=[1, 1, 1, 1])],
                      [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 4, 8, 8])],
                      {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32)}, name="segmenter")


def test_task_is_picked_from_the_model(demos, tmp_path):
    """Without --task: the text pages where the model and a tokenizer fit them, today's generic page
    otherwise (image-classification / image-segmentation / generic recorded in the manifest)."""
    emb, gen = demos["embedding"], demos["generation"]
    from webiree.testing.models import GPT2_DIMS
    from webiree.testing.text_models import EMBEDDER_DIMS

    cases = {
        "bert+tokenizer": (emb["onnx"], {"dims": EMBEDDER_DIMS, "tokenizer": emb["tokenizer"]}, "text-embedding"),
        "bert": (emb["onnx"], {"dims": {"batch": 1, "sequence": 16}}, "generic"),
        "gpt2+generation+tokenizer": (gen["onnx"], {"dims": GPT2_DIMS, "generation": 0, "tokenizer": gen["tokenizer"]},
                                      "text-generation"),
        "gpt2+generation": (gen["onnx"], {"dims": GPT2_DIMS, "generation": 0}, "generic"),
        "cnn": (small_cnn(), {}, "image-classification"),
        "segmenter": (segmenter(), {}, "image-segmentation"),
        "mlp+tokenizer": (mlp(), {"tokenizer": emb["tokenizer"]}, "generic"),
    }
    for name, (model, kw, task) in cases.items():
        out = tmp_path / name
        res = webiree.compile(model, out, validate=False, **kw)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["task"]["name"] == task == res.manifest["task"]["name"], name
        index = (out / "index.html").read_text()
        if task.startswith("text-"):
            assert ("Sentence embeddings" if task == "text-embedding" else "Text generation") in index
            assert "token-rows" in (out / "generic.html").read_text()      # today's page stays as generic.html
        else:
            assert "token-rows" in index and not (out / "generic.html").exists(), name
    # the fixed-length build pads: recorded for the page
    res = webiree.compile(emb["onnx"], tmp_path / "fixed", validate=False, dims={"batch": 1, "sequence": 16},
                          tokenizer=emb["tokenizer"])
    assert res.manifest["task"]["padded"] is True and res.manifest["task"]["max_length"] == 16
    # a rebuild of the same folder as another task leaves no stale generic.html
    webiree.compile(small_cnn(), tmp_path / "fixed", validate=False)
    assert not (tmp_path / "fixed" / "generic.html").exists()


def test_task_that_does_not_fit_is_one_error(demos, tmp_path):
    emb, gen = demos["embedding"], demos["generation"]
    from webiree.testing.text_models import EMBEDDER_DIMS

    cases = [
        # (model, build options, task, words the message must hold)
        (mlp(), {"tokenizer": emb["tokenizer"]}, "text-embedding",
         ["--task text-embedding does not fit this model: it has no input input_ids", "input_ids [batch, sequence]",
          "last_hidden_state"]),
        (emb["onnx"], {"dims": EMBEDDER_DIMS}, "text-embedding", ["--task text-embedding needs --tokenizer"]),
        (emb["onnx"], {"dims": EMBEDDER_DIMS, "tokenizer": emb["tokenizer"]}, "text-generation",
         ["--task text-generation needs --generation", "built with --generation"]),
        (gen["onnx"], {"dims": {"batch": 1, "sequence": (1, 8), "past_sequence": (0, 7), "total_sequence": (1, 8)},
                       "tokenizer": gen["tokenizer"]}, "text-embedding",
         ["does not fit this model: it has other inputs ['position_ids', 'past_key_values.0.key'"]),
        (emb["onnx"], {"dims": EMBEDDER_DIMS, "tokenizer": emb["tokenizer"]}, "image-classification",
         ["--task image-classification does not fit this model: it has 3 inputs, not one image",
          "one float32 input [1, 3, H, W]"]),
        (small_cnn(), {}, "image-segmentation", ["it has no float32 output [1, C, H', W']"]),
    ]
    for model, kw, task, words in cases:
        with pytest.raises(ModelError) as e:
            webiree.compile(model, tmp_path / "x", validate=False, task=task, **kw)
        for w in words:
            assert w in str(e.value), (task, str(e.value))
        assert e.value.hint
    with pytest.raises(ModelError, match="unknown task 'chat'"):
        webiree.compile(mlp(), tmp_path / "x", task="chat")
    # the CLI: one line and exit 2
    onnx.save(small_cnn(), tmp_path / "cnn.onnx")
    p = subprocess.run([sys.executable, "-m", "webiree.cli", "build", str(tmp_path / "cnn.onnx"), "--out",
                        str(tmp_path / "cli"), "--task", "text-embedding", "--tokenizer", str(emb["tokenizer"]),
                        "--no-validate"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith("webiree: error: --task text-embedding does not fit this model: it has no input "
                               "input_ids; the task needs an encoder"), p.stderr
    assert len(lines) == 2 and lines[1].startswith("  hint: the model has inputs [image float32 [1, 3, 32, 32]]")
    p = subprocess.run([sys.executable, "-m", "webiree.cli", "build", str(tmp_path / "cnn.onnx"), "--out",
                        str(tmp_path / "cli"), "--no-validate"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "page: image-classification" in p.stdout, p.stdout + p.stderr
