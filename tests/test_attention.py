"""Fused attention (compiler/passes.py fuse_attention, kernels/attention.py): Q Kᵀ with its scale
and mask, the softmax and the product with V as one dispatch, against onnxruntime, in the GPU
variant and in the CPU ones of a build for every adapter class, shapes that do not divide the
blocks included, masked rows (-inf: 0 with the NaN guard, NaN without it, as onnxruntime), SPIR-V,
a dynamic build, and the cases that stay three dispatches."""

from __future__ import annotations

import json

import numpy as np
import pytest

import webiree
from webiree.testing.models import sample_inputs, sdpa_block
from webiree.wgsl_codegen.tuning import FORMAT

from .conftest import assert_close, ort_run
from .test_kernel_variants import strategies


def by_variant(res) -> dict:
    return {v.name: [d["config"]["strategy"] for d in v.info["dispatches"]] for v in res.module.variants}


def run_variants(model, tmp_path, feeds=None, variants=("gpu", "cpu", "cpu-sg8"), **kw):
    """Build (by default for every adapter class), run each variant, compare with onnxruntime:
    attention-online in 'gpu' and 'cpu', attention-subgroup in 'cpu-sg8' (lavapipe's subgroups)."""
    feeds = feeds or sample_inputs(model)
    ref = ort_run(model, feeds)
    res = webiree.compile(model, tmp_path / "build", **kw)
    for v in variants:
        got = webiree.InferenceSession(tmp_path / "build", variant=v).run(None, feeds)
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert_close(g, r, name=f"{v}")
    return res


@pytest.mark.parametrize("shape", [(1, 12, 128, 128, 32, 32),    # MiniLM's heads
                                   (2, 3, 33, 45, 20, 12),       # rows, keys and head sizes off every block
                                   (1, 2, 5, 7, 8, 8),           # fewer keys than a block
                                   (1, 2, 40, 50, 64, 64),       # BERT-base's and GPT-2's heads
                                   (1, 1, 9, 17, 128, 128)])     # the largest fused (ATTENTION_HEAD_MAX)
def test_attention_fused(shape, tmp_path):
    """Heads of 64 and 128 values fit the default 16 KiB of workgroup memory with 32 and 16
    invocations of 8 splits (the splits' sums of 64 do not; config.py _attention_online)."""
    b, h, m, s, d, dv = shape
    res = run_variants(sdpa_block(b, h, m, s, d, dv), tmp_path)
    assert by_variant(res) == {"gpu": ["attention-online"], "cpu": ["attention-online"],
                               "cpu-sg8": ["attention-subgroup"], "cpu-sg4": ["attention-subgroup"]}
    assert len(res.module.info["dispatches"][0]["nodes"]) == 8     # every ONNX node in the one dispatch
    (gpu,) = [v.info["dispatches"][0]["config"] for v in res.module.variants if v.name == "gpu"]
    want = {64: ([32, 1, 1], 8), 128: ([16, 1, 1], 8)}.get(dv, ([64, 1, 1], 8))
    assert (list(gpu["workgroup_size"]), gpu["tile"][1]) == want, gpu


@pytest.mark.parametrize("guard", [True, False])
def test_masked_rows(guard, tmp_path):
    """Rows whose every key is masked with -inf (the first 3 rows of batch 0), rows with some keys
    masked, and rows masked with float32's lowest finite value (Hugging Face's mask: a uniform
    softmax there, not 0)."""
    model = sdpa_block(2, 2, 9, 40, 16, 16, guard=guard)
    feeds = sample_inputs(model)
    mask = np.zeros([2, 1, 9, 40], np.float32)
    mask[0, 0, :3, :] = -np.inf
    mask[0, 0, 3:6, ::3] = -np.inf
    mask[1, 0, :4, :] = np.finfo(np.float32).min
    feeds["mask"] = mask
    ref = ort_run(model, feeds)[0]
    assert np.isnan(ref).any() != guard
    res = run_variants(model, tmp_path, feeds)
    assert by_variant(res)["cpu-sg8"] == ["attention-subgroup"]


