"""Reliability: every bad input gets a clear error, nothing hangs, nothing leaks.

Sections (docs/reliability.md describes each and the figures measured):
  1. one error type: CLI on damaged builds, internal errors, the module reader under damage
  2. limits: binding size, 2-D grid folding, workgroup storage/invocations, bindings per
     stage, modules that need more than the adapter offers
  3. numerics at the edges: NaN / ±Inf through elementwise ops, Softmax, reductions;
     int64 range; empty tensors
  4. soak: 2,000 inferences in one session, memory and GPU buffers flat
  5. reproducible builds across processes (hash seeds)
The mutated-model fuzzer is tests/test_fuzz.py; the dev server is tests/test_server.py.
"""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import webiree
from webiree.cli import main
from webiree.compiler.driver import compile_model, shared_bytes
from webiree.hal_webgpu.requirements import check_requirements
from webiree.module import ModuleFormatError, read_module
from webiree.testing import models
from webiree.testing.models import make_model

from .conftest import assert_close, ort_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

vi = helper.make_tensor_value_info


def cli(capsys, *args):
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *needles, code=2):
    """The CLI contract: exit code, one `webiree: error:` line, an optional hint line, no traceback."""
    assert rc == code, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("webiree: error: "), err
    assert len(lines) <= 2 and all(ln.startswith("  hint: ") for ln in lines[1:]), err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, (n, err)


@pytest.fixture(scope="module")
def mlp_build(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlp_build")
    webiree.compile(models.mlp(), d)
    return d


def _copy_build(src, dst):
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("model.wrm", "weights.bin", "manifest.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


# ---------------------------------------------------------------------------
# 1. One error type


def test_every_error_class_is_a_webiree_error_with_kind_and_hint():
    classes = [webiree.ModelError, webiree.UnsupportedOpError, webiree.ShapeError, webiree.FeedError,
               webiree.DeviceError, webiree.LimitsError, webiree.CompilerBug]
    kinds = set()
    for cls in classes:
        e = cls("went wrong", node="n1", op="Conv", hint="do this")
        assert isinstance(e, webiree.WebireeError)
        assert str(e) == "went wrong [node 'n1' (Conv)]" and e.hint == "do this"
        kinds.add(cls.kind)
    assert len(kinds) == len(classes)


@pytest.mark.parametrize("damage", ["truncated", "flipped_byte", "zeroed_header", "random_bytes", "empty",
                                    "bad_version", "garbage_tail"])
def test_cli_run_with_corrupt_module(capsys, tmp_path, mlp_build, damage):
    d = _copy_build(mlp_build, tmp_path / "b")
    raw = bytearray((d / "model.wrm").read_bytes())
    if damage == "truncated":
        raw = raw[: len(raw) // 2]
    elif damage == "flipped_byte":
        raw[len(raw) // 3] ^= 0x40
    elif damage == "zeroed_header":
        raw[:16] = bytes(16)
    elif damage == "random_bytes":
        raw = bytearray(random.Random(0).randbytes(len(raw)))
    elif damage == "empty":
        raw = bytearray()
    elif damage == "bad_version":
        raw[4] = 9
    else:
        raw += b"JUNK" + bytes(12)
    (d / "model.wrm").write_bytes(bytes(raw))
    rc, _, err = cli(capsys, "run", str(d), "--random")
    assert_one_line_error(rc, err, "model.wrm")


@pytest.mark.parametrize("damage", ["truncated", "extended", "empty", "missing"])
def test_cli_run_with_corrupt_weights(capsys, tmp_path, mlp_build, damage):
    d = _copy_build(mlp_build, tmp_path / "b")
    w = (d / "weights.bin").read_bytes()
    if damage == "truncated":
        (d / "weights.bin").write_bytes(w[:-100])
    elif damage == "extended":
        (d / "weights.bin").write_bytes(w + bytes(1000))
    elif damage == "empty":
        (d / "weights.bin").write_bytes(b"")
    else:
        (d / "weights.bin").unlink()
    rc, _, err = cli(capsys, "run", str(d), "--random")
    assert_one_line_error(rc, err, "weights", f"expects {len(w)}")


def test_cli_run_with_a_weights_file_of_another_build(capsys, tmp_path, mlp_build):
    d = _copy_build(mlp_build, tmp_path / "b")
    other = tmp_path / "other"
    webiree.compile(models.mlp(sizes=(64, 96, 10)), other)
    (d / "weights.bin").write_bytes((other / "weights.bin").read_bytes())
    rc, _, err = cli(capsys, "run", str(d), "--random")
    assert_one_line_error(rc, err, "weights blob")


@pytest.mark.parametrize("what", ["empty_dir", "a_file", "garbage_module", "missing_dir", "onnx_file"])
def test_cli_inspect_on_a_non_build(capsys, tmp_path, what):
    target = tmp_path / "t"
    if what == "empty_dir":
        target.mkdir()
    elif what == "a_file":
        target.write_text("hello")
    elif what == "garbage_module":
        target.mkdir()
        (target / "model.wrm").write_bytes(b"WIRM" + bytes(40))
    elif what == "onnx_file":
        target = tmp_path / "m.onnx"
        onnx.save(models.mlp(), target)
    rc, _, err = cli(capsys, "inspect", str(target))
    assert_one_line_error(rc, err)
    rc, _, err = cli(capsys, "run", str(target))
    assert_one_line_error(rc, err)


def test_cli_build_into_an_unwritable_place(capsys, tmp_path):
    p = tmp_path / "m.onnx"
    onnx.save(models.mlp(), p)
    (tmp_path / "afile").write_text("x")
    rc, _, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "afile"))
    assert_one_line_error(rc, err, "cannot write the build")
    rc, _, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "afile" / "sub"))
    assert_one_line_error(rc, err, "cannot write the build")


