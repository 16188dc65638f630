"""Chained products in one dispatch (compiler/passes.py fuse_matmul_chains,
kernels/matmul_chain.py): a feed-forward block x @ W1 + b1, ReLU, @ W2 + b2 + x, scaled and
shifted (MobileBERT's NoNorm), against onnxruntime, with the GPU planner's configuration (the
default limits), the CPU planner's (lavapipe's subgroups) and forced ones, rows and chunks that do
not divide evenly included."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

import webiree
from webiree.wgsl_codegen.tuning import FORMAT
from webiree.testing.models import make_model, sample_inputs

from .conftest import assert_close, ort_run
from .test_kernel_variants import cpu_limits, strategies  # noqa: F401  (a fixture)
from .test_ops import vi

F = TensorProto.FLOAT


def ffn(m, k, h, n, residual=True, seed=0):
    """[m, k] -> [m, n]: (relu(x @ W1 + b1) @ W2 + b2 (+ x)) * g + s."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["t1"]), helper.make_node("Add", ["t1", "b1"], ["t2"]),
             helper.make_node("Relu", ["t2"], ["t3"]), helper.make_node("MatMul", ["t3", "w2"], ["t4"]),
             helper.make_node("Add", ["t4", "b2"], ["t5"])]
    last = "t5"
    if residual:
        nodes.append(helper.make_node("Add", ["t5", "x"], ["t6"]))
        last = "t6"
    nodes += [helper.make_node("Mul", [last, "g"], ["t7"]), helper.make_node("Add", ["t7", "s"], ["y"])]
    inits = {"w1": rng.standard_normal([k, h]) / np.sqrt(k), "b1": rng.standard_normal([h]),
             "w2": rng.standard_normal([h, n]) / np.sqrt(h), "b2": rng.standard_normal([n]),
             "g": rng.standard_normal([n]), "s": rng.standard_normal([n])}
    return make_model(nodes, [vi("x", [m, k])], [vi("y", [m, n])],
                      {a: v.astype(np.float32) for a, v in inits.items()})


def run(model, tmp_path, limits=None, tuning=None):
    feeds = sample_inputs(model)
    res = webiree.compile(model, tmp_path / "build", limits=limits, tuning=tuning)
    got = webiree.InferenceSession(tmp_path / "build").run(None, feeds)
    assert len(got) == 1
    assert_close(got[0], ort_run(model, feeds)[0])
    return res


@pytest.mark.parametrize("m,k,h,n", [(128, 128, 512, 128),     # MobileBERT's
                                     (7, 20, 36, 20),          # odd rows, K and N under a step
                                     (33, 64, 200, 64)])       # H not a multiple of a chunk
def test_chain_gpu_planner(m, k, h, n, tmp_path):
    res = run(ffn(m, k, h, n), tmp_path)
    assert strategies(res) == ["chain-shared"]
    assert len(res.module.info["dispatches"][0]["nodes"]) == 8     # every ONNX node in the one dispatch


@pytest.mark.parametrize("m,k,h,n", [(128, 128, 512, 128), (7, 20, 36, 20), (33, 64, 200, 64),
                                     (9, 96, 72, 96)])     # K: whole steps of 4 x 8, H: steps and a tail
def test_chain_cpu_planner(m, k, h, n, tmp_path, cpu_limits):  # noqa: F811
    res = run(ffn(m, k, h, n), tmp_path, limits=cpu_limits)
    assert strategies(res) == ["chain-subgroup"]
    res = run(ffn(m, k, h, n), tmp_path / "nosg", limits={"device_class": "cpu"})
    assert strategies(res) == ["chain-shared"]


def test_chain_not_formed(tmp_path):
    """An intermediate above CHAIN_INTERMEDIATE values, or read elsewhere, stays two products."""
    res = run(ffn(128, 64, 1024, 64), tmp_path)
    assert strategies(res).count("chain-shared") == 0 and len(strategies(res)) == 2


def test_chain_subgroup_in_parts(tmp_path, cpu_limits):  # noqa: F811
    """The intermediate in 4 parts of 15 vec4s (a ragged chunk, a tail of 7 vec4s), the partial
    sums kept between parts (forced by a tuning table: the planner takes parts only where not one
    row fits), against onnxruntime."""
    cfg = {"workgroup_size": [8, 1, 1], "tile": [8, 1, 1, 1, 4], "vector": 4, "strategy": "chain-subgroup"}
    table = {"format": FORMAT, "adapter": {"device_class": "cpu"},
             "entries": {"matmulchain m40 k32 h240 n32": {"config": cfg}}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    res = run(ffn(40, 32, 240, 32), tmp_path, limits=cpu_limits, tuning=tmp_path / "t.json")
    got = res.module.info["dispatches"][0]["config"]
    assert got["strategy"] == "chain-subgroup" and list(got["tile"]) == [8, 1, 1, 1, 4], got


@pytest.mark.parametrize("which", ["gpu", "cpu-subgroups"])
def test_chain_from_spirv(which, tmp_path, cpu_limits):  # noqa: F811
    """The same kernel IR as SPIR-V (spirv-val runs at build): the same bits as the WGSL kernel."""
    model = ffn(33, 64, 200, 64)
    limits = cpu_limits if which == "cpu-subgroups" else None
    feeds = sample_inputs(model)
    outs = []
    for targets in ("spirv", None):
        res = webiree.compile(model, tmp_path / str(targets), limits=limits, targets=targets)
        assert strategies(res) == ["chain-subgroup" if limits else "chain-shared"]
        outs.append(webiree.InferenceSession(tmp_path / str(targets)).run(None, feeds)[0])
    assert_close(outs[1], ort_run(model, feeds)[0])
    np.testing.assert_array_equal(outs[0], outs[1])
