"""Kernels chosen at load (issue #19 item 1): a default build carries GPU- and CPU-class kernel
variants over one executable table (identical executables stored once) and one weights.bin; the
session picks by the adapter. Natively the adapter is lavapipe, a CPU renderer: 'cpu' is picked,
and both variants, forced, match onnxruntime. The browser and Pyodide runtimes are tested in
test_browser.py and test_pyodide.py (test_kernel_variant_*)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

import webiree
from webiree.compiler.driver import merge_variants
from webiree.hal_webgpu.requirements import adapter_class
from webiree.hal_webgpu.wgpu_driver import adapter_info
from webiree.module import read_module, write_module
from webiree.module.dump import describe_build
from webiree.module.format import VARIANTS_TAG, variant_counts
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


@pytest.mark.parametrize("name", list(MODELS))
def test_default_build_carries_both_variants(builds, name):
    root, built = builds
    model, path, res = built[name]
    m = read_module((path / "model.wrm").read_bytes())
    assert [(v.name, v.rule) for v in m.variants] == [("gpu", "device_class=gpu"), ("cpu", "device_class=cpu")]
    unique, total = _unique_vs_sum(m)
    counts = {c["name"]: c for c in variant_counts(m)}
    shared = counts["gpu"]["shared"]
    assert shared == counts["cpu"]["shared"] > 0 and unique == total - shared < total, (unique, total, counts)
    # the variants' kernels differ where the planner's table does (matmuls, softmax, layernorm, conv)
    strategies = {n: [d["config"]["strategy"] for d in r.module.info["dispatches"]] for n, r in res.variants.items()}
    assert strategies["gpu"] != strategies["cpu"] and len(strategies["gpu"]) == len(strategies["cpu"])
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["variants"] == [{"name": n, "rule": f"device_class={n}", "executables": counts[n]["executables"],
                                     "shared": shared} for n in ("gpu", "cpu")]
    assert manifest["executables"] == unique and manifest["build_options"]["variants"] == ["gpu", "cpu"]
    assert len(list((path / "shaders").glob("*.wgsl"))) == unique
    text = describe_build(path)
    assert f"kernel variants: 2, {unique} unique executables ({total} dispatched in all, {shared} shared)" in text
    assert f"  cpu    rule device_class=cpu: {counts['cpu']['executables']} executables" in text

    feeds = sample_inputs(model)
    ref = ort_run(model, feeds)
    assert adapter_class(adapter_info()) == "cpu"       # lavapipe
    for variant, want in ((None, "cpu"), ("gpu", "gpu"), ("cpu", "cpu")):
        sess = webiree.InferenceSession(path, variant=variant)
        assert sess.variant == want
        assert len(sess.module.executables) == counts[want]["executables"]
        assert [d["config"]["strategy"] for d in sess.module.info["dispatches"]] == strategies[want]
        for g, r, o in zip(sess.run(None, feeds), ref, model.graph.output, strict=True):
            assert_close(g, r, name=f"{o.name} ({want})", elementwise=True)
        sess.close()


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
    with pytest.raises(webiree.ModelError, match=r"no kernel variant 'tpu' \(.*gpu, cpu"):
        webiree.InferenceSession(path, variant="tpu")
    with pytest.raises(webiree.ModelError, match=r"no kernel variant 'cpu' \(it has: none\)"):
        webiree.InferenceSession(root / "gpu_only", variant="cpu")
    one = webiree.compile(model, tmp_path / "one", variants="gpu")
    assert [v.name for v in one.module.variants] == ["gpu"]
    assert webiree.InferenceSession(tmp_path / "one").variant == "gpu"   # no rule matches: the first
    with pytest.raises(webiree.LimitsError, match="kernel variants need a target of no device class"):
        webiree.compile(model, tmp_path / "x", limits="cpu", variants="gpu,cpu")
    with pytest.raises(webiree.LimitsError, match="distinct device classes"):
        webiree.compile(model, tmp_path / "x", variants="gpu,gpu")
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
    assert m.symbols and [v.name for v in m.variants] == ["gpu", "cpu"]
    for n in (5, 33):
        feeds = {"a": rng.standard_normal([n, 64]).astype(np.float32)}
        ref = ort_run(model, feeds)[0]
        for variant in ("gpu", "cpu"):
            got = webiree.InferenceSession(tmp_path / "d", variant=variant).run(None, feeds)[0]
            assert_close(got, ref, name=f"y n={n} ({variant})", elementwise=True)
