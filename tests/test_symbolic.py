"""Symbolic shapes (issue #16): one build serves every input size in declared ranges.

Native runtime (wgpu-py over lavapipe) against onnxruntime; the browser and Pyodide run the same
kind of build in tests/test_symbolic_web.py. fp32 tolerance: assert_close's (1e-4 of the
output's scale), and every output's shape equals onnxruntime's.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import webiree
from webiree.compiler.driver import compile_model
from webiree.errors import FeedError, ShapeError, UnsupportedOpError
from webiree.module import format as F
from webiree.session import InferenceSession
from webiree.testing import models as M

from .conftest import assert_close, ort_run


def _session(model, **kw):
    r = compile_model(model, **kw)
    return r, InferenceSession.from_module(r.module, r.weights)


def _check(sess, model, feeds):
    got = sess.run(None, feeds)
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert_close(g, w)
    return got


def shape_arith_model():
    """MatMul + bias + Softmax over [1, seq, 64], a Reshape to [1, seq, 8, 8] whose shape comes from
    Shape -> Gather -> Unsqueeze -> Concat, a Transpose, a Range of seq positions, a ReduceMean
    over seq and a ConstantOfShape sized by seq."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "W"], ["y0"]), n("Add", ["y0", "B"], ["y"]), n("Softmax", ["y"], ["z"], axis=-1),
        n("Shape", ["x"], ["s"]), n("Gather", ["s", "i1"], ["g"], axis=0), n("Unsqueeze", ["g", "ax0"], ["gu"]),
        n("Concat", ["c1", "gu", "c8"], ["ns"], axis=0), n("Reshape", ["z", "ns"], ["r"]),
        n("Transpose", ["r"], ["heads"], perm=[0, 2, 1, 3]),
        n("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1),
        n("Range", ["zero", "g", "one"], ["pos"]),
        n("ConstantOfShape", ["gu"], ["ones"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])),
    ]
    inits = {"W": (rng.standard_normal((64, 64)) * 0.1).astype(np.float32),
             "B": rng.standard_normal(64).astype(np.float32), "c1": np.array([1], np.int64),
             "c8": np.array([8, 8], np.int64), "i1": np.array(1, np.int64), "ax0": np.array([0], np.int64),
             "zero": np.array(0, np.int64), "one": np.array(1, np.int64)}
    vi = helper.make_tensor_value_info
    return M.make_model(nodes, [vi("x", TensorProto.FLOAT, [1, "seq", 64])],
                        [vi("heads", TensorProto.FLOAT, [1, 8, "seq", 8]), vi("mean", TensorProto.FLOAT, [1, 1, 64]),
                         vi("pos", TensorProto.INT64, ["seq"]), vi("ones", TensorProto.FLOAT, ["seq"])], inits,
                        name="shape_arith", opset=13)


def test_one_build_runs_every_length_in_range():
    model = shape_arith_model()
    r, sess = _session(model, dims={"seq": "1..512"})
    assert r.module.symbols == [("seq", 1, 512)]
    assert [i.shape for i in sess.get_inputs()] == [[1, "seq", 64]]
    assert [o.shape for o in sess.get_outputs()] == [[1, 8, "seq", 8], [1, 1, 64], ["seq"], ["seq"]]
    assert any(c[0] == F.OP_DISPATCH_DYN for c in r.module.commands)
    for seq in (1, 7, 300, 512):
        x = np.random.default_rng(seq).standard_normal((1, seq, 64)).astype(np.float32)
        heads, mean, pos, ones = _check(sess, model, {"x": x})
        assert heads.shape == (1, 8, seq, 8) and pos.tolist() == list(range(seq)) and ones.shape == (seq,)


def test_input_shape_range_and_dim_flag_build_the_same_module():
    model = shape_arith_model()
    a = compile_model(model, dims={"seq": (1, 64)})
    b = compile_model(model, input_shapes={"x": [1, (1, 64), 64]})
    c = compile_model(model, input_shapes={"x": [1, "1..64", 64]})
    assert F.write_module(a.module) == F.write_module(b.module) == F.write_module(c.module)


