"""Weights streamed, verified and cached (issue #19 item 3), in headless Chromium.

The manifest records SHA-256 hashes of model.wrm and weights.bin and of every range of
weights.bin that starts a weight page (`weight_pages`). webiree.js streams weights.bin into the
GPU pages range by range, checks each range's hash, and keeps the file in the Cache API
(`webiree-weights-v1`, keyed by the content hash): a second `create` makes no request for it.
A download that does not match is fetched once more (bypassing the HTTP cache), then refused; a
damaged cache entry is replaced by a download; `{cache: false}`, or a page without the Cache
API, always downloads.

The site: an MLP built with a small max_buffer_size so that its weights span two pages (and two
hashed ranges), served by webiree's server on loopback (a secure context: the Cache API exists).
Each test opens its own browser context, whose Cache Storage starts empty.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

import webiree
from webiree.testing.models import mlp, sample_inputs

from .browser_util import write_blank_page
from .conftest import assert_close, ort_run
from .test_browser import b64_feeds, decode_outputs, evaluate

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

CACHE = "webiree-weights-v1"

# create (with options), run the feeds, release: outputs, where the weights came from, timings
CREATE_JS = """async ({url, runtime, feeds, options}) => {
  const w = await import(runtime);
  const ARR = {float32: Float32Array};
  const bytes = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const b64 = (a) => { const u = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let s = '';
    for (let i = 0; i < u.length; i += 4096) s += String.fromCharCode(...u.subarray(i, i + 4096)); return btoa(s); };
  const progress = [];
  let session;
  const t0 = performance.now();
  try {
    session = await w.InferenceSession.create(url, {...options, onProgress: (p) => progress.push(p)});
    const created = performance.now() - t0;
    const tensors = {};
    for (const [name, {type, dims, data}] of Object.entries(feeds)) {
      tensors[name] = new w.Tensor(type, new ARR[type](bytes(data).buffer), dims);
    }
    const r = await session.run(tensors);
    const first = performance.now() - t0;
    const out = {};
    for (const [k, t] of Object.entries(r)) out[k] = {type: t.type, dims: t.dims, data: b64(t.data)};
    return {out, source: session.weightsSource, createMs: created, firstResultMs: first,
            last: progress[progress.length - 1], cacheName: w.WEIGHTS_CACHE};
  } catch (e) {
    return {error: String(e.message), kind: e.kind ?? null};
  } finally {
    await session?.release();
  }
}"""

# the cache's entries: key URL -> sha256 of the body
CACHE_JS = """async (name) => {
  if (!(await caches.has(name))) return null;
  const cache = await caches.open(name);
  const out = {};
  for (const req of await cache.keys()) {
    const body = new Uint8Array(await (await cache.match(req)).arrayBuffer());
    const d = new Uint8Array(await crypto.subtle.digest('SHA-256', body));
    out[req.url] = 'sha256-' + Array.from(d, (b) => b.toString(16).padStart(2, '0')).join('');
  }
  return out;
}"""

# flip one byte in the middle of every entry of the cache, keeping its key
DAMAGE_CACHE_JS = """async (name) => {
  const cache = await caches.open(name);
  const keys = await cache.keys();
  for (const req of keys) {
    const body = new Uint8Array(await (await cache.match(req)).arrayBuffer());
    body[body.length >> 1] ^= 0xff;
    await cache.put(req, new Response(body));
  }
  return keys.length;
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """root with blank.html and the site 'mlp2' (two weight pages), and a copy 'tampered' whose
    weights.bin has one byte changed in its second range after the build."""
    root = tmp_path_factory.mktemp("cache_sites")
    write_blank_page(root)
    model = mlp(sizes=(256, 256, 10))
    webiree.compile(model, root / "mlp2", limits={"max_buffer_size": 300000})
    shutil.copytree(root / "mlp2", root / "tampered")
    manifest = json.loads((root / "mlp2" / "manifest.json").read_text())
    second = manifest["weight_pages"][1]
    w = bytearray((root / "tampered" / "weights.bin").read_bytes())
    w[second["offset"] + 100] ^= 0x01
    (root / "tampered" / "weights.bin").write_bytes(bytes(w))
    return root, model, manifest


@pytest.fixture(scope="module")
def site_root(site):
    return site[0]


def create(page, server, name, feeds, **options):
    return evaluate(page, CREATE_JS, {"url": f"{server}{name}/", "runtime": f"{server}mlp2/webiree.js",
                                      "feeds": b64_feeds(feeds), "options": options})


def check_outputs(r, model, feeds):
    assert "error" not in r, r
    got = decode_outputs(r)
    for o, want in zip(model.graph.output, ort_run(model, feeds), strict=True):
        assert_close(got[o.name], want, name=o.name)


def test_manifest_hashes_match_hashlib(site):
    root, _, manifest = site
    sha = lambda b: "sha256-" + hashlib.sha256(b).hexdigest()  # noqa: E731
    weights = (root / "mlp2" / "weights.bin").read_bytes()
    assert manifest["hashes"] == {"module": sha((root / "mlp2" / "model.wrm").read_bytes()), "weights": sha(weights)}
    pages = manifest["weight_pages"]
    assert len(pages) == 2 and pages[0]["offset"] == 0
    assert [p["offset"] + p["size"] for p in pages[:-1]] == [p["offset"] for p in pages[1:]]
    assert pages[-1]["offset"] + pages[-1]["size"] == len(weights) == manifest["sizes"]["weights_bytes"]
    for p in pages:
        assert p["sha256"] == sha(weights[p["offset"]:p["offset"] + p["size"]])


def test_second_create_reads_the_cache(page, server, site):
    _, model, manifest = site
    feeds = sample_inputs(model)
    first = create(page, server, "mlp2", feeds)
    check_outputs(first, model, feeds)
    assert first["source"] == "network" and len(page.weight_requests) == 1
    assert first["last"]["loaded"] == first["last"]["total"]
    assert evaluate(page, CACHE_JS, CACHE) == {
        f"{server}.webiree-weights/{manifest['hashes']['weights']}": manifest["hashes"]["weights"]}
    second = create(page, server, "mlp2", feeds)
    check_outputs(second, model, feeds)
    assert second["source"] == "cache" and len(page.weight_requests) == 1, "no request for weights.bin"
    assert second["out"] == first["out"]
    assert second["last"]["loaded"] == second["last"]["total"]
    assert first["cacheName"] == CACHE
    assert not page.errors
    print(f"\nmlp2 ({manifest['sizes']['weights_bytes']} B of weights): first result "
          f"{first['firstResultMs']:.0f} ms (network), {second['firstResultMs']:.0f} ms (cache)")


def test_tampered_weights_are_refetched_once_then_refused(page, server, site):
    root, model, manifest = site
    page_range = manifest["weight_pages"][1]
    w = (root / "tampered" / "weights.bin").read_bytes()
    got = "sha256-" + hashlib.sha256(w[page_range["offset"]:page_range["offset"] + page_range["size"]]).hexdigest()
    r = create(page, server, "tampered", sample_inputs(model))
    assert r.get("kind") == "model", r
    assert "weights.bin" in r["error"] and got in r["error"] and page_range["sha256"] in r["error"], r
    assert manifest["hashes"]["weights"] in r["error"]   # the whole file's hash too
    assert len(page.weight_requests) == 2, [x.url for x in page.weight_requests]
    assert page.weight_requests[1].all_headers().get("cache-control") == "no-cache"  # cache: 'reload'
    assert not evaluate(page, CACHE_JS, CACHE), "a mismatching download is never stored"


def test_damaged_cache_entry_is_replaced(page, server, site):
    _, model, manifest = site
    feeds = sample_inputs(model)
    check_outputs(create(page, server, "mlp2", feeds), model, feeds)
    assert evaluate(page, DAMAGE_CACHE_JS, CACHE) == 1
    assert list(evaluate(page, CACHE_JS, CACHE).values()) != [manifest["hashes"]["weights"]]
    r = create(page, server, "mlp2", feeds)
    check_outputs(r, model, feeds)
    assert r["source"] == "network" and len(page.weight_requests) == 2
    assert list(evaluate(page, CACHE_JS, CACHE).values()) == [manifest["hashes"]["weights"]]
    r = create(page, server, "mlp2", feeds)  # the fresh entry serves the next visit
    check_outputs(r, model, feeds)
    assert r["source"] == "cache" and len(page.weight_requests) == 2


def test_cache_false_always_downloads(page, server, site):
    _, model, _ = site
    feeds = sample_inputs(model)
    for n in (1, 2):
        r = create(page, server, "mlp2", feeds, cache=False)
        check_outputs(r, model, feeds)
        assert r["source"] == "network" and len(page.weight_requests) == n
    assert not evaluate(page, CACHE_JS, CACHE), "cache: false stores nothing"


def test_without_the_cache_api_it_downloads(browser, server, site):
    """Where the Cache API is missing (a non-secure context), every create downloads, as before."""
    _, model, _ = site
    feeds = sample_inputs(model)
    ctx = browser.new_context()
    ctx.add_init_script("delete Window.prototype.caches; delete globalThis.caches;")
    try:
        pg = ctx.new_page()
        requests = []
        pg.on("request", lambda r: requests.append(r.url) if r.url.endswith("/weights.bin") else None)
        pg.goto(server + "blank.html")
        assert evaluate(pg, "async () => typeof caches") == "undefined"
        for n in (1, 2):
            r = create(pg, server, "mlp2", feeds)
            check_outputs(r, model, feeds)
            assert r["source"] == "network" and len(requests) == n
    finally:
        ctx.close()
