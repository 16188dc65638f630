"""Device loss and recovery (issue #19 item 7, first half), in headless Chromium.

When the GPU device is lost (a driver reset, a GPU process crash, a mobile tab in the
background; here `session.device.destroy()`), `run` rejects with a WebireeError of kind 'device'
naming the loss, and `session.lost` is true. `await session.recover()` requests a new adapter and
device with the same options, checks the limits again, recreates the buffers, pipelines and bind
groups and loads the weights again: from the Cache API when they were cached there (no request
for weights.bin), else downloaded. The next run gives the same outputs as before the loss.

The site: an MLP built with a small max_buffer_size (two weight pages), served by webiree's server
on loopback (a secure context: the Cache API exists). Each test opens its own browser context,
whose Cache Storage starts empty. The session lives on `window.s` across evaluate calls, so the
requests for weights.bin can be counted between the steps.
"""

from __future__ import annotations

import pytest

import webiree
from webiree.testing.models import mlp, sample_inputs

from .browser_util import write_blank_page
from .conftest import assert_close, ort_run
from .test_browser import b64_feeds, decode_outputs, evaluate

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

EVAL_S = 60

# window.run(): run window.feeds on window.s; outputs as base64, or the error as a value
SETUP_JS = """async ({url, feeds, options}) => {
  const w = await import(url + 'webiree.js');
  const ARR = {float32: Float32Array};
  const bytes = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));
  const b64 = (a) => { const u = new Uint8Array(a.buffer, a.byteOffset, a.byteLength); let s = '';
    for (let i = 0; i < u.length; i += 4096) s += String.fromCharCode(...u.subarray(i, i + 4096)); return btoa(s); };
  window.w = w;
  window.feeds = {};
  for (const [name, {type, dims, data}] of Object.entries(feeds)) {
    window.feeds[name] = new w.Tensor(type, new ARR[type](bytes(data).buffer), dims);
  }
  window.run = async (opts) => {
    try {
      const r = await window.s.run(window.feeds, opts);
      const out = {};
      for (const [k, t] of Object.entries(r)) {
        if (t.location === 'cpu') out[k] = {type: t.type, dims: t.dims, data: b64(t.data)};
      }
      return {out, kept: Object.keys(r).filter((k) => r[k].location !== 'cpu'), r};
    } catch (e) {
      return {error: String(e.message), kind: e.kind ?? null, isWebireeError: e instanceof w.WebireeError, hint: e.hint};
    }
  };
  window.s = await w.InferenceSession.create(url, options);
  const first = await window.run();
  delete first.r;
  return {...first, source: window.s.weightsSource, lost: window.s.lost};
}"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("devloss_sites")
    write_blank_page(root)
    model = mlp(sizes=(256, 256, 10))
    webiree.compile(model, root / "mlp2", limits={"max_buffer_size": 300000})
    return root, model


@pytest.fixture(scope="module")
def site_root(site):
    return site[0]


def setup(page, server, model, feeds, **options):
    r = evaluate(page, SETUP_JS, {"url": f"{server}mlp2/", "feeds": b64_feeds(feeds), "options": options}, EVAL_S)
    assert "error" not in r, r
    assert r["lost"] is False
    for o, want in zip(model.graph.output, ort_run(model, feeds), strict=True):
        assert_close(decode_outputs(r)[o.name], want, name=o.name)
    return r


# destroy the device mid-session (reached through the session), then run without waiting for
# device.lost first and once more after it: both reject with kind 'device'
LOSE_JS = """async () => {
  const s = window.s;
  const device = s.device;
  device.destroy();
  const early = await window.run();
  const info = await device.lost;
  const after = await window.run();
  return {early, after, reason: info.reason, lost: s.lost};
}"""

RECOVER_JS = """async () => {
  const s = window.s, old = s.device;
  const t0 = performance.now();
  await s.recover();
  const ms = performance.now() - t0;
  const r = await window.run();
  delete r.r;
  return {...r, ms, lost: s.lost, source: s.weightsSource, newDevice: s.device !== old};
}"""


def check_lost(r):
    for step in ("early", "after"):
        e = r[step]
        assert e.get("kind") == "device" and e["isWebireeError"], (step, e)
        assert e["error"].startswith("the WebGPU device was lost (destroyed)"), (step, e)
        assert "recover()" in e["hint"], (step, e)
    assert r["reason"] == "destroyed" and r["lost"] is True


def test_recover_after_device_destroyed_reads_the_cache(page, server, site):
    _, model = site
    feeds = sample_inputs(model)
    first = setup(page, server, model, feeds)
    assert first["source"] == "network" and len(page.weight_requests) == 1
    check_lost(evaluate(page, LOSE_JS, None, EVAL_S))
    r = evaluate(page, RECOVER_JS, None, EVAL_S)
    assert "error" not in r, r
    assert r["out"] == first["out"], "the same outputs after recover()"
    assert r["newDevice"] and r["lost"] is False and r["source"] == "cache"
    assert len(page.weight_requests) == 1, f"recover() requested weights.bin: {page.weight_requests}"
    # a second loss recovers the same way
    check_lost(evaluate(page, LOSE_JS, None, EVAL_S))
    again = evaluate(page, RECOVER_JS, None, EVAL_S)
    assert again.get("out") == first["out"], again
    assert len(page.weight_requests) == 1
    assert not page.errors
    print(f"\nrecover(): {r['ms']:.0f} ms, then {again['ms']:.0f} ms")


def test_recover_without_cache_downloads_again(page, server, site):
    _, model = site
    feeds = sample_inputs(model)
    first = setup(page, server, model, feeds, cache=False)
    assert len(page.weight_requests) == 1
    check_lost(evaluate(page, LOSE_JS, None, EVAL_S))
    r = evaluate(page, RECOVER_JS, None, EVAL_S)
    assert r.get("out") == first["out"], r
    assert r["source"] == "network" and len(page.weight_requests) == 2


def test_recover_noop_kept_tensors_and_release(page, server, site):
    _, model = site
    feeds = sample_inputs(model)
    first = setup(page, server, model, feeds)
    out = model.graph.output[0].name
    r = evaluate(page, """async (out) => {
      const s = window.s, device = s.device;
      await s.recover();                       // the device is fine: nothing happens
      const same = s.device === device && !s.lost;
      const kept = (await window.run({keep: [out]})).r[out];
      device.destroy();
      await device.lost;
      await s.recover();
      const disposed = kept.location;
      const fed = await s.run({...window.feeds}).then(() => 'ran', (e) => e.kind);
      await s.release();
      const lostAfterRelease = s.lost;
      const released = await s.recover().then(() => 'recovered', (e) => ({kind: e.kind, error: e.message}));
      return {same, disposed, fed, lostAfterRelease, released};
    }""", out, EVAL_S)
    assert r["same"] is True
    assert r["disposed"] == "none", "GPU tensors of the lost device are disposed"
    assert r["fed"] == "ran"
    assert r["lostAfterRelease"] is False
    assert r["released"]["kind"] == "device" and r["released"]["error"].startswith("the session was released"), r
    assert len(page.weight_requests) == 1 and first["source"] == "network"
    assert not page.errors
