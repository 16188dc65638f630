"""Depthwise convolutions on GPUs. The default is the row-block kernel (2 outputs a row per
invocation, 4 where dilated: the H200's tuning tables); the depthwise-shared kernel
(kernels/conv.py `_conv_depthwise_shared`: a workgroup per tile of one channel's outputs, the
tile's input window in workgroup memory) is a tuning candidate, chosen here through a tuning table.
The CI adapter (lavapipe) runs GPU kernels through `limits="gpu"`. Against onnxruntime: tiles that
do not divide the output, strides, dilations, 5x5 windows, channel multipliers, a batch, a fused
prologue and epilogue, SPIR-V, other tiles, and the cases that keep another kernel."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper

import webiree
from webiree.testing.models import make_model, sample_inputs
from webiree.wgsl_codegen.tuning import FORMAT

from .conftest import assert_close, ort_run
from .test_kernel_variants import strategies
from .test_ops import vi


def depthwise(c, size, k=3, stride=1, dilation=1, pad=1, mult=1, batch=1, relu_before=False, dims=None):
    """x -> [Relu] -> Conv (group = c, `mult` outputs a channel, bias) -> Clip(0, 6) -> y."""
    rng = np.random.default_rng(c * 100 + size[0])
    h, w = size
    x = "x"
    nodes = []
    if relu_before:
        nodes.append(helper.make_node("Relu", ["x"], ["xr"]))
        x = "xr"
    nodes += [helper.make_node("Conv", [x, "w", "b"], ["c"], group=c, strides=[stride] * 2,
                               dilations=[dilation] * 2, pads=[pad] * 4),
              helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    inits = {"w": rng.standard_normal([c * mult, 1, k, k]).astype(np.float32),
             "b": rng.standard_normal([c * mult]).astype(np.float32),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    return make_model(nodes, [vi("x", dims or [batch, c, h, w])], [vi("y", None)], inits)


def shared_table(model, tmp_path, wg=None, tile=None):
    """A tuning table giving the model's convolution the depthwise-shared kernel: the tile
    `webiree tune` times first, or (wg, tile)."""
    from webiree.ir.program import Conv
    from webiree.target import Target
    from webiree.wgsl_codegen.config import depthwise_shared, planning_view
    from webiree.wgsl_codegen.tuning import problem_key
    (op,) = [op for op in webiree.compile(model, tmp_path / "plain", limits="gpu").program.ops
             if isinstance(op, Conv)]
    if wg is None:
        cfg = depthwise_shared(planning_view(op), Target.resolve("gpu").as_limits()).as_dict()
    else:
        cfg = {"workgroup_size": list(wg), "tile": list(tile), "vector": 1, "strategy": "depthwise-shared"}
    table = {"format": FORMAT, "adapter": {"device_class": "gpu"}, "entries": {problem_key(op): {"config": cfg}}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    return tmp_path / "t.json"


def run_gpu(model, tmp_path, feeds=None, **kw):
    feeds = feeds or sample_inputs(model)
    res = webiree.compile(model, tmp_path / "build", limits="gpu", **kw)
    got = webiree.InferenceSession(tmp_path / "build").run(None, feeds)
    ref = ort_run(model, feeds)
    assert len(got) == len(ref) == 1
    assert_close(got[0], ref[0])
    return res, got[0]


def configs(res):
    return [(d["config"]["strategy"], tuple(d["config"]["workgroup_size"]), tuple(d["config"]["tile"]))
            for d in res.module.info["dispatches"]]


@pytest.mark.parametrize("kw", [
    dict(c=4, size=(9, 11)),                               # tiles past both edges
    dict(c=8, size=(7, 7)),                                # one output an invocation (MobileNetV2's 7 x 7)
    dict(c=6, size=(15, 13), stride=2),                    # stride 2 (pads 1: the window past the image)
    dict(c=5, size=(20, 21), dilation=2, pad=2),           # DeepLabV3's dilated convolutions
    dict(c=3, size=(17, 19), k=5, stride=2, pad=2),        # 5 x 5 windows
    dict(c=4, size=(12, 12), mult=2),                      # two outputs a channel (group < M)
    dict(c=3, size=(10, 9), batch=2, relu_before=True),    # a batch; the input through a fused prologue
    dict(c=2, size=(33, 65), dilation=4, pad=4),           # rows of 65: tiles of 33 columns
    dict(c=2, size=(8, 8), pad=0),                         # no padding: tiles that fit exactly
])
def test_depthwise_shared(kw, tmp_path):
    m = depthwise(**kw)
    res, _ = run_gpu(m, tmp_path, tuning=shared_table(m, tmp_path))
    assert [s for s, _, _ in configs(res)] == ["depthwise-shared"], configs(res)


@pytest.mark.parametrize("kw,tile", [(dict(c=6, size=(15, 13), stride=2), (1, 2)),
                                     (dict(c=5, size=(20, 21), dilation=2, pad=2), (1, 4))])
def test_depthwise_default_on_gpus(kw, tile, tmp_path):
    """A GPU build's depthwise convolutions: row-block, 128 invocations, 2 outputs a row (4
    dilated); the stem's 3 input channels keep the direct kernel."""
    res, _ = run_gpu(depthwise(**kw), tmp_path)
    assert configs(res) == [("row-block", (128, 1, 1), tile)]
    rng = np.random.default_rng(2)
    stem = make_model([helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1] * 4)],
                      [vi("x", [1, 3, 21, 21])], [vi("y", None)],
                      {"w": rng.standard_normal([8, 3, 3, 3]).astype(np.float32)})
    res, _ = run_gpu(stem, tmp_path / "stem")
    assert strategies(res) == ["direct"]


