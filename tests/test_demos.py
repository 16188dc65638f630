"""The demos (demo/, built by demo/build.py) in headless Chromium.

One temporary root holds what `python demo/build.py all OUT` writes: digits/
(the draw-a-digit page, trained here: about 10 s), digits/python.html (the
Pyodide cell), pyodide/ and bench/ (MobileNetV2 + MiniLM from the seed models).
It is served by the project's server and driven by Playwright, as in
tests/test_browser.py.

Screenshots go to the test's tmp folder; with WEBIREE_UPDATE_SCREENSHOTS=1
they also replace demo/screenshots/*.png (what demo/README.md shows).
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from .conftest import assert_close, ort_run
from .browser_util import serving
from .test_browser import EVAL_TIMEOUT_S

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "demo" / "screenshots"
BOOT_TIMEOUT_S = 180


def _demo_build():
    spec = importlib.util.spec_from_file_location("webiree_demo_build", ROOT / "demo" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def screenshot(page, tmp_path, name: str, **kw) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), **kw)
    assert path.stat().st_size > 1000
    if os.environ.get("WEBIREE_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(exist_ok=True)
        shutil.copyfile(path, SCREENSHOTS / name)
    return path


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("demos")


@pytest.fixture(scope="module")
def digits(root):
    """The digits site (trained and compiled here) and train.py's info (accuracy, test images)."""
    import sklearn  # noqa: F401  (set-up installs both: scripts/setup.sh --models)
    import torch  # noqa: F401
    build = _demo_build()
    info = build.build_digits(root)
    (root / "index.html").write_text(build.INDEX)
    assert info["test_accuracy"] >= 0.97, info["test_accuracy"]
    return info


@pytest.fixture(scope="module")
def server(root):
    with serving(root) as url:
        yield url


def new_page(browser, url: str, ready: str, timeout_s: float = EVAL_TIMEOUT_S, **ctx_kw):
    ctx = browser.new_context(**ctx_kw)
    pg = ctx.new_page()
    pg.errors, pg.console = [], []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.on("console", lambda m: pg.console.append(m.text))
    pg.goto(url)
    pg.wait_for_selector(f"body[data-state={ready}], body[data-state=error]", timeout=timeout_s * 1000)
    assert pg.get_attribute("body", "data-state") == ready, pg.inner_text("#status")
    return ctx, pg


@pytest.fixture(scope="module")
def digits_page(browser, server, digits):
    ctx, pg = new_page(browser, server + "digits/", "ready", viewport={"width": 800, "height": 700})
    yield pg
    ctx.close()


# ---------------------------------------------------------------- the digit pad
def draw(page, strokes) -> dict:
    """Clear the pad, draw strokes ([[(x, y), ...], ...] in pad pixels, 0..280) with the mouse,
    and return digitsDemo once the prediction after the last stroke is shown."""
    page.click("#clear")
    box = page.locator("#pad").bounding_box()
    sx, sy = box["width"] / 280, box["height"] / 280
    before = page.evaluate("() => digitsDemo.runs")
    for stroke in strokes:
        x, y = stroke[0]
        page.mouse.move(box["x"] + x * sx, box["y"] + y * sy)
        page.mouse.down()
        for x, y in stroke[1:]:
            page.mouse.move(box["x"] + x * sx, box["y"] + y * sy, steps=3)
        page.mouse.up()
    # one prediction per stroke at most (strokes that land while one runs are merged into the next)
    page.wait_for_function(f"() => digitsDemo.runs > {before} && !digitsDemo.busy && !digitsDemo.queued "
                           "&& ['done', 'error'].includes(document.body.dataset.state)", timeout=EVAL_TIMEOUT_S * 1000)
    assert page.get_attribute("body", "data-state") == "done", page.inner_text("#status")
    return page.evaluate("() => ({input: digitsDemo.input, probs: digitsDemo.probs, predicted: digitsDemo.predicted})")


