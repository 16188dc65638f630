"""The foundation's end-to-end promises: fused dispatches, buffer reuse,
a documented module format, reproducible builds, the onnxruntime-style API."""

from __future__ import annotations

import numpy as np
import pytest

import webiree
from webiree.hal_webgpu.hal import Ready, run_sync
from webiree.hal_webgpu.interpreter import Interpreter
from webiree.module import format as F
from webiree.testing import models

from .conftest import assert_close, check_model, ort_run


def test_mlp_matches_onnxruntime(tmp_path):
    res = check_model(models.mlp(), tmp_path)
    kinds = [d.kind for d in res.dispatches]
    # Gemm+bias+Relu, MatMul+bias+Tanh, Gemm(alpha, beta*C), Softmax
    assert kinds == ["matmul", "matmul", "matmul", "softmax"], kinds


def test_small_cnn_fuses_and_reuses_memory(tmp_path):
    res = check_model(models.small_cnn(), tmp_path)
    by_node = {n: d for d in res.dispatches for n in d.nodes}
    # conv + bias + ReLU is one dispatch; so is depthwise conv + Clip, and 1x1 conv + sigmoid-gate
    assert by_node["stem"] is by_node["stem_relu"]
    assert by_node["dw"] is by_node["relu6"]
    assert by_node["pw"] is by_node["gate"] is by_node["swish"]
    assert by_node["conv3"] is by_node["residual"]
    assert len(res.dispatches) < len(models.small_cnn().graph.node)
    plan = res.plan
    assert plan.arena_peak < plan.intermediates_sum, plan.summary()
    assert plan.arena_peak <= 1.25 * plan.max_live