def test_cli_run_output_dir_unwritable(capsys, tmp_path, mlp_build):
    (tmp_path / "afile").write_text("x")
    rc, _, err = cli(capsys, "run", str(mlp_build), "--random", "--output-dir", str(tmp_path / "afile"))
    assert_one_line_error(rc, err, "cannot write")


def test_cli_inspect_with_a_corrupt_manifest(capsys, tmp_path, mlp_build):
    d = _copy_build(mlp_build, tmp_path / "b")
    (d / "manifest.json").write_bytes(b"{not json\xff")
    rc, _, err = cli(capsys, "inspect", str(d))
    assert_one_line_error(rc, err, "manifest.json is corrupt")


def test_cli_debug_shows_the_traceback_of_a_corrupt_module(tmp_path, mlp_build):
    d = _copy_build(mlp_build, tmp_path / "b")
    (d / "model.wrm").write_bytes((d / "model.wrm").read_bytes()[:100])
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "webiree.cli", "run", str(d), "--random"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "is corrupt" in p.stderr
    p = subprocess.run([sys.executable, "-m", "webiree.cli", "--debug", "run", str(d), "--random"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0 and "Traceback" in p.stderr and "ModelError" in p.stderr


def test_internal_failure_is_a_compiler_bug_naming_the_stage(capsys, tmp_path, monkeypatch):
    """An exception no check anticipated becomes a CompilerBug (exit 3, one line) that says it is a
    bug and names the stage; the original exception stays chained for --debug."""
    from webiree.compiler import passes

    def broken(prog, *args, **kwargs):
        raise KeyError("some_tensor")
    monkeypatch.setattr(passes, "fuse", broken)
    with pytest.raises(webiree.CompilerBug, match="internal error in the fuse stage") as e:
        compile_model(models.mlp(), validate=False)
    assert isinstance(e.value.__cause__, KeyError) and "report" in e.value.hint
    p = tmp_path / "m.onnx"
    onnx.save(models.mlp(), p)
    rc, _, err = cli(capsys, "build", str(p), "--out", str(tmp_path / "o"))
    assert_one_line_error(rc, err, "internal error in the fuse stage", code=3)


def test_handler_failure_is_a_compiler_bug_naming_the_node(monkeypatch):
    from webiree.compiler import ops

    def broken(ctx, node):
        return [][1]
    monkeypatch.setitem(ops.OPS, "Tanh", broken)
    with pytest.raises(webiree.CompilerBug) as e:
        compile_model(models.mlp(), validate=False)
    assert e.value.node == "tanh2" and e.value.op == "Tanh" and "IndexError" in str(e.value)


def test_module_reader_under_random_damage(mlp_build):
    """Byte flips, truncations and splices of model.wrm: the reader raises ModuleFormatError or
    returns a module whose every reference is in range; never another exception. With the
    checksum in place every damage is caught; with the checksum zeroed (an unchecked module)
    the structural validation still holds."""
    good = (mlp_build / "model.wrm").read_bytes()
    rng = random.Random(1)
    caught = {"checked": 0, "unchecked": 0, "accepted": 0}
    for trial in range(400):
        raw = bytearray(good)
        how = rng.choice(["flip", "flip", "truncate", "splice", "zero_run"])
        if how == "flip":
            for _ in range(rng.choice([1, 2, 8])):
                raw[rng.randrange(16, len(raw))] ^= 1 << rng.randrange(8)
        elif how == "truncate":
            raw = raw[: rng.randrange(len(raw))]
        elif how == "splice":
            i, j = sorted(rng.randrange(len(raw)) for _ in range(2))
            raw = raw[:i] + raw[j:] + raw[i:j]
        else:
            i = rng.randrange(16, len(raw))
            raw[i:i + 16] = bytes(len(raw[i:i + 16]))
        if bytes(raw) == good:
            continue
        checked = trial % 2 == 0
        if not checked and len(raw) >= 16:
            raw[12:16] = bytes(4)      # as if written without a checksum
        try:
            m = read_module(bytes(raw))
        except ModuleFormatError:
            caught["checked" if checked else "unchecked"] += 1
            continue
        assert not checked, f"damage ({how}) passed the checksum"
        _assert_references_in_range(m, how)
        caught["accepted"] += 1
    assert caught["checked"] == 200 and caught["unchecked"] > 50, caught
    assert caught["unchecked"] + caught["accepted"] == 200 and caught["accepted"] > 0, caught


def _assert_references_in_range(m, how: str):
    """What a runtime follows blindly, checked here independently of the reader's own validation:
    executable, buffer, input and output indices, and byte ranges inside their buffers."""
    from webiree.module.format import OP_DISPATCH, OP_READBACK, OP_UPLOAD_INPUT

    sizes = [b.size for b in m.buffers]
    for io in m.inputs + m.outputs:
        assert io.buffer < len(sizes) and io.offset + io.size <= sizes[io.buffer], (how, io)
    for c in m.commands:
        if c[0] == OP_DISPATCH:
            _, ex, gx, gy, gz, binds = c
            assert ex < len(m.executables), (how, c)
            assert sorted(b[0] for b in binds) == sorted(slot for slot, _ in m.executables[ex].bindings), (how, c)
            for _, buf, off, size in binds:
                assert buf < len(sizes) and off + size <= sizes[buf], (how, c)
        elif c[0] == OP_UPLOAD_INPUT:
            assert c[1] < len(m.inputs), (how, c)
        elif c[0] == OP_READBACK:
            assert c[1] < len(m.outputs), (how, c)


def test_closed_session_gives_a_clear_error(mlp_build):
    sess = webiree.InferenceSession(mlp_build)
    sess.close()
    with pytest.raises(webiree.DeviceError, match="closed"):
        sess.run(None, {"x": np.zeros((4, 64), np.float32)})


def test_failed_session_creation_frees_its_buffers(tmp_path, mlp_build):
    from webiree.hal_webgpu.wgpu_driver import WgpuDriver

    webiree.InferenceSession(mlp_build).close()
    gc.collect()      # sessions of earlier tests release their buffers now, not during the test
    before = WgpuDriver.process_live_buffers()
    d = _copy_build(mlp_build, tmp_path / "b")
    (d / "weights.bin").write_bytes(b"\0" * 8)
    for _ in range(3):
        with pytest.raises(webiree.ModelError):
            webiree.InferenceSession(d)
    assert WgpuDriver.process_live_buffers() == before


# ---------------------------------------------------------------------------
# 2. Limits


def test_adapter_limits_are_read_and_recorded(tmp_path):
    from webiree.hal_webgpu.wgpu_driver import adapter_limits

    have = adapter_limits()
    assert have["max_storage_buffer_binding_size"] >= 134217728
    assert have["max_compute_workgroups_per_dimension"] >= 65535
    res = webiree.compile(models.mlp(), tmp_path, limits="adapter")
    for k, v in res.module.limits.items():
        if k.startswith("max_") and k in have:
            assert v == have[k], k
    x = models.sample_inputs(models.mlp())
    for g, r in zip(webiree.InferenceSession(tmp_path).run(None, x), ort_run(models.mlp(), x), strict=True):
        assert_close(g, r)


def test_tensor_above_max_binding_size_is_a_limits_error(tmp_path):
    # a weight over the limit that a MatMul reads is cut into parts (compiler/passes.py
    # split_large_constants; a weight read otherwise is refused: tests/test_large_tensors.py)
    model = models.mlp()
    res = webiree.compile(model, tmp_path, limits={"max_storage_buffer_binding_size": 16384, "max_buffer_size": 1 << 20})
    assert any(n.startswith("w1:part") for n in res.program.tensors)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    got = webiree.InferenceSession(tmp_path).run(None, {"x": x})
    ref = ort_run(model, {"x": x})
    assert len(got) == len(ref) == 2
    for g, r in zip(got, ref, strict=True):
        assert_close(g, r)
    # an activation (not a weight) over the limit: a 1x8x64x64 input is 131072 bytes
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", TensorProto.FLOAT, [1, 8, 64, 64])],
                   [vi("y", TensorProto.FLOAT, [1, 8, 64, 64])], {})
    with pytest.raises(webiree.LimitsError, match=r"'x' needs 131072 bytes.*maxStorageBufferBindingSize of 65536"):
        webiree.compile(m, tmp_path / "b", limits={"max_storage_buffer_binding_size": 65536})


def _relu_model(shape):
    return make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "two"], ["y"])],
                      [vi("x", TensorProto.FLOAT, shape)], [vi("y", TensorProto.FLOAT, shape)],
                      {"two": np.array(2.0, np.float32)})