def image_strokes(img) -> list:
    """An 8x8 image (0..16) as strokes: each row's runs of cells >= 6 as one horizontal stroke
    through the cells' centres (a single cell: a short dash), 35 pad pixels a cell."""
    strokes = []
    for r, row in enumerate(img):
        c = 0
        while c < 8:
            if row[c] >= 6:
                e = c
                while e + 1 < 8 and row[e + 1] >= 6:
                    e += 1
                y = r * 35 + 17.5
                strokes.append([(c * 35 + 12, y), (e * 35 + 23, y)])
                c = e + 1
            else:
                c += 1
    return strokes


def check_prediction(got, digits_dir: Path, want: int):
    """The page's probabilities match onnxruntime on the page's own 8x8 input, and argmax is `want`."""
    import onnx

    x = np.array(got["input"], np.float32).reshape(1, 1, 8, 8)
    (ref,) = ort_run(onnx.load(str(digits_dir / "digits.onnx")), {"pixels": x})
    assert_close(np.array(got["probs"], np.float32).reshape(1, 10), ref, name="probs")
    assert got["predicted"] == want, (f"predicted {got['predicted']}, want {want}; probs "
                                      f"{np.round(got['probs'], 3).tolist()}; input\n{x.reshape(8, 8).round()}")


def test_digits_vertical_line_is_one(digits_page, root):
    got = draw(digits_page, [[(140, 40), (140, 140), (140, 240)]])
    check_prediction(got, root, 1)


def test_digits_loop_is_zero(digits_page, root, tmp_path):
    loop = [(140 + 60 * math.sin(a), 140 - 95 * math.cos(a)) for a in np.linspace(0, 2 * math.pi, 33)]
    got = draw(digits_page, [loop])
    check_prediction(got, root, 0)
    assert digits_page.inner_text("#digit") == "0"
    assert "0" in digits_page.inner_text("tr.best")
    screenshot(digits_page, tmp_path, "digits.png")
    assert not digits_page.errors


TEST_SET_DIGITS = [2, 4, 7]


@pytest.mark.parametrize("label", TEST_SET_DIGITS)
def test_digits_drawn_test_set_image(digits_page, digits, root, label):
    """A held-out sklearn image (one train.py classified right), redrawn on the pad row by row."""
    img = digits["samples"][str(label)][0]
    got = draw(digits_page, image_strokes(img))
    check_prediction(got, root, label)


# ---------------------------------------------------------------- the benchmark page
@pytest.fixture(scope="module")
def bench(root, digits):
    """bench/ with the digits CNN only (quick on SwiftShader)."""
    _demo_build().build_bench(root, ["digits"])


@pytest.fixture(scope="module")
def bench_seed(root, bench):
    """bench/ with MobileNetV2 and MiniLM too, from the seed models (exported first when missing)."""
    build = _demo_build()
    assert build.build_bench(root, list(build.BENCH_MODELS)) == [*build.BENCH_MODELS, "digits"]


def run_bench(browser, server, tmp_path, model: str, runs: int, shot: str | None = None):
    ctx, pg = new_page(browser, f"{server}bench/?model={model}&runs={runs}", "ready",
                       viewport={"width": 860, "height": 820})
    try:
        adapter = pg.inner_text("#adapter")
        assert "features" in adapter and "timestamp-query" in adapter, adapter
        assert pg.input_value("#model") == model
        pg.click("#run")
        pg.wait_for_selector("body[data-state=done], body[data-state=error]", timeout=500_000)
        assert pg.get_attribute("body", "data-state") == "done", pg.inner_text("#status")
        r = pg.evaluate("() => benchDemo.results")
        assert r["model"] == model and r["runs"] == runs and len(r["times"]) == runs
        assert 0 < r["min"] <= r["median"] <= r["p90"] <= r["max"]
        assert float(pg.inner_text("#median")) == pytest.approx(r["median"], abs=0.006)
        assert float(pg.inner_text("#p90")) == pytest.approx(r["p90"], abs=0.006)
        assert pg.locator("#chart svg rect.run").count() == runs
        labels = [t.strip() for t in pg.locator("#chart svg text.stat").all_text_contents()]
        assert [t.split()[0] for t in labels] == ["median", "p90"] and all(t.endswith(" ms") for t in labels), labels
        # per-dispatch GPU times (SwiftShader offers timestamp-query)
        assert r["hasTimestamps"]
        dispatches = pg.locator("#dispatches").inner_text()
        assert "GPU time per dispatch" in dispatches and f"{len(r['profile'])} dispatches" in dispatches
        assert r["profile"] and all(p["ms"] >= 0 for p in r["profile"])
        if shot:
            screenshot(pg, tmp_path, shot)  # the viewport: controls, numbers, chart, top dispatches
        assert not pg.errors
        return r
    finally:
        ctx.close()