def test_feeds_outside_the_ranges_name_the_dim():
    _, sess = _session(shape_arith_model(), dims={"seq": (2, 64)})
    cases = [((1, 65, 64), "dim 1 (seq) is 65, outside the build's range 2..64"),
             ((1, 1, 64), "dim 1 (seq) is 1, outside the build's range 2..64"),
             ((2, 5, 64), "has 2 at dim 0; the model fixes it at 1"),
             ((1, 5), "has rank 2; the model's input has rank 3")]
    for shape, message in cases:
        with pytest.raises(FeedError, match=message.replace("(", r"\(").replace(")", r"\)")):
            sess.run(None, {"x": np.zeros(shape, np.float32)})


def test_unbounded_or_unknown_dims_are_clear_errors():
    model = shape_arith_model()
    with pytest.raises(ShapeError, match=r"symbolic dim\(s\) \['seq'\] have no bound") as e:
        compile_model(model)
    assert "--dim seq=1..N" in e.value.hint
    with pytest.raises(ShapeError, match=r"--dim names no symbolic dim of the model's inputs: \['sequence'\]"):
        compile_model(model, dims={"sequence": (1, 8)})
    with pytest.raises(ShapeError, match="range 9..3 is empty"):
        compile_model(model, dims={"seq": "9..3"})
    with pytest.raises(ShapeError, match="is given as 1..8 and as 1..16"):
        compile_model(model, dims={"seq": (1, 8)}, input_shapes={"x": [1, (1, 16), 64]})


def test_data_dependent_sizes_stay_a_compile_error():
    vi = helper.make_tensor_value_info
    model = M.make_model([helper.make_node("NonZero", ["x"], ["nz"])], [vi("x", TensorProto.FLOAT, ["n"])],
                         [vi("nz", TensorProto.INT64, [1, "k"])], {})
    with pytest.raises(UnsupportedOpError, match="NonZero"):
        compile_model(model, dims={"n": (1, 16)})


def test_lone_matmul_over_a_symbolic_dim():
    """A MatMul whose only symbolic size is its own M: no expression loads the dims buffer, but the
    kernel reads its bounds from it (dce once dropped the buffer: a compiler bug at build)."""
    rng = np.random.default_rng(2)
    vi = helper.make_tensor_value_info
    model = M.make_model([helper.make_node("MatMul", ["x", "W"], ["y"])], [vi("x", TensorProto.FLOAT, ["seq", 70])],
                         [vi("y", TensorProto.FLOAT, ["seq", 13])],
                         {"W": rng.standard_normal((70, 13)).astype(np.float32)}, name="lone_matmul")
    _, sess = _session(model, dims={"seq": (1, 32)})
    for seq in (1, 5, 32):
        _check(sess, model, {"x": rng.standard_normal((seq, 70)).astype(np.float32)})


def test_pinned_dims_build_a_static_module():
    r = compile_model(shape_arith_model(), dims={"seq": 7})
    assert r.module.symbols == [] and not any(c[0] == F.OP_DISPATCH_DYN for c in r.module.commands)
    assert r.module.inputs[0].shape == (1, 7, 64) and r.module.inputs[0].regs == ()


def test_dynamic_module_round_trips():
    r = compile_model(shape_arith_model(), dims={"seq": (1, 512)})
    m = F.read_module(F.write_module(r.module))
    assert m.symbols == r.module.symbols and m.commands == r.module.commands
    assert [io.regs for io in m.outputs] == [io.regs for io in r.module.outputs]
    assert [io.shape for io in m.outputs] == [(1, 8, 512, 8), (1, 1, 64), (512,), (512,)]
    assert m.buffers[[b.kind for b in m.buffers].index("params")].size == 16     # a uniform array<vec4<i32>, 1>