def test_more_than_65535_workgroups_fold_into_2d(tmp_path):
    """1x4x1100x1100 = 4.84M elements = 75,625 workgroups of 64: the grid folds to (65535, 2, 1)."""
    shape = [1, 4, 1100, 1100]
    m = _relu_model(shape)
    res = webiree.compile(m, tmp_path)
    (d,) = res.dispatches
    gx, gy, gz = d.grid
    assert gx <= 65535 and gy > 1 and gz == 1 and gx * gy * d.kernel.workgroup_size[0] >= 4 * 1100 * 1100
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (got,) = webiree.InferenceSession(tmp_path).run(None, {"x": x})
    np.testing.assert_array_equal(got, np.maximum(x, 0) * 2)


def test_low_workgroups_per_dimension_still_matches(tmp_path):
    """With at most 100 workgroups per dimension every grid folds (or is refused) and results hold."""
    lim = {"max_compute_workgroups_per_dimension": 100}
    m = _relu_model([1, 4, 100, 100])     # 625 workgroups of 64 -> (100, 7, 1)
    res = webiree.compile(m, tmp_path / "a", limits=lim)
    assert all(max(d.grid) <= 100 for d in res.dispatches) and res.dispatches[0].grid[1] > 1
    x = np.random.default_rng(1).standard_normal((1, 4, 100, 100)).astype(np.float32)
    np.testing.assert_array_equal(webiree.InferenceSession(tmp_path / "a").run(None, {"x": x})[0],
                                  np.maximum(x, 0) * 2)
    cnn = models.small_cnn()
    res = webiree.compile(cnn, tmp_path / "b", limits=lim)
    assert all(max(d.grid) <= 100 for d in res.dispatches)
    feeds = models.sample_inputs(cnn)
    assert_close(webiree.InferenceSession(tmp_path / "b").run(None, feeds)[0], ort_run(cnn, feeds)[0])
    with pytest.raises(webiree.LimitsError, match="exceed|above"):
        webiree.compile(_relu_model([1, 4, 500, 500]), tmp_path / "c", limits=lim)   # 15,625 > 100 x 100


