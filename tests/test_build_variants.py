"""Kernels chosen at load (issue #19 item 1): a default build carries GPU- and CPU-class kernel
variants, and CPU-class ones whose matmuls broadcast within subgroups of 8 or 4, over one
executable table (identical executables stored once) and one weights.bin; the session picks by
the adapter. Natively the adapter is lavapipe, a CPU renderer running subgroups of 8: 'cpu-sg8' is
picked, and every variant it can run, forced, matches onnxruntime. The browser and Pyodide runtimes are tested in
test_browser.py and test_pyodide.py (test_kernel_variant_*)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

import webiree
from webiree.compiler.driver import merge_variants
from webiree.hal_webgpu.requirements import adapter_class
from webiree.hal_webgpu.wgpu_driver import adapter_info, subgroup_size
from webiree.module import read_module, write_module
from webiree.module.dump import describe_build
from webiree.module.format import VARIANTS_TAG, ModuleFormatError, pick_variant, select_variant, variant_counts
from webiree.testing.models import make_model, sample_inputs, small_cnn, tiny_attention

from .conftest import assert_close, ort_run

MODELS = {"small_cnn": small_cnn, "tiny_attention": tiny_attention}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """name -> (model, the default build's folder and result); the single-variant builds beside it."""
    root = tmp_path_factory.mktemp("variants")
    out = {}
    for name, make in MODELS.items():
        model = make()
        out[name] = (model, root / name, webiree.compile(model, root / name))
    webiree.compile(out["small_cnn"][0], root / "gpu_only", limits="gpu")
    webiree.compile(out["small_cnn"][0], root / "cpu_only", limits="cpu")
    return root, out


def _unique_vs_sum(module):
    counts = variant_counts(module)
    return len(module.executables), sum(c["executables"] for c in counts)


DEFAULT = ["gpu", "cpu", "cpu-sg8", "cpu-sg4", "cpu-sg4-start"]
RULES = {"gpu": "device_class=gpu", "cpu": "device_class=cpu", "cpu-sg8": "device_class=cpu,subgroup_size=8",
         "cpu-sg4": "device_class=cpu,subgroup_size=4", "cpu-sg4-start": "device_class=cpu,subgroup_size=4,start=1"}


@pytest.mark.parametrize("name", list(MODELS))
def test_default_build_carries_the_variants(builds, name):
    root, built = builds
    model, path, res = built[name]
    m = read_module((path / "model.wrm").read_bytes())
    assert [(v.name, v.rule) for v in m.variants] == [(n, RULES[n]) for n in DEFAULT]
    unique, total = _unique_vs_sum(m)
    counts = {c["name"]: c for c in variant_counts(m)}
    used = {v.name: {c[1] for c in v.commands if c[0] == 2} for v in m.variants}
    assert unique == len(set().union(*used.values())) < total, (unique, total, counts)
    for n in DEFAULT:
        assert counts[n]["shared"] == len(used[n] & set().union(*(u for k, u in used.items() if k != n))) > 0
    # the variants' kernels differ where the planner's table does (matmuls, softmax, layernorm, conv);
    # the subgroup variants only in their matmuls and fused attention
    strategies = {n: [d["config"]["strategy"] for d in r.module.info["dispatches"]] for n, r in res.variants.items()}
    assert strategies["gpu"] != strategies["cpu"] and len({len(v) for v in strategies.values()}) == 1
    assert "subgroup-broadcast" not in strategies["cpu"] + strategies["gpu"]
    for sg in ("cpu-sg8", "cpu-sg4"):
        assert strategies[sg].count("subgroup-broadcast") > 0
        subgroup = [a for a in strategies[sg] if a in ("subgroup-broadcast", "attention-subgroup")]
        assert [a for a, b in zip(strategies[sg], strategies["cpu"]) if a != b] == subgroup
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["variants"] == [{"name": n, "rule": RULES[n], "executables": counts[n]["executables"],
                                     "shared": counts[n]["shared"]} for n in DEFAULT]
    assert manifest["executables"] == unique and manifest["build_options"]["variants"] == DEFAULT
    assert len(list((path / "shaders").glob("*.wgsl"))) == unique
    text = describe_build(path)
    assert f"kernel variants: 5, {unique} unique executables ({total} dispatched in all, {total - unique} shared)" in text
    assert f"  cpu-sg8 rule {RULES['cpu-sg8']}: {counts['cpu-sg8']['executables']} executables" in text

    feeds = sample_inputs(model)
    ref = ort_run(model, feeds)
    assert adapter_class(adapter_info()) == "cpu" and subgroup_size() == 8     # lavapipe on AVX2
    for variant, want in ((None, "cpu-sg8"), ("gpu", "gpu"), ("cpu", "cpu"), ("cpu-sg8", "cpu-sg8")):
        sess = webiree.InferenceSession(path, variant=variant)
        assert sess.variant == want
        assert len(sess.module.executables) == counts[want]["executables"]
        assert [d["config"]["strategy"] for d in sess.module.info["dispatches"]] == strategies[want]
        assert sess.module.limits.get("subgroup_size") == (8 if want == "cpu-sg8" else None)
        for g, r, o in zip(sess.run(None, feeds), ref, model.graph.output, strict=True):
            assert_close(g, r, name=f"{o.name} ({want})", elementwise=True)
        sess.close()
    # a variant for subgroups this adapter does not run is refused by name, before anything is created
    with pytest.raises(webiree.LimitsError, match="broadcast within subgroups of 4 invocations; this adapter "
                                                  "runs subgroups of 8"):
        webiree.InferenceSession(path, variant="cpu-sg4")


def test_pick_variant_by_the_adapter(builds):
    """The rule with the most conditions that all hold wins; where none holds, the first variant."""
    root, built = builds
    m = read_module((built["tiny_attention"][1] / "model.wrm").read_bytes())
    cases = [({"device_class": "gpu", "subgroup_size": 32}, "gpu"), ({"device_class": "gpu"}, "gpu"),
             ({"device_class": "cpu", "subgroup_size": 8}, "cpu-sg8"),
             ({"device_class": "cpu", "subgroup_size": 4}, "cpu-sg4"),
             ({"device_class": "cpu", "subgroup_size": 16}, "cpu"), ({"device_class": "cpu", "subgroup_size": 0}, "cpu"),
             ("cpu", "cpu"), ({"device_class": "npu"}, "gpu")]
    assert [pick_variant(m, facts) for facts, _ in cases] == [want for _, want in cases]
    assert select_variant(m, "cpu-sg4").limits["subgroup_size"] == 4 and "subgroup_size" not in m.limits
    # a rule this reader does not know is refused when the module is read
    bad = dataclass_replace(m, variants=[dataclass_replace(m.variants[0], rule="device_class=gpu,vram=80")]
                            + m.variants[1:])
    with pytest.raises(ModuleFormatError, match="variant 'gpu' has a rule this reader does not know"):
        read_module(write_module(bad))


def test_subgroup_variant_without_subgroups_is_not_carried(tmp_path):
    """A model whose kernels broadcast nowhere (no matmul): its subgroup variants would equal 'cpu'."""
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])], {})
    res = webiree.compile(model, tmp_path / "ew")
    assert [v.name for v in res.module.variants] == ["gpu", "cpu"] and list(res.variants) == ["gpu", "cpu"]
    sess = webiree.InferenceSession(tmp_path / "ew")
    feeds = sample_inputs(model)
    assert sess.variant == "cpu"
    assert_close(sess.run(None, feeds)[0], ort_run(model, feeds)[0], name="y", elementwise=True)


