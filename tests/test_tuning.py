"""Autotuning (issue #20 item 3): `webiree tune` times each dispatch's candidate kernels on the
local adapter (lavapipe here) and writes a tuning table; `webiree build --tuning TABLE` takes its
configurations where they apply (wgsl_codegen/tuning.py, webiree/tune.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import webiree
from webiree.cli import main as cli_main
from webiree.ir import kir
from webiree.module import read_module
from webiree.tune import tune
from webiree.wgsl_codegen import tuning
from webiree.wgsl_codegen.tuning import FORMAT, Table, TuningTableError, problem_key

from .conftest import assert_close, ort_run

M_, K_, N_ = 24, 32, 40


def product_model():
    """A matmul (with a bias) and a softmax over its rows: two tuned dispatches."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array((rng.standard_normal((K_, N_)) / np.sqrt(K_)).astype(np.float32), "w")
    b = onnx.numpy_helper.from_array(rng.standard_normal((N_,)).astype(np.float32), "b")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
                      h.make_node("Softmax", ["a"], ["y"], axis=-1)], "product",
                     [h.make_tensor_value_info("x", T.FLOAT, [M_, K_])],
                     [h.make_tensor_value_info("y", T.FLOAT, [M_, N_])], [w, b])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


def feeds():
    return {"x": np.random.default_rng(1).standard_normal((M_, K_)).astype(np.float32)}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("tuning")
    onnx.save(product_model(), root / "m.onnx")
    table = tune(root / "m.onnx", root / "table.json", runs=2, warmup=1, log=lambda *a: None, warm_seconds=0)
    return root, table


def test_the_table_holds_each_shape_s_fastest_candidate(tuned):
    root, table = tuned
    assert json.loads((root / "table.json").read_text()) == table
    assert table["format"] == FORMAT and table["wrong"] == []
    assert (table["adapter"]["device_class"], table["adapter"]["subgroup_size"]) == ("cpu", 8)
    res = webiree.compile(root / "m.onnx", root / "plain", limits="adapter")
    keys = [problem_key(op) for op in res.program.ops]
    assert sorted(table["entries"]) == sorted(keys) and len(keys) == 2, keys     # the matmul, the softmax
    for key, e in table["entries"].items():
        ms = [t for _, t in e["candidates"]]
        assert ms == sorted(ms) and e["config"] == e["candidates"][0][0] and e["ms"] == ms[0] <= e["heuristic_ms"]
        assert [c for c, _ in e["candidates"]].count(e["heuristic"]) == 1
        assert len(e["candidates"]) >= (10 if key.startswith("matmul") else 5), (key, len(e["candidates"]))
    e2e = table["end_to_end"]
    assert min(e2e["heuristic_ms"], e2e["tuned_ms"], e2e["heuristic_gpu_ms"], e2e["tuned_gpu_ms"]) > 0, e2e
    assert table["drift"] > 0       # the heuristic's round, timed again at the end


def test_build_takes_the_table(tuned):
    root, table = tuned
    res = webiree.compile(root / "m.onnx", root / "site", limits="adapter", tuning=root / "table.json")
    info = res.module.info
    assert info["tuning"]["used"] == 2 and info["tuning"]["unfit"] == 0, info["tuning"]
    for d, op in zip(info["dispatches"], res.program.ops):
        want = tuning.KernelConfig(**table["entries"][problem_key(op)]["config"]).as_dict()
        assert d["tuned"] is True and json.loads(json.dumps(d["config"])) == json.loads(json.dumps(want)), want
    got = webiree.InferenceSession(root / "site").run(None, feeds())[0]
    assert_close(got, ort_run(product_model(), feeds())[0], name="tuned y")
    again = webiree.compile(root / "m.onnx", root / "site2", limits="adapter", tuning=root / "table.json")
    assert (root / "site" / "model.wrm").read_bytes() == (root / "site2" / "model.wrm").read_bytes()
    assert again.module.info["tuning"] == info["tuning"]


def test_a_default_build_tunes_the_variants_of_the_table_s_class(tuned):
    root, _ = tuned
    res = webiree.compile(root / "m.onnx", root / "default", tuning=root / "table.json")
    by_variant = {n: v.get("tuning") for n, v in res.module.info["variants"].items()}
    assert by_variant["gpu"]["for another device class"] == 2 and by_variant["gpu"]["used"] == 0
    # the cpu variants take what fits (a subgroup kernel of the table only where subgroups are 8; a
    # variant equal to another is not carried)
    table = json.loads((root / "table.json").read_text())
    sg = any(e["config"]["strategy"] == "subgroup-broadcast" for e in table["entries"].values())
    cpu = {n: t for n, t in by_variant.items() if n.startswith("cpu")}
    assert cpu["cpu"] == {**cpu["cpu"], "used": 2 - sg, "unfit": int(sg)}, cpu
    assert all(t["used"] == 2 for n, t in cpu.items() if n == "cpu-sg8"), cpu
    m = read_module((root / "default" / "model.wrm").read_bytes())
    assert [v.name for v in m.variants][:2] == ["gpu", "cpu"]
    got = webiree.InferenceSession(root / "default").run(None, feeds())[0]
    assert_close(got, ort_run(product_model(), feeds())[0], name="default tuned y")