LOW = {"max_compute_workgroup_storage_size": 4096, "max_compute_invocations_per_workgroup": 64,
       "max_compute_workgroup_size_x": 64, "max_compute_workgroup_size_y": 64, "max_compute_workgroup_size_z": 64}


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "tiny_attention"])
def test_low_workgroup_storage_and_invocations(tmp_path, name):
    model = getattr(models, name)()
    res = webiree.compile(model, tmp_path, limits=LOW)
    for d in res.dispatches:
        x, y, z = d.kernel.workgroup_size
        assert x * y * z <= 64 and max(x, y, z) <= 64, (d.name, d.kernel.workgroup_size)
        assert shared_bytes(d.kernel) <= 4096, (d.name, shared_bytes(d.kernel))
    for ex in res.module.executables:
        x, y, z = ex.workgroup_size
        assert x * y * z <= 64
    # the WGSL itself declares no more than that
    for _, text in res.shaders:
        for line in text.splitlines():
            if "@workgroup_size(" in line:
                dims = [int(v.strip().rstrip("u")) for v in line.split("@workgroup_size(")[1].split(")")[0].split(",")]
                assert np.prod(dims) <= 64, line
    feeds = models.sample_inputs(model)
    for g, r in zip(webiree.InferenceSession(tmp_path).run(None, feeds), ort_run(model, feeds), strict=True):
        assert_close(g, r)


def test_four_storage_buffers_per_stage_splits_a_six_input_expression(tmp_path):
    names = list("abcdef")
    nodes = [helper.make_node("Add", ["a", "b"], ["t1"]), helper.make_node("Mul", ["t1", "c"], ["t2"]),
             helper.make_node("Sub", ["t2", "d"], ["t3"]), helper.make_node("Div", ["t3", "e"], ["t4"]),
             helper.make_node("Add", ["t4", "f"], ["t5"]), helper.make_node("Tanh", ["t5"], ["y"])]
    m = make_model(nodes, [vi(n, TensorProto.FLOAT, [8, 32]) for n in names], [vi("y", TensorProto.FLOAT, [8, 32])], {})
    rng = np.random.default_rng(2)
    feeds = {n: rng.standard_normal((8, 32)).astype(np.float32) + (3.0 if n == "e" else 0.0) for n in names}
    wide = webiree.compile(m, tmp_path / "wide")
    assert len(wide.dispatches) == 1          # default limit 8: one fused dispatch of 6 inputs + 1 output
    res = webiree.compile(m, tmp_path / "narrow", limits={"max_storage_buffers_per_shader_stage": 4})
    assert len(res.dispatches) > 1
    assert all(len(d.kernel.bindings) <= 4 for d in res.dispatches)
    assert all(len(e.bindings) <= 4 for e in res.module.executables)
    got = webiree.InferenceSession(tmp_path / "narrow").run(None, feeds)[0]
    assert_close(got, ort_run(m, feeds)[0])


def test_module_needing_more_than_the_adapter_is_refused_at_session_creation(tmp_path):
    from webiree.hal_webgpu.wgpu_driver import adapter_limits

    have = adapter_limits()
    too_big = have["max_storage_buffer_binding_size"] + 1
    webiree.compile(models.mlp(), tmp_path, limits={"max_storage_buffer_binding_size": too_big,
                                                     "max_buffer_size": max(too_big, have["max_buffer_size"])})
    with pytest.raises(webiree.LimitsError, match="max_storage_buffer_binding_size") as e:
        webiree.InferenceSession(tmp_path)
    assert "--limits adapter" in e.value.hint