def test_weights_are_the_single_variant_builds(builds):
    root, built = builds
    path = built["small_cnn"][1]
    for single in ("gpu_only", "cpu_only"):
        assert (root / single / "weights.bin").read_bytes() == (path / "weights.bin").read_bytes()
        m = read_module((root / single / "model.wrm").read_bytes())
        assert m.variants == [] and "variants" not in json.loads((root / single / "manifest.json").read_text())[
            "build_options"]
    # the gpu variant's stream is CMDS: a reader that skips VARS runs the gpu kernels of the single build
    gpu = read_module((root / "gpu_only" / "model.wrm").read_bytes())
    both = read_module((path / "model.wrm").read_bytes())
    old = read_module(write_module(dataclass_replace(both, variants=[])))
    assert len(old.commands) == len(gpu.commands)
    assert [both.executables[c[1]].code.split(b"\n", 1)[1] for c in old.commands if c[0] == 2] == \
           [gpu.executables[c[1]].code.split(b"\n", 1)[1] for c in gpu.commands if c[0] == 2]
    assert VARIANTS_TAG in (path / "model.wrm").read_bytes() and VARIANTS_TAG not in write_module(old)


def dataclass_replace(obj, **kw):
    import dataclasses
    return dataclasses.replace(obj, **kw)


def test_variant_options_and_errors(builds, tmp_path):
    root, built = builds
    model, path, res = built["small_cnn"]
    with pytest.raises(webiree.ModelError, match=r"no kernel variant 'tpu' \(it has: gpu, cpu, cpu-sg8, cpu-sg4, cpu-sg4-start\)"):
        webiree.InferenceSession(path, variant="tpu")
    with pytest.raises(webiree.ModelError, match=r"no kernel variant 'cpu' \(it has: none\)"):
        webiree.InferenceSession(root / "gpu_only", variant="cpu")
    one = webiree.compile(model, tmp_path / "one", variants="gpu")
    assert [v.name for v in one.module.variants] == ["gpu"]
    assert webiree.InferenceSession(tmp_path / "one").variant == "gpu"   # no rule matches: the first
    with pytest.raises(webiree.LimitsError, match="kernel variants need a target of no device class"):
        webiree.compile(model, tmp_path / "x", limits="cpu", variants="gpu,cpu")
    with pytest.raises(webiree.LimitsError, match="distinct names among gpu, cpu"):
        webiree.compile(model, tmp_path / "x", variants="gpu,gpu")
    with pytest.raises(webiree.LimitsError, match=r"distinct names .*not \('gpu', 'cpu-sg3'\)"):
        webiree.compile(model, tmp_path / "x", variants="gpu,cpu-sg3")
    with pytest.raises(webiree.LimitsError, match="no device class and no subgroup size; .* with subgroups of 8"):
        webiree.compile(model, tmp_path / "x", limits={"subgroup_size": 8}, variants="gpu,cpu")
    # the variants must share one schedule and one weights blob: anything else is a compiler bug
    a, b = res.variants["gpu"], res.variants["cpu"]
    b_bad = dataclass_replace(b, weights=b.weights[:-4] + b"\x01\x02\x03\x04")
    with pytest.raises(webiree.CompilerBug, match="cpu kernel variant's weights blob differ"):
        merge_variants(("gpu", "cpu"), [a, b_bad])


