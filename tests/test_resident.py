"""GPU-resident tensors (issue #18 item 2): outputs kept on the device with run(..., keep=...)
and fed to the next run by a GPU copy, natively (DeviceTensor) and in webiree.js (Tensor with
location 'gpu-buffer'). The model is a tiny recurrent step: present = tanh(x W + past U + b),
logits = present V; `present` is fed back as `past`."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from onnx import TensorProto, helper

import webiree
from webiree import FeedError
from webiree.testing.models import make_model

from .browser_util import write_blank_page
from .conftest import assert_close, ort_run

H, X, C = 8, 4, 3


def rnn_step(seed: int = 0):
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("MatMul", ["past", "U"], ["hu"]),
             helper.make_node("Add", ["xw", "hu"], ["s"]), helper.make_node("Add", ["s", "b"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["present"]), helper.make_node("MatMul", ["present", "V"], ["logits"])]
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, X]),
                              helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, H])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, C]),
                       helper.make_tensor_value_info("present", TensorProto.FLOAT, [1, H])],
                      {"W": w(X, H), "U": w(H, H), "b": w(H), "V": w(H, C)}, name="rnn_step")


def xs(steps: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, X)).astype(np.float32) for _ in range(steps)]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("resident")
    webiree.compile(rnn_step(), root / "rnn_step")
    write_blank_page(root)
    return root


@pytest.fixture
def sess(site):
    s = webiree.InferenceSession(site / "rnn_step")
    yield s
    s.close()


def reference(steps):
    model, h, out = rnn_step(), np.zeros((1, H), np.float32), []
    for x in steps:
        logits, h = ort_run(model, {"x": x, "past": h})
        out.append((logits, h))
    return out


# ---------------------------------------------------------------- (a) values
def test_fed_back_on_the_gpu_matches_numpy_feeds_and_onnxruntime(sess):
    steps = xs(4)
    ref = reference(steps)
    h = np.zeros((1, H), np.float32)
    past = h
    for i, x in enumerate(steps):
        logits_np, h = sess.run(None, {"x": x, "past": h})                      # read back, fed as numpy
        logits, present = sess.run(None, {"x": x, "past": past}, keep=["present"])   # kept on the GPU
        assert isinstance(present, webiree.DeviceTensor)
        assert present.name == "present" and present.shape == (1, H) and present.onnx_type == TensorProto.FLOAT
        np.testing.assert_array_equal(present.numpy(), h)
        np.testing.assert_array_equal(logits, logits_np)
        assert_close(logits, ref[i][0])
        assert_close(present.numpy(), ref[i][1])
        if isinstance(past, webiree.DeviceTensor):
            past.release()
        past = present
    past.release()


def test_keep_every_output_reads_nothing_back(sess):
    x = xs(1)[0]
    logits, present = sess.run(None, {"x": x, "past": np.zeros((1, H), np.float32)}, keep=["logits", "present"])
    ref_logits, ref_present = ort_run(rnn_step(), {"x": x, "past": np.zeros((1, H), np.float32)})
    assert_close(logits.numpy(), ref_logits)
    assert_close(present.numpy(), ref_present)


# ---------------------------------------------------------------- (b) bytes read back
def count_reads(sess, monkeypatch):
    reads = []
    real = sess.driver.read_buffer
    monkeypatch.setattr(sess.driver, "read_buffer", lambda buf, off, size: reads.append(size) or real(buf, off, size))
    return reads


def test_kept_outputs_are_not_read_back(sess, monkeypatch, capsys):
    reads = count_reads(sess, monkeypatch)
    x, h = xs(1)[0], np.zeros((1, H), np.float32)
    sess.run(None, {"x": x, "past": h})
    without = sum(reads)
    reads.clear()
    _, present = sess.run(None, {"x": x, "past": h}, keep=["present"])
    with_keep = sum(reads)
    reads.clear()
    sess.run(None, {"x": x, "past": present}, keep=["present"])[1].release()
    fed_back = sum(reads)
    reads.clear()
    sess.run(["logits"], {"x": x, "past": h})
    only_logits = sum(reads)
    with capsys.disabled():
        print(f"\n[resident] bytes read back per step: {without} without keep, {with_keep} with keep=['present'], "
              f"{fed_back} fed back and kept")
    assert without == 4 * (C + H)
    assert with_keep == fed_back == only_logits == 4 * C
    reads.clear()
    present.numpy()            # reading a kept tensor on demand reads exactly its bytes
    assert reads == [4 * H]
    present.release()


# ---------------------------------------------------------------- (c) no leaks
def test_no_buffer_leaks_over_1000_fed_back_steps(site):
    from webiree.hal_webgpu.wgpu_driver import WgpuDriver

    gc.collect()
    process0 = WgpuDriver.process_live_buffers()
    sess = webiree.InferenceSession(site / "rnn_step")
    buffers0 = sess.driver.live_buffers
    x = xs(1)[0]
    _, past = sess.run(None, {"x": x, "past": np.zeros((1, H), np.float32)}, keep=["present"])
    h = past.numpy()
    model_h = h
    for _ in range(1000):
        _, present = sess.run(None, {"x": x, "past": past}, keep=["present"])
        past.release()
        past = present
        assert sess.driver.live_buffers == buffers0 + 1
    for _ in range(1000):     # the same recurrence in numpy feeds
        _, model_h = sess.run(None, {"x": x, "past": model_h})
    np.testing.assert_array_equal(past.numpy(), model_h)
    kept = sess.run(None, {"x": x, "past": past}, keep=["present", "logits"])
    assert sess.driver.live_buffers == buffers0 + 3
    sess.close()              # frees the device tensors still held
    assert past.released and all(t.released for t in kept)
    assert sess.driver.live_buffers == 0
    assert WgpuDriver.process_live_buffers() == process0


# ---------------------------------------------------------------- errors
def test_errors_are_feed_errors(site, sess):
    x, h = xs(1)[0], np.zeros((1, H), np.float32)
    _, present = sess.run(None, {"x": x, "past": h}, keep=["present"])
    logits, _ = sess.run(None, {"x": x, "past": h}, keep=["logits"])
    with pytest.raises(FeedError, match=r"input 'past' has shape \(1, 3\).*compiled for \(1, 8\)"):
        sess.run(None, {"x": x, "past": logits})
    with pytest.raises(FeedError, match="keep names"):
        sess.run(None, {"x": x, "past": h}, keep=["nope"])
    with pytest.raises(FeedError, match="keep names"):
        sess.run(["logits"], {"x": x, "past": h}, keep=["present"])
    with webiree.InferenceSession(site / "rnn_step") as other:
        with pytest.raises(FeedError, match="of another session"):
            other.run(None, {"x": x, "past": present})
    present.release()
    present.release()        # idempotent
    with pytest.raises(FeedError, match="was released"):
        sess.run(None, {"x": x, "past": present})
    with pytest.raises(FeedError, match="was released"):
        present.numpy()
    logits.release()
    assert sess.run(None, {"x": x, "past": h})[0].shape == (1, C)    # the session still runs


# ---------------------------------------------------------------- (d) the browser
BROWSER_JS = """async ({url, xs}) => {
  const w = await import(url + 'webiree.js');
  const session = await w.InferenceSession.create(url);
  const out = {logits: [], present: [], readback: [], errors: {}};
  const zeros = new w.Tensor('float32', new Float32Array(8), [1, 8]);
  let past = zeros;
  try {
    for (const x of xs) {
      const r = await session.run({x: new w.Tensor('float32', Float32Array.from(x), [1, 4]), past}, {keep: ['present']});
      out.readback.push(session.lastReadbackBytes);
      out.location = r.present.location;
      out.hasBuffer = r.present.gpuBuffer instanceof GPUBuffer;
      out.logits.push(Array.from(r.logits.data));
      out.present.push(Array.from(await r.present.getData()));
      if (past !== zeros) past.dispose();
      past = r.present;
    }
    const x = new w.Tensor('float32', new Float32Array(4), [1, 4]);
    const err = async (name, f) => { try { await f(); out.errors[name] = null; } catch (e) { out.errors[name] = [e.kind, e.message]; } };
    const other = await w.InferenceSession.create(url);
    await err('other', () => other.run({x, past}));
    await other.release();
    const r = await session.run({x, past: zeros}, {keep: ['logits']});
    await err('shape', () => session.run({x, past: r.logits}));
    await err('data', () => r.logits.data);
    await err('keep', () => session.run({x, past: zeros}, {keep: ['nope']}));
    past.dispose();
    await err('disposed', () => session.run({x, past}));
    out.afterDispose = past.location;
    await session.run({x, past: zeros});
    out.readbackAll = session.lastReadbackBytes;
  } catch (e) {
    out.error = String(e.message);
  } finally {
    await session.release();
  }
  return out;
}"""


@pytest.mark.browser
@pytest.mark.timeout(300)
def test_browser_feed_back_matches_native(site, browser, sess):
    from .browser_util import serving

    steps = xs(3)
    h, native = np.zeros((1, H), np.float32), []
    for x in steps:
        logits, h = sess.run(None, {"x": x, "past": h})
        native.append((logits, h))
    with serving(site) as url:
        ctx = browser.new_context()
        try:
            page = ctx.new_page()
            page.goto(url + "blank.html")
            got = page.evaluate(BROWSER_JS, {"url": url + "rnn_step/", "xs": [x.ravel().tolist() for x in steps]})
        finally:
            ctx.close()
    assert "error" not in got, got
    assert got["location"] == "gpu-buffer" and got["hasBuffer"]
    for i, (logits, present) in enumerate(native):
        assert_close(np.array(got["logits"][i], np.float32).reshape(1, C), logits)
        assert_close(np.array(got["present"][i], np.float32).reshape(1, H), present)
    assert got["readback"] == [4 * C] * len(steps) and got["readbackAll"] == 4 * (C + H)
    e = got["errors"]
    assert e["other"][0] == "feed" and "of another session" in e["other"][1]
    assert e["shape"][0] == "feed" and "has shape [1, 3]" in e["shape"][1]
    assert e["data"][0] == "feed" and "getData" in e["data"][1]
    assert e["keep"][0] == "feed" and "nope" in e["keep"][1]
    assert e["disposed"][0] == "feed" and "was disposed" in e["disposed"][1]
    assert got["afterDispose"] == "none"