def test_check_requirements_rules():
    check_requirements({"max_compute_invocations_per_workgroup": 256}, {"max_compute_invocations_per_workgroup": 256})
    with pytest.raises(webiree.LimitsError, match="max_compute_workgroup_storage_size = 32768"):
        check_requirements({"max_compute_workgroup_storage_size": 32768}, {"max_compute_workgroup_storage_size": 16384})
    check_requirements({"min_storage_buffer_offset_alignment": 256}, {"min_storage_buffer_offset_alignment": 64})
    with pytest.raises(webiree.LimitsError, match="aligns buffers to 64"):
        check_requirements({"min_storage_buffer_offset_alignment": 64}, {"min_storage_buffer_offset_alignment": 256})


# ---------------------------------------------------------------------------
# 3. Numerics at the edges

NINF, INF, NAN = float("-inf"), float("inf"), float("nan")
EDGE_A = np.array([NAN, INF, NINF, 0.0, -0.0, 1.0, -1.0, 88.0, 89.0, 100.0, -100.0, 1e38, -1e38, 3e38,
                   1e-30, -2.5, 0.5, 20.0], np.float32)
EDGE_B = np.array([1.0, NAN, INF, 0.0, NINF, 0.0, NAN, 2.0, -0.0, INF, INF, 1e38, -3e38, NAN,
                   0.0, NINF, 0.5, -20.0], np.float32)


def _run_both(tmp_path, model, feeds):
    webiree.compile(model, tmp_path)
    got = webiree.InferenceSession(tmp_path).run(None, feeds)
    return got, ort_run(model, feeds)