@pytest.mark.slow
def test_bert_from_transformers_one_build_every_length(tmp_path):
    """A transformers BERT exported with symbolic batch and sequence axes, built once for batch
    1..2 and sequence 1..512, at lengths 1, 7, 64, 128 and 512 with the second sequence padded."""
    path = tmp_path / "bert.onnx"
    M.export_bert_dynamic(path)
    r, sess = _session(str(path), dims={"batch": (1, 2), "sequence": (1, 512)})
    pinned = compile_model(str(path), dims={"batch": 2, "sequence": 128})
    # the same kernels, sizes read at run time; but where the sizes are pinned the position ids
    # fold to constants, so the embeddings' sum is cheap enough to be the LayerNorm's prologue
    # (passes.PROLOGUE_COST), while for every length it stays a dispatch of its own; and pinned, each
    # layer's feed-forward pair (256 rows x 256) is one chained dispatch (passes.fuse_matmul_chains,
    # named after its first product), two products where the rows vary
    dynamic = [d.name for d in r.dispatches if d.name != "/m/embeddings/Add_1"]
    expanded = []
    for name in (d.name for d in pinned.dispatches):
        first = name.removesuffix(":chain")
        expanded += [first, dynamic[dynamic.index(first) + 1]] if name != first else [name]
    assert dynamic == expanded
    assert sum(d.name.endswith(":chain") for d in pinned.dispatches) == 2      # one a layer
    assert len(r.module.executables) <= len(pinned.module.executables) + 1    # the pair's second product
    model = onnx.load(str(path))
    for seq in (1, 7, 64, 128, 512):
        for batch in (1, 2):
            hidden, pooled = _check(sess, model, M.bert_feeds(batch, seq))
            assert hidden.shape == (batch, seq, 64) and pooled.shape == (batch, 64)


@pytest.mark.parametrize("target", ["default", "cpu"])
def test_cnn_with_symbolic_height_and_width(target):
    """GPU kernels and CPU kernels; on CPU the 1x1 convolution's matmul over N = H/2 * W/2 holds a
    vec4 variant for N % 4 == 0 (32 x 32) beside the scalar one (45 x 61, 96 x 17)."""
    model = M.small_cnn(size=None)
    r, sess = _session(model, dims={"height": (16, 96), "width": (16, 96)}, target=target)
    versioned = [d for d in r.module.info["dispatches"] if "aligned" in d["config"]]
    assert len(versioned) == (1 if target == "cpu" else 0)
    for h, w in ((32, 32), (45, 61), (96, 17)):
        x = np.random.default_rng(h).standard_normal((1, 3, h, w)).astype(np.float32)
        (probs,) = _check(sess, model, {"image": x})
        assert probs.shape == (1, 10)


