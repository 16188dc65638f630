"""A profiled run as a Chrome trace (webiree/hal_webgpu/trace.py): natively and from `webiree bench --trace`."""

from __future__ import annotations

import json

import numpy as np

import webiree
from webiree.hal_webgpu.trace import chrome_trace
from webiree.testing import models


def test_chrome_trace_places_each_dispatch_at_its_timestamps():
    infos = [{"name": "conv", "kind": "conv", "nodes": ["Conv_0", "Relu_1"], "config": {"strategy": "direct"}},
             {"name": "gemm", "kind": "matmul", "nodes": ["Gemm_2"], "config": {"strategy": "tiled-shared"}}]
    t = chrome_trace(infos, [(1_000_000, 1_250_000), (1_300_000, 1_400_500)], "net")
    meta, a, b = t["traceEvents"]
    assert meta == {"name": "process_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "webiree net (GPU)"}}
    assert (a["name"], a["cat"], a["ph"], a["ts"], a["dur"]) == ("conv", "conv", "X", 0.0, 250.0)
    assert (b["ts"], b["dur"]) == (300.0, 100.5)
    assert a["args"] == {"index": 0, "nodes": ["Conv_0", "Relu_1"], "strategy": "direct"}
    assert json.loads(json.dumps(t)) == t


def test_session_trace_names_every_dispatch_and_its_nodes(tmp_path):
    model = models.small_cnn()
    res = webiree.compile(model, tmp_path / "b")
    sess = webiree.InferenceSession(tmp_path / "b")
    feeds = models.sample_inputs(model)
    sess.run(None, feeds)
    assert sess.last_trace is None                       # only a profiled run is traced
    sess.run(None, feeds, profile=True)
    assert sess.driver.has_timestamps, "lavapipe offers timestamp-query"
    events = [e for e in sess.last_trace["traceEvents"] if e["ph"] == "X"]
    infos = res.module.info["dispatches"]
    assert [e["name"] for e in events] == [d["name"] for d in infos]
    assert [e["args"]["nodes"] for e in events] == [d["nodes"] for d in infos]
    assert sorted(n for e in events for n in e["args"]["nodes"]) == sorted(n.name for n in model.graph.node if n.name
                                                                          in {x for d in infos for x in d["nodes"]})
    starts = [e["ts"] for e in events]
    assert starts == sorted(starts) and starts[0] == 0 and all(e["dur"] >= 0 for e in events)
    np.testing.assert_allclose([e["dur"] * 1000 for e in events], sess.last_profile, rtol=1e-9)


def test_bench_writes_the_trace(tmp_path, capsys):
    import onnx

    from webiree.cli import main

    onnx.save(models.mlp(), tmp_path / "mlp.onnx")
    assert main(["bench", str(tmp_path / "mlp.onnx"), "--runs", "2", "--warmup", "1",
                 "--trace", str(tmp_path / "t.json")]) == 0
    t = json.loads((tmp_path / "t.json").read_text())
    events = [e for e in t["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 4 and all(e["args"]["nodes"] for e in events)
    assert "trace of 4 dispatches written" in capsys.readouterr().out