def test_attention_from_spirv(tmp_path):
    """The same kernel IR as SPIR-V (spirv-val runs at build): the same bits as the WGSL kernel."""
    model = sdpa_block(2, 3, 33, 45, 20, 12)
    feeds = sample_inputs(model)
    outs = []
    for targets in ("spirv", None):
        res = webiree.compile(model, tmp_path / str(targets), limits="gpu", targets=targets)
        assert strategies(res) == ["attention-online"]
        outs.append(webiree.InferenceSession(tmp_path / str(targets)).run(None, feeds)[0])
    assert_close(outs[1], ort_run(model, feeds)[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    outs = []
    for targets in ("spirv", None):     # lavapipe's own limits: the subgroup kernel
        res = webiree.compile(model, tmp_path / f"sg-{targets}", limits="adapter", targets=targets)
        assert strategies(res) == ["attention-subgroup"]
        outs.append(webiree.InferenceSession(tmp_path / f"sg-{targets}").run(None, feeds)[0])
    assert_close(outs[1], ort_run(model, feeds)[0])
    np.testing.assert_array_equal(outs[0], outs[1])


def test_attention_dynamic(tmp_path):
    """One build for sequences of 1..64 (rows and keys symbolic), run at 1, 17 and 64."""
    model = sdpa_block(1, 2, d=16, dv=16, dims=("seq", "seq"))
    res = webiree.compile(model, tmp_path / "build", dims={"seq": "1..64"})
    assert by_variant(res)["gpu"] == ["attention-online"] and by_variant(res)["cpu-sg8"] == ["attention-subgroup"]
    sessions = [webiree.InferenceSession(tmp_path / "build", variant=v) for v in ("gpu", "cpu-sg8")]
    rng = np.random.default_rng(1)
    for n, sess in [(n, s) for n in (1, 17, 64) for s in sessions]:
        feeds = {"q": rng.standard_normal([1, 2, n, 16]).astype(np.float32),
                 "k": rng.standard_normal([1, 2, n, 16]).astype(np.float32),
                 "v": rng.standard_normal([1, 2, n, 16]).astype(np.float32),
                 "mask": np.where(rng.random([1, 1, n, n]) < 0.2, -np.inf, 0).astype(np.float32)}
        assert_close(sess.run(None, feeds)[0], ort_run(model, feeds)[0], name=f"seq {n}")


def test_attention_not_fused(tmp_path):
    """Scores that are also an output, and a CPU-class target without subgroups, keep three
    dispatches."""
    res = run_variants(sdpa_block(1, 2, 16, 16, 8, 8, scores_out=True), tmp_path, variants=("gpu",))
    assert "attention-online" not in strategies(res) and len(strategies(res)) == 3
    res = run_variants(sdpa_block(1, 2, 16, 16, 8, 8), tmp_path / "cpu", variants=(None,), limits="cpu")
    assert strategies(res) == ["register-blocked", "row-per-invocation", "register-blocked"]


@pytest.mark.parametrize("tile", [(2, 16), (32, 1), (16, 2)])
def test_attention_forced_splits(tile, tmp_path):
    """Configurations a tuning table may choose (keys a block, splits a row: 16 splits of 2 keys,
    one split of 32, 2 of 16) over 45 keys, so that whole splits fall past S, against onnxruntime."""
    keys, splits = tile
    cfg = {"workgroup_size": [128, 1, 1], "tile": [keys, splits], "vector": 1, "strategy": "attention-online"}
    table = {"format": FORMAT, "adapter": {"device_class": "gpu"},
             "entries": {"attention b6 m33 d20 s45 dv12": {"config": cfg}}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    res = run_variants(sdpa_block(2, 3, 33, 45, 20, 12), tmp_path, variants=(None,), limits="gpu",
                       tuning=tmp_path / "t.json")
    got = res.module.info["dispatches"][0]["config"]
    assert got["strategy"] == "attention-online" and list(got["tile"]) == [keys, splits], got


def test_contrib_attention_fused(tmp_path):
    """onnxruntime's com.microsoft Attention (its K read as rows: the first product's trans_b),
    causal and with a 0/1 mask: its scores, softmax and x V one dispatch in every variant."""
    from .test_contrib_attention import _attention
    model, feeds = _attention(mask=np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], np.int32), unidirectional=1)
    res = run_variants(model, tmp_path, feeds)
    kinds = by_variant(res)
    assert kinds["gpu"].count("attention-online") == 1 and kinds["cpu-sg8"].count("attention-subgroup") == 1, kinds


@pytest.mark.parametrize("keep_io_types", [True, False])
def test_float16_attention_one_pass(keep_io_types, tmp_path):
    """A float16 model (onnxruntime's converter) rounds each probability to a half; fused, the
    probabilities are never stored, so that rounding is dropped and the kernels take one pass
    (online softmax) in every variant. Against the three dispatches of a build that does not fuse
    (a CPU-class target without subgroups, which rounds them) the difference is the probabilities'
    rounding: at most a half's step of the output, and against onnxruntime (which also sums in
    halves) within 3e-3."""
    from webiree.testing.models import float16_model
    model = float16_model(sdpa_block(2, 3, 33, 45, 20, 12), keep_io_types=keep_io_types)
    feeds = {k: v if keep_io_types else v.astype(np.float16) for k, v in sample_inputs(sdpa_block(2, 3, 33, 45, 20, 12)).items()}
    feeds["mask"][0, 0, :3, :] = -np.inf
    ref = ort_run(model, feeds)[0].astype(np.float32)
    halves = {k: v.astype(np.float16).astype(np.float32) for k, v in feeds.items()}
    exact = ort_run(sdpa_block(2, 3, 33, 45, 20, 12), halves)[0]
    res = webiree.compile(model, tmp_path / "build")
    kinds = by_variant(res)
    assert kinds["gpu"] == ["attention-online"] and kinds["cpu-sg8"] == ["attention-subgroup"], kinds
    assert res.program.ops[0].prob is None and res.program.ops[0].guard
    unfused = webiree.compile(model, tmp_path / "unfused", limits="cpu")
    assert strategies(unfused) == ["register-blocked", "row-per-invocation", "register-blocked"]
    three = webiree.InferenceSession(tmp_path / "unfused").run(None, feeds)[0].astype(np.float32)
    assert np.all(three[0, :, :3] == 0)     # the rows whose every key is masked: 0 (the guard)
    # each probability's rounding moves it by at most 2^-12 of itself, so a sum of p_j v_j by at most
    # 2^-12 max |v| of its head, and the two results' own roundings to halves by 2^-11 of each
    v_max = np.abs(feeds["v"].astype(np.float32)).max(axis=(2, 3), keepdims=True)
    step = np.float32(2.0 ** -12) * v_max + np.float32(2.0 ** -10) * np.abs(three)
    for v in ("gpu", "cpu", "cpu-sg8"):
        got = webiree.InferenceSession(tmp_path / "build", variant=v).run(None, feeds)[0].astype(np.float32)
        assert np.all(np.abs(got - three) <= step), (v, float(np.max(np.abs(got - three) / step)))
        # and no farther from the exact result (float32, of the same halves) than the rounding build
        assert np.abs(got - exact).mean() <= np.abs(three - exact).mean(), v
        np.testing.assert_allclose(got, ref, rtol=4e-3, atol=3e-3, err_msg=v)


def test_probability_epilogue_two_passes(tmp_path):
    """A softmax epilogue that is not a rounding (a head mask's factor, as Hugging Face's BERT
    multiplies the probabilities by) needs each probability's final value: the kernels take two
    passes over the keys (the row's maximum and sum, then the probabilities), in every variant,
    against onnxruntime."""
    model = sdpa_block(2, 3, 33, 45, 20, 12, head_mask=[1.0, 0.0, 0.5])
    feeds = sample_inputs(model)
    feeds["mask"][0, 0, :3, :] = -np.inf
    res = run_variants(model, tmp_path, feeds)
    assert by_variant(res)["gpu"] == ["attention-online"] and by_variant(res)["cpu-sg8"] == ["attention-subgroup"]
    assert res.program.ops[0].prob is not None and not res.program.ops[0].guard   # the guard is in prob


def test_attention_past_the_workgroup_grid(tmp_path):
    """More heads than workgroups along z: not fused, and the products' own clear LimitsError."""
    with pytest.raises(webiree.LimitsError, match="MatMul batch 70000 exceeds the workgroups per dimension limit"):
        webiree.compile(sdpa_block(1, 70000, 2, 2, 4, 4, mask=False), tmp_path / "build")