def test_detector_at_320_and_640_and_a_size_the_graph_cannot_take():
    model = M.small_detector()
    r, sess = _session(model, dims={"height": (320, 640), "width": (320, 640)})
    assert any(c[0] == F.OP_ASSERT_EQ for c in r.module.commands)     # 1/8 upsampled meets 1/4
    for h, w in ((320, 320), (640, 640), (480, 352)):
        x = np.random.default_rng(h + w).standard_normal((1, 3, h, w)).astype(np.float32)
        scores, boxes = _check(sess, model, {"image": x})
        assert scores.shape == (1, 8, h // 4, w // 4) and boxes.shape == (1, (h // 8) * (w // 8), 8)
    with pytest.raises(FeedError, match=r"cannot take these sizes \(height=324, width=320\): Concat"):
        sess.run(None, {"image": np.zeros((1, 3, 324, 320), np.float32)})


def test_cli_builds_and_inspects_a_dynamic_site(tmp_path, capsys):
    from webiree.cli import main
    path = tmp_path / "m.onnx"
    onnx.save(shape_arith_model(), path)
    assert main(["build", str(path), "--out", str(tmp_path / "site"), "--dim", "seq=1..128"]) == 0
    assert main(["inspect", str(tmp_path / "site")]) == 0
    out = capsys.readouterr().out
    assert "seq in 1..128" in out and "input  x: [1, seq, 64]" in out and "planned for the largest sizes: seq=128" in out
    sess = webiree.InferenceSession(str(tmp_path / "site"))
    x = np.ones((1, 5, 64), np.float32)
    assert [a.shape for a in sess.run(None, {"x": x})] == [(1, 8, 5, 8), (1, 1, 64), (5,), (5,)]


def test_interpreter_run_takes_shapes():
    """The pure-Python interpreter's run() (what a Python caller without numpy uses) takes
    (data, type, shape) for a dynamic module and returns this run's outputs."""
    import array

    from webiree.hal_webgpu.hal import run_sync
    model = shape_arith_model()
    _, sess = _session(model, dims={"seq": (1, 64)})
    x = np.random.default_rng(3).standard_normal((1, 5, 64)).astype(np.float32)
    out = run_sync(sess.interp.run({"x": (array.array("f", x.ravel().tolist()), 1, (1, 5, 64))}))
    assert sess.interp.last_shapes["heads"] == (1, 8, 5, 8) and sess.interp.last_shapes["pos"] == (5,)
    heads, _ = out["heads"]
    want = ort_run(model, {"x": x})[0]
    assert len(heads) == want.size
    assert_close(np.asarray(heads, np.float32).reshape(want.shape), want)


def test_concat_of_a_past_that_may_be_empty():
    """A KV cache's Concat(past, new) along a symbolic axis whose range starts at 0: the past is
    kept (empty only at some sizes) and runs at length 0 like onnxruntime, as a merged decoder's
    first step does; its offsets are symbolic."""
    vi = helper.make_tensor_value_info
    model = M.make_model([helper.make_node("Concat", ["past", "x"], ["cat"], axis=2),
                          helper.make_node("Mul", ["cat", "two"], ["y"])],
                         [vi("past", TensorProto.FLOAT, [1, 2, "past", 4]), vi("x", TensorProto.FLOAT, [1, 2, "seq", 4])],
                         [vi("y", TensorProto.FLOAT, [1, 2, None, 4])], {"two": np.array(2.0, np.float32)},
                         name="kv_concat")
    _, sess = _session(model, dims={"past": (0, 8), "seq": (1, 4)})
    rng = np.random.default_rng(4)
    for past, seq in ((0, 3), (5, 1), (8, 4)):
        (y,) = _check(sess, model, {"past": rng.standard_normal((1, 2, past, 4)).astype(np.float32),
                                    "x": rng.standard_normal((1, 2, seq, 4)).astype(np.float32)})
        assert y.shape == (1, 2, past + seq, 4)


def test_a_model_proto_is_left_as_it_was(tmp_path):
    """Pinning or bounding dims does not write into the caller's ModelProto: the same proto builds
    again with the same dims (a default build imports it once per kernel variant)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=M.IR_VERSION)
    before = m.SerializeToString()
    for _ in range(2):
        webiree.compile(m, tmp_path / "b", dims={"batch": 2, "n": (1, 8)})
        assert m.SerializeToString() == before
    got = InferenceSession(tmp_path / "b").run(None, {"x": np.array([[-1, 2, -3, 4]] * 2, np.float32)})[0]
    np.testing.assert_array_equal(got, [[0, 2, 0, 4]] * 2)


def test_pre_encoded_runs_follow_each_size():
    """With pre-encoding on (the default on GPUs; lavapipe's default is off), a repeated size's
    run submits the commands encoded during the run before, and a new size encodes its own:
    every run matches onnxruntime, and exactly the repeats were pre-encoded."""
    model = shape_arith_model()
    r = compile_model(model, dims={"seq": (1, 64)})
    sess = InferenceSession.from_module(r.module, r.weights, pre_encode=True)
    rng = np.random.default_rng(3)
    sizes = [5, 5, 5, 9, 9, 9, 9, 5, 5, 5, 1]
    for seq in sizes:
        _check(sess, model, {"x": rng.standard_normal((1, seq, 64)).astype(np.float32)})
    # a size's second run in a row pre-encodes its next: the 3rd 5, the 3rd and 4th 9, and the
    # second stretch of 5s all three (their buffer waited while the 9s ran)
    assert sess.driver.pre_encoded_submits == 1 + 2 + 3