def test_cli_variants(builds, tmp_path, capsys):
    from webiree.cli import main

    root, built = builds
    model, _, _ = built["small_cnn"]
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    assert main(["build", str(src), "--out", str(tmp_path / "b"), "--variants", "cpu"]) == 0
    assert "kernel variants cpu" in capsys.readouterr().out
    assert [v["name"] for v in json.loads((tmp_path / "b" / "manifest.json").read_text())["variants"]] == ["cpu"]


def test_dynamic_build_variants(tmp_path):
    """Each variant has its own register arithmetic (workgroup counts) over the shared symbols."""
    rng = np.random.default_rng(3)
    f = TensorProto.FLOAT
    model = make_model([helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])],
                       [helper.make_tensor_value_info("a", f, ["n", 64])], [helper.make_tensor_value_info("y", f, ["n", 24])],
                       {"w": rng.standard_normal([64, 24]).astype(np.float32)})
    webiree.compile(model, tmp_path / "d", dims={"n": (1, 40)})
    m = read_module((tmp_path / "d" / "model.wrm").read_bytes())
    assert m.symbols and [v.name for v in m.variants] == DEFAULT
    for n in (5, 33):
        feeds = {"a": rng.standard_normal([n, 64]).astype(np.float32)}
        ref = ort_run(model, feeds)[0]
        for variant in ("gpu", "cpu", "cpu-sg8"):
            got = webiree.InferenceSession(tmp_path / "d", variant=variant).run(None, feeds)[0]
            assert_close(got, ref, name=f"y n={n} ({variant})", elementwise=True)


def test_start_tier_has_small_blocks_and_runs_when_named(tmp_path):
    """A variant's start tier ('-start', rule ',start=1'): the same dispatches with register blocks of
    at most config.START_ROWS x START_COLS and row-block convolutions START_ROW_WIDTH wide, which a
    CPU renderer compiles several times faster. No adapter picks it (webiree.js runs it while its
    variant compiles: test_browser.py test_start_tier_runs_first_then_the_variant); named, it runs
    natively and matches onnxruntime. It must follow its variant in the list."""
    from webiree.wgsl_codegen import config

    model = small_cnn()
    res = webiree.compile(model, tmp_path / "b", variants="cpu-sg8,cpu-sg8-start")
    assert [(v.name, v.rule) for v in res.module.variants] == [
        ("cpu-sg8", "device_class=cpu,subgroup_size=8"), ("cpu-sg8-start", "device_class=cpu,subgroup_size=8,start=1")]
    cfgs = {n: [d["config"] for d in r.module.info["dispatches"]] for n, r in res.variants.items()}
    shrunk = 0
    for full, start in zip(cfgs["cpu-sg8"], cfgs["cpu-sg8-start"], strict=True):
        assert full["strategy"] == start["strategy"]
        if start["strategy"] in ("subgroup-broadcast", "register-blocked"):
            assert start["tile"][0] <= config.START_ROWS and start["tile"][1] <= config.START_COLS, start
            shrunk += tuple(full["tile"]) != tuple(start["tile"])
        elif start["strategy"] == "row-block":
            assert (tuple(full["tile"]), tuple(start["tile"])) == ((1, 8), (1, config.START_ROW_WIDTH))
            shrunk += 1
    assert shrunk >= 3, cfgs
    feeds = sample_inputs(model)
    ref = ort_run(model, feeds)
    assert webiree.InferenceSession(tmp_path / "b").variant == "cpu-sg8"     # lavapipe: never the start tier
    sess = webiree.InferenceSession(tmp_path / "b", variant="cpu-sg8-start")
    assert sess.variant == "cpu-sg8-start"
    for g, r, o in zip(sess.run(None, feeds), ref, model.graph.output, strict=True):
        assert_close(g, r, name=f"{o.name} (start tier)", elementwise=True)
    with pytest.raises(webiree.LimitsError, match="cpu-sg4-start needs cpu-sg4 before it"):
        webiree.compile(model, tmp_path / "x", variants="cpu-sg8,cpu-sg4-start")