def test_small_constants_stack_to_fuse_within_eight_bindings(tmp_path):
    """A product followed by a chain of per-channel constants and a residual (MobileBERT's dense
    + bias + residual, then NoNorm's x * gamma + beta, twice) reads ten tensors: the chain's
    constants are stacked side by side into one (passes._stack_constants), so the whole chain is
    the product's epilogue, one dispatch within WebGPU's 8 storage bindings. 128 values a channel
    (512 bytes): too large for the constant table, which would hold them in one binding anyway.
    A second build in the same process writes the same module (the stack's name is per program)."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(3)
    n = 128
    consts = {f"c{i}": rng.standard_normal([n]).astype(np.float32) for i in range(6)}
    consts["w"] = rng.standard_normal([16, n]).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y0"]),
             helper.make_node("Add", ["y0", "c0"], ["y1"]),
             helper.make_node("Add", ["y1", "r"], ["y2"]),
             helper.make_node("Mul", ["y2", "c1"], ["y3"]),
             helper.make_node("Add", ["y3", "c2"], ["y4"]),
             helper.make_node("Mul", ["y4", "c3"], ["y5"]),
             helper.make_node("Add", ["y5", "c4"], ["y6"]),
             helper.make_node("Mul", ["y6", "c5"], ["y"])]
    vi = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    m = models.make_model(nodes, [vi("x", [8, 16]), vi("r", [8, n])], [vi("y", [8, n])], consts)
    res = check_model(m, tmp_path)
    assert [d.kind for d in res.dispatches] == ["matmul"], [(d.kind, d.nodes) for d in res.dispatches]
    assert len(res.dispatches[0].nodes) == len(nodes)
    stacks = [t for t in res.program.tensors.values() if ":stack" in t.name]
    assert [t.shape for t in stacks] == [(6 * n,)], [(t.name, t.shape) for t in stacks]   # c0..c5 side by side
    builds = [tmp_path / "a", tmp_path / "b"]
    for b in builds:
        webiree.compile(m, b)
    assert [(b / f).read_bytes() for f in ("model.wrm", "weights.bin") for b in builds][::2] == \
        [(b / f).read_bytes() for f in ("model.wrm", "weights.bin") for b in builds][1::2]


def test_inspect_shows_fusion_and_memory(tmp_path):
    from webiree.module.dump import describe_build

    webiree.compile(models.small_cnn(), tmp_path / "b")
    text = describe_build(tmp_path / "b")
    assert "fuses ['stem', 'stem_relu']" in text
    assert "memory plan: arena peak" in text and "sum of intermediates" in text
    assert "dispatches: 9" in text


def test_session_api_like_onnxruntime(tmp_path):
    webiree.compile(models.mlp(batch=3), tmp_path / "b")
    sess = webiree.InferenceSession(tmp_path / "b")
    (i,) = sess.get_inputs()
    assert (i.name, i.shape, i.type) == ("x", [3, 64], "tensor(float)")
    assert [o.name for o in sess.get_outputs()] == ["probs", "logits"]
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    logits_only = sess.run(["logits"], {"x": x})
    both = sess.run(None, {"x": x})
    assert len(logits_only) == 1 and len(both) == 2
    np.testing.assert_array_equal(logits_only[0], both[1])
    for _ in range(3):  # repeated runs give the same answer
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], both[0])


def test_build_is_reproducible(tmp_path):
    for d in ("a", "b"):
        webiree.compile(models.small_cnn(), tmp_path / d)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert files
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_output_folder_layout(tmp_path):
    import json
    webiree.compile(models.mlp(), tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["model"] == "mlp" and m["webiree_version"] == webiree.__version__
    assert m["inputs"] == [{"name": "x", "shape": [4, 64], "type": "float32"}]
    assert (tmp_path / m["files"]["module"]).stat().st_size == m["sizes"]["module_bytes"]
    assert (tmp_path / m["files"]["weights"]).stat().st_size == m["sizes"]["weights_bytes"]
    assert all((tmp_path / "shaders" / s).exists() for s in m["files"]["shaders"])


def test_module_round_trip(tmp_path):
    res = webiree.compile(models.small_cnn(), tmp_path)
    raw = (tmp_path / "model.wrm").read_bytes()
    m = F.read_module(raw)
    assert F.write_module(m) == raw
    assert [e.code for e in m.executables] == [e.code for e in res.module.executables]


@pytest.mark.parametrize("cut", [0, 3, 16, 40, -1])
def test_module_reader_rejects_damage(tmp_path, cut):
    webiree.compile(models.mlp(), tmp_path)
    raw = (tmp_path / "model.wrm").read_bytes()
    with pytest.raises(F.ModuleFormatError):
        F.read_module(raw[:cut] if cut >= 0 else b"XXXX" + raw[4:])


class RecordingDriver:
    """A HAL driver that records calls, for testing the interpreter without a GPU."""

    def __init__(self):
        self.calls = []

    def limits(self):
        return {}

    def create_buffer(self, size, kind, label=""):
        return (kind, size, label)

    def write_buffer(self, buffer, offset, data):
        self.calls.append(("write", buffer[2], offset, bytes(data)))

    def create_pipeline(self, name, fmt, code, entry, bindings):
        return Ready(name)

    def create_bind_group(self, pipeline, entries):
        return [(slot, buf[2], off, size) for slot, buf, off, size in entries]

    def submit(self, items, profile=False):
        self.calls.append(("submit", [it[3] if it[0] == "dispatch" else ("copy",) + it[2:3] + it[4:] for it in items]))
        return Ready(None)

    def read_buffer(self, buffer, offset, size):
        return Ready(bytes(size))


def test_interpreter_shape_arithmetic_registers():
    """DISPATCH_DYN takes workgroup counts computed by LOAD_DIM / ARITH."""
    m = F.Module(
        executables=[F.Executable("k", "wgsl", b"", "main", (64, 1, 1), [(0, True), (1, False)])],
        buffers=[F.BufferInfo("input", 4000, 0, "x"), F.BufferInfo("arena", 4000, 0, "arena")],
        inputs=[F.IOInfo("x", "f32", 1, (10, 100), 0, 0, 4000)],
        outputs=[F.IOInfo("y", "f32", 1, (10, 100), 1, 0, 4000)],
        commands=[(F.OP_UPLOAD_INPUT, 0), (F.OP_LOAD_DIM, 0, 0, 0), (F.OP_LOAD_DIM, 1, 0, 1),
                  (F.OP_ARITH, 2, 2, 0, 1), (F.OP_SET_REG, 3, 64), (F.OP_ARITH, 4, 4, 2, 3),
                  (F.OP_SET_REG, 5, 1),
                  (F.OP_DISPATCH_DYN, 0, 4, 5, 5, [(0, 1, 0, 4000), (1, 0, 0, 4000)]), (F.OP_READBACK, 0)],
        limits={}, info={}, registers=6)
    m2 = F.read_module(F.write_module(m))
    drv = RecordingDriver()
    it = Interpreter(m2, drv, b"")
    run_sync(it.prepare())
    out, _ = run_sync(it.run_raw({"x": bytes(4000)}))
    submit = [c for c in drv.calls if c[0] == "submit"][0][1]
    assert submit[0] == (16, 1, 1)          # ceil(10 * 100 / 64)
    assert out["y"] == bytes(4000)


def test_weights_pages_respect_max_buffer_size(tmp_path):
    """Constants are split into pages no larger than maxBufferSize."""
    model = models.mlp(sizes=(256, 256, 10))
    limits = {"max_buffer_size": 300_000, "max_storage_buffer_binding_size": 300_000}
    res = webiree.compile(model, tmp_path, limits=limits)
    pages = [b for b in res.module.buffers if b.kind == "weights"]
    assert len(pages) >= 2 and all(p.size <= 300_000 for p in pages)
    x = models.sample_inputs(model)
    got = webiree.InferenceSession(tmp_path).run(None, x)
    for g, r in zip(got, ort_run(model, x), strict=True):
        assert_close(g, r)


def test_external_data_and_bytes_input(tmp_path):
    """A model saved with external data compiles from its path; raw bytes compile too."""
    import onnx

    model = models.mlp()
    path = tmp_path / "ext" / "mlp.onnx"
    path.parent.mkdir()
    to_save = onnx.ModelProto()
    to_save.CopyFrom(model)     # saving with external data rewrites the proto in place
    onnx.save(to_save, path, save_as_external_data=True, all_tensors_to_one_file=True, location="mlp.data",
              size_threshold=0)
    assert (tmp_path / "ext" / "mlp.data").exists()
    x = models.sample_inputs(model)
    ref = ort_run(model, x)
    webiree.compile(path, tmp_path / "a")
    webiree.compile(model.SerializeToString(), tmp_path / "b")
    for d in ("a", "b"):
        for g, r in zip(webiree.InferenceSession(tmp_path / d).run(None, x), ref, strict=True):
            assert_close(g, r)
    onnx_bytes = onnx.load(str(path), load_external_data=False).SerializeToString()
    with pytest.raises(webiree.ModelError, match="external"):
        webiree.compile(onnx_bytes, tmp_path / "c")


def test_hold_clocks_spins_only_a_gpu():
    """A benchmark's clock hold (wgpu_driver.hold_clocks) keeps a GPU busy for the time asked and
    leaves a CPU adapter (lavapipe here) alone: no spinning where there are no clocks to raise."""
    from webiree.hal_webgpu.wgpu_driver import adapter_info, hold_clocks

    kind = adapter_info().get("adapter_type", "").lower().replace(" ", "")
    spent = hold_clocks(0.05)
    if kind in ("discretegpu", "integratedgpu"):
        assert 0.05 <= spent < 5.0, spent
    else:
        assert kind == "cpu" and spent == 0.0, (kind, spent)


def test_bench_command_reports_correct_results(tmp_path, capsys):
    """`webiree bench` runs end to end (a smoke test of the command, not a timing test)."""
    import json

    import onnx

    from webiree.cli import main

    onnx.save(models.mlp(), tmp_path / "mlp.onnx")
    assert main(["bench", str(tmp_path / "mlp.onnx"), "--runs", "2", "--warmup", "1", "--submit-chunk", "2",
                 "--json", str(tmp_path / "r.json")]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["results"]["webiree"]["rel_err"] <= 1e-4
    assert r["results"]["webiree-chunks-of-2"]["rel_err"] <= 1e-4
    assert r["dispatches"] == 4 and r["memory"]["ratio"] <= 1.25
    assert "x webiree" in capsys.readouterr().out


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_submit_in_chunks_gives_the_same_results(chunk, tmp_path):
    """submit_chunk=N submits every N dispatches (copies ride along); results do not change."""
    model = models.small_cnn()
    feeds = models.sample_inputs(model)
    webiree.compile(model, tmp_path / "b")
    one = webiree.InferenceSession(tmp_path / "b").run(None, feeds)
    sess = webiree.InferenceSession(tmp_path / "b", submit_chunk=chunk)
    for _ in range(2):
        for g, w in zip(sess.run(None, feeds), one, strict=True):
            np.testing.assert_array_equal(g, w)


def test_nodes_out_of_order_are_sorted_on_import(tmp_path):
    """A valid graph written out of topological order (as some converters do) builds and runs like
    the ordered one; the order of independent nodes is kept."""
    import onnx

    from webiree.compiler.importer import sort_nodes

    model = models.tiny_attention()
    shuffled = onnx.ModelProto()
    shuffled.CopyFrom(model)
    nodes = list(shuffled.graph.node)
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(reversed(nodes))
    fixed = sort_nodes(shuffled).graph.node
    seen = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer} | {""}
    for n in fixed:          # every node reads only what is produced before it
        assert set(n.input) <= seen, n.name
        seen.update(n.output)
    assert sorted(n.name for n in fixed) == sorted(n.name for n in nodes)
    assert sort_nodes(model) is model
    feeds = models.sample_inputs(model)
    webiree.compile(shuffled, tmp_path / "s")
    got = webiree.InferenceSession(tmp_path / "s").run(None, feeds)
    ref = ort_run(model, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        assert_close(g, r)


def test_a_cycle_is_a_model_error_naming_its_nodes(tmp_path):
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="first"),
                           helper.make_node("Add", ["a", "c"], ["b"], name="second"),
                           helper.make_node("Neg", ["b"], ["c"], name="third"),
                           helper.make_node("Relu", ["b"], ["y"], name="out")],
                          "cyclic", [vi("x", TensorProto.FLOAT, [2])], [vi("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(webiree.ModelError, match=r"cycle through nodes \['second', 'third', 'out'\]"):
        webiree.compile(m, tmp_path)


def test_submission_is_chosen_by_the_adapter(tmp_path):
    """Chunked submission by default on discrete GPUs only; lavapipe (a CPU adapter) submits once
    and encodes each run's commands in that run."""
    from webiree.hal_webgpu.wgpu_driver import DISCRETE_GPU_SUBMIT_CHUNK, default_submit_chunk

    assert default_submit_chunk("DiscreteGPU") == DISCRETE_GPU_SUBMIT_CHUNK == 16
    assert [default_submit_chunk(t) for t in ("IntegratedGPU", "CPU", "")] == [0, 0, 0]
    model = models.mlp()
    webiree.compile(model, tmp_path / "b")
    sess = webiree.InferenceSession(tmp_path / "b")
    assert sess.driver.adapter.info["adapter_type"] == "CPU" and sess.driver.submit_chunk == 0
    assert webiree.InferenceSession(tmp_path / "b", submit_chunk=3).driver.submit_chunk == 3
    # pre-encoding the next run's commands: on GPUs by default, not on a CPU renderer
    assert sess.driver.pre_encode is False
    assert webiree.InferenceSession(tmp_path / "b", pre_encode=True).driver.pre_encode is True