def _assert_same_specials(got, ref, name):
    """NaN positions equal, infinities equal, finite values within 1e-5 relative (per element)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"{name}: NaN positions")
    inf = np.isinf(ref)
    np.testing.assert_array_equal(got[inf], ref[inf], err_msg=f"{name}: infinities")
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-6, err_msg=name)


UNARY_EDGE = ["Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Reciprocal", "Floor", "Ceil",
              "Sign", "Elu", "LeakyRelu", "HardSigmoid", "Softsign", "Softplus", "Erf"]


@pytest.mark.parametrize("op", UNARY_EDGE)
def test_unary_nan_inf_like_onnxruntime(tmp_path, op):
    """Includes Exp overflow (88, 89, 100 -> inf), Sigmoid/Tanh saturation, Log/Sqrt of negatives."""
    n = len(EDGE_A)
    m = make_model([helper.make_node(op, ["a"], ["y"])], [vi("a", TensorProto.FLOAT, [n])],
                   [vi("y", TensorProto.FLOAT, [n])], {})
    got, ref = _run_both(tmp_path, m, {"a": EDGE_A})
    _assert_same_specials(got[0], ref[0], op)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "PRelu"])
def test_binary_nan_inf_like_onnxruntime(tmp_path, op):
    """Div by +-0 gives +-inf or NaN, inf - inf is NaN, Max/Min keep NaN, ..."""
    n = len(EDGE_A)
    m = make_model([helper.make_node(op, ["a", "b"], ["y"])], [vi("a", TensorProto.FLOAT, [n]),
                                                               vi("b", TensorProto.FLOAT, [n])],
                   [vi("y", TensorProto.FLOAT, [n])], {})
    got, ref = _run_both(tmp_path, m, {"a": EDGE_A, "b": EDGE_B})
    _assert_same_specials(got[0], ref[0], op)


def test_clip_and_where_with_nan_inf(tmp_path):
    n = len(EDGE_A)
    nodes = [helper.make_node("Clip", ["a", "lo", "hi"], ["c"]),
             helper.make_node("IsNaN", ["b"], ["nb"]),
             helper.make_node("Where", ["nb", "a", "b"], ["w"]),
             helper.make_node("Greater", ["a", "b"], ["g"]),
             helper.make_node("Where", ["g", "a", "c"], ["w2"])]
    m = make_model(nodes, [vi("a", TensorProto.FLOAT, [n]), vi("b", TensorProto.FLOAT, [n])],
                   [vi("c", TensorProto.FLOAT, [n]), vi("w", TensorProto.FLOAT, [n]), vi("w2", TensorProto.FLOAT, [n])],
                   {"lo": np.array(-1.0, np.float32), "hi": np.array(2.0, np.float32)})
    got, ref = _run_both(tmp_path, m, {"a": EDGE_A, "b": EDGE_B})
    for g, r, name in zip(got, ref, ["clip", "where_isnan", "where_greater"], strict=True):
        _assert_same_specials(g, r, name)


# rows: some -inf, all -inf, a NaN, +inf, huge finite, +inf and -inf, ordinary, everything
EDGE_ROWS = np.array([[NINF, 0, 1, NINF, 2, 3, 4, 5], [NINF] * 8, [NAN, 0, 1, 2, 3, 4, 5, 6],
                      [INF, 0, 1, 2, 3, 4, 5, 6], [1e30, -1e30, 3e37, 3e37, 0, 0, 0, 0],
                      [INF, NINF, 0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8], [NAN, INF, NINF, 0, 0, 0, 0, 1]],
                     np.float32)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_rows_with_inf_and_nan(tmp_path, op, axis):
    m = make_model([helper.make_node(op, ["x"], ["y"], axis=axis)], [vi("x", TensorProto.FLOAT, [8, 8])],
                   [vi("y", TensorProto.FLOAT, [8, 8])], {})
    got, ref = _run_both(tmp_path, m, {"x": EDGE_ROWS})
    _assert_same_specials(got[0], ref[0], f"{op} axis {axis}")


REDUCE_NUMPY = {"ReduceMax": np.max, "ReduceMin": np.min, "ReduceSum": np.sum, "ReduceMean": np.mean,
                "ReduceSumSquare": lambda x, axis: np.sum(x.astype(np.float64) ** 2, axis=axis),
                "ReduceL2": lambda x, axis: np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=axis))}


def _reduce_model(op, axis):
    if op == "ReduceSum":   # opset 13+: axes is an input
        return make_model([helper.make_node(op, ["x", "ax"], ["y"], keepdims=0)], [vi("x", TensorProto.FLOAT, [8, 8])],
                          [vi("y", TensorProto.FLOAT, [8])], {"ax": np.array([axis], np.int64)})
    return make_model([helper.make_node(op, ["x"], ["y"], axes=[axis], keepdims=0)],
                      [vi("x", TensorProto.FLOAT, [8, 8])], [vi("y", TensorProto.FLOAT, [8])], {})


@pytest.mark.parametrize("op", list(REDUCE_NUMPY))
def test_reductions_with_nan_inf(tmp_path, op):
    """Along the last axis onnxruntime propagates NaN and so do we: compared with onnxruntime.
    Along axis 0 onnxruntime's CPU kernels drop a NaN depending on its position (ReduceMax of
    [-inf, nan, inf, ...] is inf there); webiree propagates NaN as numpy and the ONNX reference
    do, so that axis is compared with numpy."""
    m = _reduce_model(op, 1)
    got, ref = _run_both(tmp_path / "last", m, {"x": EDGE_ROWS})
    _assert_same_specials(got[0], ref[0], f"{op} axis 1")
    with np.errstate(all="ignore"):
        expect = REDUCE_NUMPY[op](EDGE_ROWS, axis=0).astype(np.float32)
    m0 = _reduce_model(op, 0)
    webiree.compile(m0, tmp_path / "first")
    got0 = webiree.InferenceSession(tmp_path / "first").run(None, {"x": EDGE_ROWS})[0]
    _assert_same_specials(got0, expect, f"{op} axis 0 (numpy)")


def test_nan_survives_fused_matmul_epilogue(tmp_path):
    """Gemm(alpha=NaN) + Relu + Tanh...: the mlp with a NaN alpha is NaN everywhere, as in onnxruntime
    (found by the fuzzer: WGSL's tanh formula lost NaN)."""
    m = models.mlp()
    m.graph.node[0].attribute.append(helper.make_attribute("alpha", float("nan")))
    feeds = models.sample_inputs(m)
    got, ref = _run_both(tmp_path, m, feeds)
    for g, r in zip(got, ref, strict=True):
        assert np.isnan(r).all() and np.isnan(g).all()


def test_int64_feed_outside_int32_is_a_feed_error(tmp_path):
    m = models.tiny_attention()
    webiree.compile(m, tmp_path)
    sess = webiree.InferenceSession(tmp_path)
    ids = np.arange(8, dtype=np.int64).reshape(1, 8)
    sess.run(None, {"ids": ids})
    for bad in (1 << 31, -(1 << 31) - 1, 1 << 40):
        ids2 = ids.copy()
        ids2[0, 3] = bad
        with pytest.raises(webiree.FeedError, match=f"holds {bad}, outside the int32 range"):
            sess.run(None, {"ids": ids2})


def test_int64_constant_outside_int32_is_a_clear_error(tmp_path):
    """A runtime Equal against an int64 constant WGSL cannot hold (found by the fuzzer: it was
    silently truncated and gave wrong results)."""
    m = make_model([helper.make_node("Equal", ["ids", "big"], ["y"])], [vi("ids", TensorProto.INT64, [4])],
                   [vi("y", TensorProto.BOOL, [4])], {"big": np.array(579820584960, np.int64)})
    with pytest.raises(webiree.ShapeError, match="outside the int32 range") as e:
        webiree.compile(m, tmp_path)
    assert e.value.node and e.value.hint


def test_zero_sized_input_dim(tmp_path):
    m = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ReduceSum", ["r", "ax"], ["y"],
                                                                               keepdims=0)],
                   [vi("x", TensorProto.FLOAT, [0, 8])], [vi("y", TensorProto.FLOAT, [8])],
                   {"ax": np.array([0], np.int64)})
    # a declared 0 dim is often an exporter's "unknown": refused with a clear error ...
    with pytest.raises(webiree.ShapeError, match="0-sized dim") as e:
        webiree.compile(m, tmp_path / "a")
    assert "--input-shape x=0,8" in e.value.hint
    # ... and compiled when confirmed: an empty input works, the sum over it is 0
    webiree.compile(m, tmp_path / "b", {"x": [0, 8]})
    sess = webiree.InferenceSession(tmp_path / "b")
    (y,) = sess.run(None, {"x": np.zeros((0, 8), np.float32)})
    np.testing.assert_array_equal(y, ort_run(m, {"x": np.zeros((0, 8), np.float32)})[0])
    with pytest.raises(webiree.FeedError):
        sess.run(None, {"x": np.zeros((1, 8), np.float32)})