def test_an_entry_the_target_cannot_run_is_skipped(tmp_path):
    model = product_model()
    res = webiree.compile(model, tmp_path / "a", limits={"device_class": "cpu", "subgroup_size": 8})
    mm, sm = res.program.ops
    entries = {problem_key(mm): {"config": {"workgroup_size": [16, 1, 1], "tile": [8, 2, 64], "vector": 1,
                                            "strategy": "subgroup-broadcast"}},       # subgroups of 16, not 8
               problem_key(sm): {"config": {"workgroup_size": [1024, 1, 1], "tile": [], "vector": 1,
                                            "strategy": "workgroup-tree"}}}            # 1024 > 256 invocations
    table = Table({"format": FORMAT, "adapter": {"device_class": "cpu"}, "entries": entries})
    res = webiree.compile(model, tmp_path / "b", limits={"device_class": "cpu", "subgroup_size": 8}, tuning=table)
    assert res.module.info["tuning"]["unfit"] == 2 and res.module.info["tuning"]["used"] == 0
    assert [json.loads(json.dumps(d["config"])) for d in res.module.info["dispatches"]] == \
        [json.loads(json.dumps(c.config.as_dict())) for c in res.dispatches]


@pytest.mark.parametrize("content, message", [
    ("{not json", "cannot read the tuning table"),
    ('{"format": "other/1", "entries": {}}', "is not a webiree tuning table"),
    ('{"format": "webiree-tuning/1", "entries": {"matmul x": {"config": {"strategy": "warp"}}}}',
     "entry 'matmul x' holds no kernel configuration"),
])
def test_a_bad_table_is_one_clear_error(tmp_path, capsys, content, message):
    (tmp_path / "t.json").write_text(content)
    with pytest.raises(TuningTableError, match=message):
        Table.load(tmp_path / "t.json")
    onnx.save(product_model(), tmp_path / "m.onnx")
    rc = cli_main(["build", str(tmp_path / "m.onnx"), "--out", str(tmp_path / "site"), "--tuning", str(tmp_path / "t.json")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, (rc, err)


def test_a_wrong_candidate_is_found_and_left_out(tmp_path, monkeypatch):
    """A candidate kernel that computes wrong values (here: a softmax configuration made to double
    its results) is isolated by splitting its round, reported, and never enters the table."""
    from webiree.wgsl_codegen import kernels as K
    from webiree.wgsl_codegen.kernels.common import Strategy

    original = K.BUILDERS[K.P.Softmax]

    def broken(op, prog, cfg, limits, b):
        body, shared, grid = original(op, prog, cfg, limits, b)
        if cfg.strategy == Strategy.WORKGROUP_TREE and cfg.workgroup_size[0] == 64:
            body = _double_stores(body)
        return body, shared, grid
    monkeypatch.setitem(K.BUILDERS, K.P.Softmax, broken)
    onnx.save(product_model(), tmp_path / "m.onnx")
    table = tune(tmp_path / "m.onnx", tmp_path / "t.json", runs=1, warmup=0, log=lambda *a: None, warm_seconds=0)
    assert len(table["wrong"]) == 1, table["wrong"]
    name, cfg = table["wrong"][0]
    assert cfg["strategy"] == "workgroup-tree" and cfg["workgroup_size"][0] == 64
    softmax = next(e for k, e in table["entries"].items() if k.startswith("softmax"))
    assert all(c["workgroup_size"][0] != 64 or c["strategy"] != "workgroup-tree" for c, _ in softmax["candidates"])


def _double_stores(body):
    out = []
    for s in body:
        if isinstance(s, kir.Store):
            s = kir.Store(s.buf, s.index, s.value * 2.0)
        elif isinstance(s, kir.For):
            s = kir.For(s.var, s.start, s.stop, _double_stores(s.body), s.step, s.unroll)
        elif isinstance(s, kir.If):
            s = kir.If(s.cond, _double_stores(s.then), _double_stores(s.orelse))
        out.append(s)
    return out