def _attention_block(tied_v: bool = False, f16_q: bool = False):
    """Q, K and V projections of one hidden state (each MatMul + bias), two heads, scores, softmax,
    x V: BERT's self-attention. `tied_v`: V's weight is K's, so it is read twice; `f16_q`: Q's
    weight holds float16 values only (stored as halves), the others do not."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(5)
    S, D, H = 8, 16, 2
    consts = {f"w{p}": rng.standard_normal([D, D]).astype(np.float32) / 4 for p in "qkv"}
    consts.update({f"b{p}": rng.standard_normal([D]).astype(np.float32) for p in "qkv"})
    if f16_q:
        consts["wq"] = consts["wq"].astype(np.float16).astype(np.float32)
    consts["heads"] = np.array([1, S, H, D // H], np.int64)
    consts["merged"] = np.array([1, S, D], np.int64)
    nodes = []
    for p in "qkv":
        w = "wk" if tied_v and p == "v" else f"w{p}"
        nodes += [helper.make_node("MatMul", ["x", w], [f"{p}0"]),
                  helper.make_node("Add", [f"{p}0", f"b{p}"], [f"{p}1"]),
                  helper.make_node("Reshape", [f"{p}1", "heads"], [f"{p}2"]),
                  helper.make_node("Transpose", [f"{p}2"], [f"{p}3"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["q3", "k3"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v3"], ["c"]),
              helper.make_node("Transpose", ["c"], ["c1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["c1", "merged"], ["y"])]
    if tied_v:
        del consts["wv"]
    vi = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    return models.make_model(nodes, [vi("x", [1, S, D])], [vi("y", [1, S, D])], consts)


def test_parallel_projections_are_one_product(tmp_path):
    """The Q, K and V projections of one hidden state are one product of their weights side by
    side (passes.combine_parallel_matmuls); each projection's bias and head transposes are computed
    in the loads of the dispatch that reads it: QKV, the fused attention (scores, softmax, x V:
    passes.fuse_attention) and the heads' transpose back, three dispatches where there were seven. A weight read twice (V's tied to K's) is not
    copied: only Q would be left, so nothing combines. A weight stored as halves combines only
    with others stored so: K and V combine, Q stays alone (and weights.bin stays the size of the
    weights as stored)."""
    res = check_model(_attention_block(), tmp_path / "a")
    assert [d.kind for d in res.dispatches] == ["matmul", "attention", "generic"], \
        [(d.kind, d.nodes) for d in res.dispatches]
    assert res.dispatches[0].nodes == ["MatMul_0", "MatMul_4", "MatMul_8"], res.dispatches[0].nodes
    combined = [t for t in res.program.tensors.values() if t.name.endswith(":combined") and t.kind == "const"]
    assert [t.shape for t in combined] == [(16, 48)], [(t.name, t.shape) for t in combined]
    tied = check_model(_attention_block(tied_v=True), tmp_path / "b")
    assert [d.kind for d in tied.dispatches] == ["matmul"] * 3 + ["attention", "generic"], \
        [(d.kind, d.nodes) for d in tied.dispatches]
    combined = [t for t in tied.program.tensors.values() if t.name.endswith(":combined") and t.kind == "const"]
    assert combined == [], [(t.name, t.shape) for t in combined]
    half = check_model(_attention_block(f16_q=True), tmp_path / "c")
    assert [d.kind for d in half.dispatches] == ["matmul"] * 2 + ["attention", "generic"], \
        [(d.kind, d.nodes) for d in half.dispatches]
    combined = {t.name: (t.shape, t.pack) for t in half.program.tensors.values()
                if t.name.endswith(":combined") and t.kind == "const"}
    assert combined == {"wk:combined": ((16, 32), None)}, combined
    assert half.program.tensors["wq"].pack == "f16"
    assert len(half.weights) <= len(res.weights) - 16 * 16 * 2, (len(half.weights), len(res.weights))  # Q's in halves