def test_slice_producing_an_empty_tensor(tmp_path):
    nodes = [helper.make_node("Slice", ["x", "st", "en"], ["s"]),
             helper.make_node("Relu", ["s"], ["e"]),                      # an empty output
             helper.make_node("ReduceSum", ["s", "ax"], ["total"], keepdims=1),   # a sum over nothing
             helper.make_node("Concat", ["x", "s"], ["cat"], axis=0)]     # empty contributes nothing
    m = make_model(nodes, [vi("x", TensorProto.FLOAT, [4, 8])],
                   [vi("e", TensorProto.FLOAT, [0, 8]), vi("total", TensorProto.FLOAT, [1, 8]),
                    vi("cat", TensorProto.FLOAT, [4, 8])],
                   {"st": np.array([2], np.int64), "en": np.array([2], np.int64), "ax": np.array([0], np.int64)})
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    got, ref = _run_both(tmp_path, m, {"x": x})
    assert got[0].shape == (0, 8)
    for g, r in zip(got, ref, strict=True):
        assert_close(g, r)


# ---------------------------------------------------------------------------
# 4. Soak

def _rss_bytes() -> int:
    try:
        import psutil
        return psutil.Process().memory_info().rss
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mlp_numpy(model, x):
    """The mlp test model in numpy (float64), from its initializers."""
    w = {t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    h = np.maximum(x @ w["w1"].T + w["b1"], 0)
    h = np.tanh(h @ w["w2"] + w["b2"])
    logits = 0.5 * (h @ w["w3"]) + 2.0 * w["b3"]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True), logits


SOAK_RUNS = 2000


def _soak(out_dir: str) -> dict:
    """SOAK_RUNS inferences on one session; run in a process of its own (test below), so that
    the RSS it measures is this loop's and not the suite's other threads and allocations."""
    import onnxruntime as ort

    from webiree.hal_webgpu.wgpu_driver import WgpuDriver

    model = models.mlp(batch=2, sizes=(16, 32, 8))
    webiree.compile(model, out_dir)
    sess = webiree.InferenceSession(out_dir)
    ref_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    gc.collect()
    buffers0 = sess.driver.live_buffers
    process0 = WgpuDriver.process_live_buffers()
    worst, compared, constant_buffers = 0.0, 0, True
    t0 = time.perf_counter()
    rss_warm = None
    for i in range(SOAK_RUNS):
        x = (rng.standard_normal((2, 16)) * rng.choice([0.1, 1.0, 10.0])).astype(np.float32)
        probs, logits = sess.run(None, {"x": x})
        p_ref, l_ref = _mlp_numpy(model, x.astype(np.float64))
        worst = max(worst, float(np.abs(logits - l_ref).max() / max(np.abs(l_ref).max(), 1e-6)),
                    float(np.abs(probs - p_ref).max()))
        if i % 100 == 0:
            for g, r in zip((probs, logits), ref_sess.run(None, {"x": x}), strict=True):
                assert_close(g, r)
                compared += 1
        if i == 200:
            rss_warm = _rss_bytes()
        constant_buffers &= sess.driver.live_buffers == buffers0
    elapsed = time.perf_counter() - t0
    growth = _rss_bytes() - rss_warm
    process_after = WgpuDriver.process_live_buffers()
    sess.close()
    return {"elapsed": elapsed, "worst": worst, "compared": compared, "growth": growth, "buffers0": buffers0,
            "constant_buffers": constant_buffers, "process_kept": process_after == process0,
            "closed": sess.driver.live_buffers == 0,
            "process_freed": WgpuDriver.process_live_buffers() == process0 - buffers0}


def test_soak_one_session_2000_inferences(tmp_path, capsys):
    import json

    code = ("import json, sys; from tests.test_reliability import _soak; "
            "print('SOAK ' + json.dumps(_soak(sys.argv[1])))")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=600,
                       cwd=str(ROOT))
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("SOAK ")]
    assert p.returncode == 0 and lines, f"soak process failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    r = json.loads(lines[-1][5:])
    with capsys.disabled():
        print(f"\n[soak] {SOAK_RUNS} inferences in {r['elapsed']:.1f} s, worst rel. error vs numpy {r['worst']:.2e}, "
              f"RSS growth after warm-up {r['growth'] / 1024:.0f} KiB, live GPU buffers {r['buffers0']} (constant)")
    assert r["buffers0"] > 0
    assert r["compared"] == 2 * SOAK_RUNS // 100
    assert r["worst"] < 1e-4
    assert r["constant_buffers"], "the session's live GPU buffers changed during the soak"
    assert r["growth"] < 4 * 1024 * 1024, f"RSS grew {r['growth']} bytes over {SOAK_RUNS - 200} runs"
    assert r["process_kept"] and r["closed"] and r["process_freed"], r


