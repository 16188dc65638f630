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
import json
import math
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from .conftest import assert_close, ort_run
from .test_browser import CHROMIUM, CHROMIUM_ARGS, EVAL_TIMEOUT_S

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
    build = _demo_build()
    info = build.build_digits(root)
    (root / "index.html").write_text(build.INDEX)
    assert info["test_accuracy"] >= 0.97, info["test_accuracy"]
    return info


@pytest.fixture(scope="module")
def server(root):
    import uvicorn

    from webiree.bundler.server import create_app

    srv = uvicorn.Server(uvicorn.Config(create_app(root), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the webiree server did not start"
        time.sleep(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/"
    srv.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (scripts/setup.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def new_page(browser, url: str, ready: str, timeout_s: float = EVAL_TIMEOUT_S, **ctx_kw):
    ctx = browser.new_context(**ctx_kw)
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(url)
    pg.wait_for_selector(f"body[data-state={ready}], body[data-state=error]", timeout=timeout_s * 1000)
    assert pg.get_attribute("body", "data-state") == ready, pg.inner_text("#status")
    return ctx, pg


@pytest.fixture(scope="module")
def digits_page(browser, server, digits):
    ctx, pg = new_page(browser, server + "digits/", "ready", viewport={"width": 820, "height": 560})
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
def bench(root):
    """bench/: MobileNetV2 and MiniLM compiled from the seed models (exported first when missing)."""
    build = _demo_build()
    build.build_bench(root)
    return {name: json.loads((root / "bench" / name / "manifest.json").read_text()) for name in build.BENCH_MODELS}


@pytest.mark.parametrize("model,runs", [("mobilenet_v2", 3), ("minilm", 2)])
def test_bench_page(browser, server, bench, tmp_path, model, runs):
    ctx, pg = new_page(browser, f"{server}bench/?model={model}&runs={runs}", "ready",
                       viewport={"width": 900, "height": 700})
    try:
        adapter = pg.inner_text("#adapter")
        assert "features" in adapter and "timestamp-query" in adapter, adapter
        pg.click("#run")
        pg.wait_for_selector("body[data-state=done], body[data-state=error]", timeout=300_000)
        assert pg.get_attribute("body", "data-state") == "done", pg.inner_text("#status")
        r = pg.evaluate("() => benchDemo.results")
        assert r["model"] == model and r["runs"] == runs and len(r["times"]) == runs
        assert 0 < r["min"] <= r["median"] <= r["p90"] <= r["max"]
        assert float(pg.inner_text("#median")) == pytest.approx(r["median"], abs=0.006)
        assert float(pg.inner_text("#p90")) == pytest.approx(r["p90"], abs=0.006)
        assert pg.locator("#chart svg rect.run").count() == runs
        labels = pg.locator("#chart svg text.stat").all_inner_texts()
        assert [t.split()[0] for t in labels] == ["median", "p90"] and all(t.endswith(" ms") for t in labels)
        # per-dispatch GPU times (SwiftShader offers timestamp-query)
        assert r["hasTimestamps"]
        dispatches = pg.locator("#dispatches").inner_text()
        assert "GPU time per dispatch" in dispatches and f"{len(r['profile'])} dispatches" in dispatches
        assert len(r["profile"]) > 10 and all(p["ms"] >= 0 for p in r["profile"])
        if model == "mobilenet_v2":
            screenshot(pg, tmp_path, "bench.png", full_page=True)
        assert not pg.errors
    finally:
        ctx.close()