def test_depthwise_shared_plan():
    """The first tile tuning times: 2 x 2 outputs an invocation, rows spread evenly over tiles
    (65 columns: 3 tiles of 11 invocations), one output an invocation on a 7 x 7 image."""
    from webiree.ir import program as P
    from webiree.wgsl_codegen import config as C
    from webiree.wgsl_codegen.kernels.conv import depthwise_window
    from webiree.target import Target
    limits = Target.resolve("gpu").as_limits()

    def plan(c, size, dilation=1):
        op = P.Conv("c", "y", [], x="x", w="w", x_shape=(1, c, size, size), w_shape=(c, 1, 3, 3),
                    out_shape=(1, c, size, size), strides=(1, 1), dilations=(dilation,) * 2,
                    pads=(dilation,) * 4, group=c)
        cfg = C.depthwise_shared(op, limits)
        return cfg.strategy.value, tuple(cfg.workgroup_size), tuple(cfg.tile), depthwise_window(op, cfg)
    assert plan(960, 65, 4) == ("depthwise-shared", (11, 11, 1), (2, 2), (30, 30))
    assert plan(960, 7) == ("depthwise-shared", (7, 7, 1), (1, 1), (9, 9))
    assert plan(32, 112) == ("depthwise-shared", (14, 8, 1), (2, 2), (18, 30))


def test_depthwise_shared_from_spirv(tmp_path):
    """The same kernel IR as SPIR-V (workgroup memory, a barrier): the same bits as WGSL."""
    m = depthwise(c=5, size=(20, 21), dilation=2, pad=2)
    feeds = sample_inputs(m)
    table = shared_table(m, tmp_path)
    _, spv = run_gpu(m, tmp_path / "spv", feeds, targets="spirv", tuning=table)
    _, wgsl = run_gpu(m, tmp_path / "wgsl", feeds, tuning=table)
    np.testing.assert_array_equal(spv, wgsl)


@pytest.mark.parametrize("wg,tile", [((8, 16, 1), (4, 2)), ((32, 4, 1), (1, 4)), ((4, 2, 1), (1, 1))])
def test_depthwise_shared_tuned_tiles(wg, tile, tmp_path):
    """Other tiles (more rows than width, wide rows, 8 invocations), on a ragged image, bit for
    bit the first tile's result (each output sums its window in the same order) and within
    tolerance of onnxruntime."""
    m = depthwise(c=3, size=(19, 23), stride=1)
    feeds = sample_inputs(m)
    _, ref = run_gpu(m, tmp_path / "first", feeds, tuning=shared_table(m, tmp_path / "first"))
    res, got = run_gpu(m, tmp_path / "tuned", feeds, tuning=shared_table(m, tmp_path / "tuned", wg, tile))
    assert configs(res) == [("depthwise-shared", wg, tile)]
    np.testing.assert_array_equal(got, ref)


def test_depthwise_not_shared(tmp_path):
    """The depthwise-shared kernel refuses a grouped convolution with two input channels a group
    (direct) and a dynamic build (row-block, also on GPUs, for every size in its ranges)."""
    rng = np.random.default_rng(3)
    grouped = make_model([helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1] * 4)],
                         [vi("x", [1, 4, 9, 9])], [vi("y", None)],
                         {"w": rng.standard_normal([4, 2, 3, 3]).astype(np.float32)})
    from webiree.wgsl_codegen.kernels import check
    from webiree.wgsl_codegen.kernels.common import Strategy
    from webiree.ir.program import Conv
    res, _ = run_gpu(grouped, tmp_path / "grouped")
    assert strategies(res) == ["direct"]
    (op,) = [op for op in res.program.ops if isinstance(op, Conv)]
    assert "depthwise convolutions only" in check(Strategy.DEPTHWISE_SHARED, op, {})
    dyn = depthwise(c=3, size=(0, 0), dims=[1, 3, "h", "w"])
    res = webiree.compile(dyn, tmp_path / "dyn", limits="gpu", dims={"h": "1..40", "w": "1..40"})
    assert strategies(res) == ["row-block"]
    (op,) = [op for op in res.program.ops if isinstance(op, Conv)]
    assert check(Strategy.DEPTHWISE_SHARED, op, {}) == "needs static sizes"
    sess = webiree.InferenceSession(tmp_path / "dyn")
    for h, w in ((5, 7), (40, 33)):
        feeds = {"x": np.random.default_rng(h).standard_normal([1, 3, h, w]).astype(np.float32)}
        assert_close(sess.run(None, feeds)[0], ort_run(dyn, feeds)[0], name=f"{h}x{w}")