def test_many_sessions_do_not_leak_buffers(tmp_path):
    from webiree.hal_webgpu.wgpu_driver import WgpuDriver

    webiree.compile(models.mlp(), tmp_path)
    x = models.sample_inputs(models.mlp())
    with webiree.InferenceSession(tmp_path) as s:
        s.run(None, x)
    gc.collect()
    before = WgpuDriver.process_live_buffers()
    for _ in range(20):
        with webiree.InferenceSession(tmp_path) as s:
            s.run(None, x)
    for _ in range(20):              # dropped without close(): freed when collected
        webiree.InferenceSession(tmp_path).run(None, x)
    gc.collect()
    assert WgpuDriver.process_live_buffers() == before


@pytest.mark.parametrize("path", ["c-api", "wgpu-py"])
def test_readback_returns_the_bytes_copied_at_each_offset(monkeypatch, path):
    """read_buffer maps through wgpu-native's C API (or wgpu-py's map_sync where those handles
    are missing): the same bytes either way, at any offset mapAsync allows (a multiple of 8), read after read."""
    from webiree.errors import DeviceError
    from webiree.hal_webgpu import wgpu_driver

    if path == "wgpu-py":
        monkeypatch.setattr(wgpu_driver, "_libf", None)
    drv = wgpu_driver.WgpuDriver()
    src, back = drv.create_buffer(4096, "storage"), drv.create_buffer(4096, "readback")
    try:
        for k in range(3):
            data = np.arange(1024, dtype=np.uint32) * 2654435761 + k
            drv.write_buffer(src, 0, data.tobytes())
            drv.copy([(src, 0, back, 0, 4096)])
            got = [np.frombuffer(drv.read_buffer(back, off, size).value, np.uint32)
                   for off, size in ((0, 4096), (8, 4), (1016, 3080))]
            assert [g.tolist() for g in got] == [data.tolist(), data[2:3].tolist(), data[254:].tolist()]
        drv.destroy_buffer(back)
        with pytest.raises(DeviceError, match="reading results from the GPU failed"):
            drv.read_buffer(back, 0, 16)
    finally:
        drv.destroy_buffer(src)


@pytest.mark.parametrize("pre_encode", [False, True])
def test_pre_encoded_command_buffers_see_each_runs_inputs(tmp_path, pre_encode):
    """A pre-encoded command buffer reads the buffers the next run's inputs are written into:
    30 runs on fresh inputs match onnxruntime, alternating which outputs are read back (another
    schedule) included; all but the first two runs of a stretch are pre-encoded, and a schedule's
    buffer stays ready while another runs between."""
    import onnxruntime as ort

    model = models.mlp(batch=2, sizes=(16, 32, 8))
    webiree.compile(model, tmp_path)
    sess = webiree.InferenceSession(tmp_path, pre_encode=pre_encode)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    names = [o.name for o in sess.get_outputs()]
    plan = [None] * 12 + [names[:1], None] * 3 + [names[1:]] * 12
    for wanted in plan:
        x = rng.standard_normal((2, 16)).astype(np.float32)
        got, want = sess.run(wanted, {"x": x}), ref.run(wanted, {"x": x})
        assert len(got) == len(want) == (len(names) if wanted is None else 1)
        for g, w in zip(got, want, strict=True):
            assert_close(g, w)
    assert sess.driver.pre_encoded_submits == (10 + 3 + 10 if pre_encode else 0)


# ---------------------------------------------------------------------------
# 5. Reproducible builds


REPRO_SCRIPT = """
import hashlib, sys, webiree
from webiree.testing import models
res = webiree.compile(models.{model}(), sys.argv[1])
"""


@pytest.mark.parametrize("model", ["tiny_attention", "small_cnn"])
def test_build_is_reproducible_across_processes(tmp_path, model):
    """Two builds in fresh interpreters with different hash seeds give byte-identical folders
    (set and dict iteration order must never leak into the output)."""
    for d, seed in (("a", "1"), ("b", "2")):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        p = subprocess.run([sys.executable, "-c", REPRO_SCRIPT.format(model=model), str(tmp_path / d)],
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) > 5
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_bad_limits_argument_is_a_limits_error(tmp_path):
    for bad in ({"max_storage_buffer_binding_size": "big"}, {"max_compute_invocations_per_workgroup": 0},
                "fast", 12):
        with pytest.raises(webiree.LimitsError):
            webiree.compile(models.mlp(), tmp_path, limits=bad)


def test_limits_above_u32_are_capped_in_the_module(tmp_path):
    """A big GPU reports maxBufferSize above 4 GiB; the module's u32 LIMS entry is capped."""
    res = webiree.compile(models.mlp(), tmp_path, limits={"max_buffer_size": 1 << 40})
    assert res.module.limits["max_buffer_size"] == 0xFFFFFFFF
    assert read_module((tmp_path / "model.wrm").read_bytes()).limits["max_buffer_size"] == 0xFFFFFFFF


def test_feeds_that_are_not_arrays(mlp_build):
    sess = webiree.InferenceSession(mlp_build)
    for bad in ([[1.0, 2.0], [3.0]], "abc", None, object()):
        with pytest.raises(webiree.FeedError):
            sess.run(None, {"x": bad})
    with pytest.raises(webiree.FeedError):
        sess.run(None, [np.zeros((4, 64), np.float32)])