def test_bench_page(browser, server, bench, tmp_path):
    r = run_bench(browser, server, tmp_path, "digits", 5, shot="bench.png")
    assert len(r["profile"]) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("model,runs", [("mobilenet_v2", 3), ("minilm", 2)])
def test_bench_page_seed_models(browser, server, bench_seed, tmp_path, model, runs):
    """Slow on SwiftShader with 2 cores (about 10-12 s a MobileNetV2 inference, 40 s a MiniLM one):
    a warm-up, the timed runs and a profiled run."""
    r = run_bench(browser, server, tmp_path, model, runs, shot=f"bench_{model}.png" if model == "mobilenet_v2" else None)
    assert len(r["profile"]) > 40


# ---------------------------------------------------------------- the Python page (Pyodide)
@pytest.fixture(scope="module")
def python_page(root, digits):
    """digits/python.html with the DigitReader cell, and Pyodide copied to the root's pyodide/."""
    from webiree.bundler import pyodide as P

    try:
        P.pyodide_dist()
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"Pyodide is not installed: {e}")
    assert _demo_build().build_python(root) == "ok"
    return root / "digits" / "python.html"


PYODIDE_FATAL = "Pyodide has suffered a fatal error"


def run_cell(pg, timeout_s: float = BOOT_TIMEOUT_S) -> str:
    """Press Run; wait for done/error, failing fast on a Pyodide fatal error (or a destroyed proxy),
    which leaves the page 'running' forever. Returns #output."""
    pg.evaluate("() => { document.body.dataset.state = 'clicked'; }")
    pg.click("#run")
    deadline = time.monotonic() + timeout_s
    while pg.get_attribute("body", "data-state") not in ("done", "error"):
        fatal = [m for m in pg.console if PYODIDE_FATAL in m or "already been destroyed" in m]
        if fatal:
            pytest.fail(f"Pyodide crashed while running the cell: {' | '.join(fatal)[:600]}")
        assert time.monotonic() < deadline, f"the cell did not finish in {timeout_s} s: {pg.inner_text('#output')[-2000:]}"
        pg.wait_for_timeout(250)
    out = pg.inner_text("#output")
    assert pg.get_attribute("body", "data-state") == "done", (pg.inner_text("#status"), out)
    return out


def test_python_page_cell(browser, server, python_page, tmp_path):
    ctx, pg = new_page(browser, server + "digits/python.html", "ready", timeout_s=BOOT_TIMEOUT_S,
                       viewport={"width": 900, "height": 760})
    try:
        code = pg.input_value("#code")
        assert "class DigitReader" in code and "await read_digit(pixels)" in code
        screenshot(pg, tmp_path, "python.png", full_page=True)  # booted: the cell, ready to run
        out = run_cell(pg)
        assert "a 0 from the test set -> predicted 0" in out, out
        assert "a 7 from the test set -> predicted 7" in out, out
        assert "latency:" in out and float(pg.inner_text("#latency-ms")) > 0
        # the cell is editable: a second run reuses the session and runs what was typed
        pg.fill("#code", 'digit, p = await read_digit([0] * 64)\nprint("blank ->", digit, round(sum(p), 3))')
        out = run_cell(pg)
        assert "blank ->" in out and out.strip().endswith(" 1.0"), out
        pg.fill("#code", code)
        run_cell(pg)
        screenshot(pg, tmp_path, "python_run.png", full_page=True)
        assert not pg.errors
    finally:
        ctx.close()
