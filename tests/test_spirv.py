"""SPIR-V from the same kernel IR (webiree/wgsl_codegen/spirv.py): valid, and runs like the WGSL.

- every emitted module passes `spirv-val --target-env vulkan1.1` (the test models and a
  sample of single-op models covering every kernel builder);
- `targets="spirv"` builds run through wgpu-py (naga's SPIR-V front end, lavapipe) and match
  onnxruntime and the WGSL path (1e-4 relative to the output's scale);
- a hand-written kernel of edge cases (integer division by zero, i32 MIN / -1, shifts, saturating
  casts, NaN/inf tests, erf, tanh, vec4, shared memory, barriers, loops, branches) gives the same
  bits from its SPIR-V as from its WGSL, each legalized for its renderer (wgsl_codegen/legalize.py).

The whole op suite runs over SPIR-V with `WEBIREE_TARGETS=spirv pytest tests/test_ops.py`.
"""

from __future__ import annotations

import shutil
import struct
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import assert_close, ort_run
from tests.test_ops import single, vi
from webiree.compiler.driver import compile_model
from webiree.testing import models
from webiree.ir import kir
from webiree.wgsl_codegen import spirv, wgsl
from webiree.wgsl_codegen.legalize import legalize


def test_spirv_val_is_installed():
    """Set-up installs Debian's spirv-tools: without spirv-val the validation tests below cannot run."""
    assert shutil.which("spirv-val"), "spirv-val is missing: run scripts/setup.sh (Debian package spirv-tools)"

MODELS = ["mlp", "small_cnn", "tiny_attention"]
I = TensorProto.INT32
B = TensorProto.BOOL


def _sample_ops():
    """Single-op models reaching every kernel builder (elementwise, matmul paths, conv, pools,
    reductions, softmax, layernorm, gather/scatter, loops) and the integer/bool paths."""
    out = {}
    for op in ["Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Floor", "Round", "Sign", "Atan", "Softplus", "Mish"]:
        out[op] = single(op, [[3, 17]], [3, 17], opset=18 if op == "Mish" else 17)
    out["Add_bcast"] = single("Add", [[2, 1, 4], [3, 1]], [2, 3, 4])
    out["Div"] = single("Div", [[2, 3, 4], [4]], [2, 3, 4])
    out["Mod_int"] = single("Mod", [[4, 5], [4, 5]], [4, 5], in_types=[I, I], out_type=I)
    out["Div_int"] = single("Div", [[4, 5], [5]], [4, 5], in_types=[I, I], out_type=I)
    out["Less"] = single("Less", [[3, 4], [4]], [3, 4], out_type=B)
    out["Where"] = single("Where", [[3, 4], [3, 4], [4]], [3, 4], in_types=[B, TensorProto.FLOAT, TensorProto.FLOAT])
    out["Cast_f_i"] = single("Cast", [[3, 5]], [3, 5], {"to": I}, out_type=I)
    out["MatMul_vec4"] = single("MatMul", [[70, 32], [32, 64]], [70, 64])
    out["MatMul_odd"] = single("MatMul", [[70, 33], [33, 65]], [70, 65])
    out["MatMul_batched"] = single("MatMul", [[2, 3, 20, 8], [2, 3, 8, 20]], [2, 3, 20, 20])
    out["MatMul_vec"] = single("MatMul", [[5, 8], [8]], [5])
    out["Conv"] = single("Conv", [[1, 3, 9, 9], [4, 3, 3, 3]], None, {"pads": [1, 1, 1, 1]})
    out["MaxPool"] = single("MaxPool", [[1, 5, 11, 9]], None, {"kernel_shape": [3, 3], "strides": [2, 2]})
    out["AveragePool"] = single("AveragePool", [[1, 5, 11, 9]], None, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})
    out["ReduceMax"] = single("ReduceMax", [[4, 300]], None, {"axes": [1]}, opset=13)
    out["ArgMax"] = single("ArgMax", [[4, 300]], None, {"axis": 1}, out_type=TensorProto.INT64)
    out["Softmax_long"] = single("Softmax", [[2, 1000]], [2, 1000])
    out["LayerNorm"] = single("LayerNormalization", [[3, 16], [16], [16]], [3, 16], {"axis": -1})
    out["CumSum"] = single("CumSum", [[4, 9]], [4, 9], extra_inputs=["ax"],
                           inits={"ax": np.array(1, np.int32)})
    out["Gather"] = single("Gather", [[7, 5]], [3, 5], extra_inputs=["idx"],
                           inits={"idx": np.array([6, 0, 2], np.int64)})
    out["TopK"] = models.make_model([helper.make_node("TopK", ["x0", "k"], ["v", "i"])], [vi("x0", [3, 10])],
                                    [vi("v", [3, 4]), vi("i", [3, 4], TensorProto.INT64)],
                                    {"k": np.array([4], np.int64)})
    return out


SAMPLE = _sample_ops()


def _spv(kernel) -> bytes:
    return spirv.emit(legalize(kernel, spirv.SUPPORTS))


def _wgsl(kernel) -> str:
    return wgsl.render(legalize(kernel, wgsl.SUPPORTS))


def _spirv_val(code: bytes, tmp_path, name="k") -> tuple[int, str]:
    p = tmp_path / f"{name}.spv"
    p.write_bytes(code)
    r = subprocess.run(["spirv-val", "--target-env", "vulkan1.1", str(p)], capture_output=True, text=True)
    return r.returncode, r.stderr + r.stdout


# ----------------------------------------------------------------------------
# structure and validation

def test_header_and_deduplicated_types():
    res = compile_model(models.mlp(), validate=False)
    code = _spv(res.dispatches[0].kernel)
    words = struct.unpack(f"<{len(code) // 4}I", code)
    assert words[0] == 0x07230203 and words[1] == 0x00010300      # SPIR-V 1.3
    seen, i = set(), 5
    while i < len(words):
        n, op = words[i] >> 16, words[i] & 0xFFFF
        if op in (19, 20, 21, 22, 23, 32, 43):   # OpType{Void,Bool,Int,Float,Vector,Pointer}, OpConstant
            # the result id is the first operand of a type, the second of a constant
            key = (op, words[i + 1], words[i + 3]) if op == 43 else (op,) + tuple(words[i + 2:i + n])
            assert key not in seen, f"duplicate type/constant {key}"
            seen.add(key)
        i += n
    assert _spv(res.dispatches[0].kernel) == code   # deterministic


@pytest.mark.parametrize("name", MODELS)
def test_test_models_validate(name, tmp_path):
    res = compile_model(getattr(models, name)(), validate=False)
    for d in res.dispatches:
        rc, err = _spirv_val(_spv(d.kernel), tmp_path, d.name)
        assert rc == 0, f"{d.name}: {err}"


def test_op_sample_validates(tmp_path):
    n = 0
    for key, model in SAMPLE.items():
        res = compile_model(model, validate=False)
        for d in res.dispatches:
            rc, err = _spirv_val(_spv(d.kernel), tmp_path, "k")
            assert rc == 0, f"{key}/{d.name}: {err}"
            n += 1
    assert n >= len(SAMPLE)


# ----------------------------------------------------------------------------
# execution over wgpu-py (naga spv-in -> lavapipe)

def _run(model, feeds, tmp_path, targets):
    import webiree

    out = tmp_path / targets.replace(",", "_")
    res = webiree.compile(model, out, targets=targets)
    return webiree.InferenceSession(out).run(None, feeds), res


@pytest.mark.parametrize("name", MODELS)
def test_test_models_run_from_spirv(name, tmp_path):
    model = getattr(models, name)()
    feeds = models.sample_inputs(model)
    got, res = _run(model, feeds, tmp_path, "spirv")
    assert {e.format for e in res.module.executables} == {"spirv"}
    want, _ = _run(model, feeds, tmp_path, "wgsl")
    ref = ort_run(model, feeds)
    for g, w, r, o in zip(got, want, ref, model.graph.output, strict=True):
        assert_close(g, r, name=o.name)
        assert_close(g, w, name=o.name + " (vs WGSL)")


@pytest.mark.parametrize("key", ["Erf", "Tanh", "Mish", "Round", "Mod_int", "Div_int", "Less", "Where", "Cast_f_i",
                                 "MatMul_vec4", "MatMul_odd", "Conv", "MaxPool", "AveragePool", "ArgMax",
                                 "Softmax_long", "LayerNorm", "CumSum", "Gather", "TopK"])
def test_op_sample_runs_from_spirv(key, tmp_path):
    model = SAMPLE[key]
    feeds = models.sample_inputs(model)
    if key in ("Mod_int", "Div_int"):   # divisors include zero and negatives
        rng = np.random.default_rng(3)
        feeds = {k: rng.integers(-9, 10, v.shape).astype(np.int32) for k, v in feeds.items()}
        feeds["x1"][feeds["x1"] == 0] = 3
    got, _ = _run(model, feeds, tmp_path, "spirv")
    want, _ = _run(model, feeds, tmp_path, "wgsl")
    ref = ort_run(model, feeds)
    for g, w, r, o in zip(got, want, ref, model.graph.output, strict=True):
        assert_close(g, r, name=o.name)
        assert_close(g, w, name=o.name + " (vs WGSL)")


def test_build_writes_spv_files_and_cli_flag(tmp_path):
    import json

    from webiree.cli import main
    from webiree.module import read_module

    path = tmp_path / "mlp.onnx"
    path.write_bytes(models.mlp().SerializeToString())
    assert main(["build", str(path), "--out", str(tmp_path / "both"), "--target", "wgsl,spirv"]) == 0
    files = sorted(p.name for p in (tmp_path / "both" / "shaders").iterdir())
    assert [f for f in files if f.endswith(".spv")] and [f for f in files if f.endswith(".wgsl")]
    m = read_module((tmp_path / "both" / "model.wrm").read_bytes())
    assert {e.format for e in m.executables} == {"wgsl"}          # the module stays WGSL (browsers)
    assert main(["build", str(path), "--out", str(tmp_path / "spv"), "--target", "spirv"]) == 0
    m = read_module((tmp_path / "spv" / "model.wrm").read_bytes())
    assert {e.format for e in m.executables} == {"spirv"}
    spv = sorted(p for p in (tmp_path / "spv" / "shaders").iterdir() if p.suffix == ".spv")
    assert len(spv) == len(m.executables)    # (the .wgsl files stay, for reading)
    assert m.executables[0].code == spv[0].read_bytes()
    man = json.loads((tmp_path / "spv" / "manifest.json").read_text())
    assert man["build_options"]["targets"] == "spirv"


def test_unknown_target_is_a_clear_error():
    import webiree

    with pytest.raises(webiree.WebireeError, match="unknown target"):
        compile_model(models.mlp(), validate=False, targets="metal")


# ----------------------------------------------------------------------------
# the same bits from a kernel's WGSL and its SPIR-V

def _edge_kernel():
    """Every scalar rule that differs between WGSL and a naive SPIR-V translation."""
    from webiree.ir.kir import Assign, Barrier, Decl, For, If, Let, SStore, Store, f32, i32, lvar
    o = lvar("o", "i32")
    a = kir.load("b0", o, "i32")
    b = kir.load("b1", o, "i32")
    x = kir.load("b2", o, "f32")
    vx = kir.vec4(x, x * 2.0, -x, x + 1.0)
    outs = [
        a // b, a % b, kir.binary("shl", a, b), kir.binary("shr", a, b),
        kir.cast(kir.binary("shr", kir.bitcast(a, "u32"), kir.bitcast(b, "u32")), "i32"),
        kir.bitcast(x, "i32"), kir.cast(x * 1e10, "i32"), kir.bitcast(kir.cast(x * 1e10, "u32"), "i32"),
        kir.cast(kir.unary("isnan", x), "i32"), kir.cast(kir.unary("isinf", x), "i32"),
        kir.bitcast(kir.unary("erf", x), "i32"), kir.bitcast(kir.unary("tanh", x), "i32"),
        kir.bitcast(kir.unary("round", x), "i32"), kir.bitcast(kir.binary("mod", x, f32(0.75)), "i32"),
        kir.minimum(a, b), kir.bitcast(kir.maximum(kir.bitcast(a, "u32"), kir.bitcast(b, "u32")), "i32"),
        kir.cast(kir.binary("ne", x, x), "i32"), kir.cast(kir.binary("eq", x, x), "i32"),
        kir.bitcast(kir.lane(kir.fma(vx, vx, kir.splat(f32(0.5))), 3), "i32"),
        kir.bitcast(kir.lane(kir.select(a < b, vx, kir.splat(x)), 2), "i32"),
        kir.unary("sign", a), kir.unary("abs", a), kir.clamp(a, -3, 4), kir.unary("bnot", a),
        kir.bitcast(kir.clamp(x, kir.const(float("-inf"), "f32"), f32(0.25)), "i32"),
        kir.bitcast(kir.cast(kir.cast(kir.bitcast(a, "u32"), "f32") / kir.const(float("inf"), "f32"), "f32"), "i32"),
    ]
    n_out = len(outs) + 3
    body = [Let("o", kir.cast(kir.LINDEX, "i32")),
            Decl("at2", "i32", i32(0)),
            Decl("acc", "i32", i32(0)),
            SStore("sh", o, a),
            Barrier(),
            For("k", i32(0), kir.cast(kir.NWG[0], "i32") + 3, [
                If(kir.binary("eq", kir.binary("band", lvar("k", "i32"), i32(3)), i32(2)),
                   [Assign("at2", lvar("acc", "i32"))]),
                Assign("acc", lvar("acc", "i32") + kir.sload("sh", (o + lvar("k", "i32")) % 64, "i32")),
                If(lvar("acc", "i32") > 1000, [Assign("acc", lvar("acc", "i32") - 999)]),
            ]),
            Barrier()]
    for j, v in enumerate(outs):
        body.append(Store("b3", o * n_out + j, v))
    body.append(Store("b3", o * n_out + len(outs), lvar("acc", "i32")))
    body.append(Store("b3", o * n_out + len(outs) + 1, lvar("at2", "i32")))
    body.append(If(o >= 60, [Store("b3", o * n_out + len(outs) + 2, i32(-1))],
                   [Store("b3", o * n_out + len(outs) + 2, i32(7)), Store("b3", o * n_out + len(outs) + 2, i32(9))]))
    return kir.Kernel("edge", [kir.Binding(0, "b0", "i32"), kir.Binding(1, "b1", "i32"), kir.Binding(2, "b2", "f32"),
                               kir.Binding(3, "b3", "i32", writes=True)], (64, 1, 1), body,
                      [kir.SharedArray("sh", "i32", 64)]), n_out


def _dispatch(code, inputs, out_words):
    from webiree.hal_webgpu.wgpu_driver import request_device
    import wgpu

    _, dev = request_device()
    sm = dev.create_shader_module(code=code)
    U = wgpu.BufferUsage
    bufs = [dev.create_buffer_with_data(data=a.tobytes(), usage=U.STORAGE | U.COPY_SRC) for a in inputs]
    out = dev.create_buffer(size=4 * out_words, usage=U.STORAGE | U.COPY_SRC)
    bufs.append(out)
    pipe = dev.create_compute_pipeline(layout="auto", compute={"module": sm, "entry_point": "main"})
    bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
        {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(bufs)])
    enc = dev.create_command_encoder()
    p = enc.begin_compute_pass()
    p.set_pipeline(pipe)
    p.set_bind_group(0, bg)
    p.dispatch_workgroups(1, 1, 1)
    p.end()
    dev.queue.submit([enc.finish()])
    return np.frombuffer(dev.queue.read_buffer(out), np.int32).copy()


def test_edge_cases_same_bits_as_wgsl(tmp_path):
    k, n_out = _edge_kernel()
    a = np.array([7, -7, 7, -7, -(1 << 31), -(1 << 31), 5, 0, 123456, -1] + list(range(-27, 27)), np.int32)
    b = np.array([2, 2, -2, -2, -1, 0, 0, 0, 33, 31] + list(range(27, -27, -1)), np.int32)
    x = np.array([0.5, -0.5, np.nan, np.inf, -np.inf, 3e9, -3e9, 1e-40, 2.5, -2.5]
                 + list(np.linspace(-4, 4, 54)), np.float32)
    code = _spv(k)
    rc, err = _spirv_val(code, tmp_path)
    assert rc == 0, err
    want = _dispatch(_wgsl(k), [a, b, x], 64 * n_out).reshape(64, n_out)
    got = _dispatch(code, [a, b, x], 64 * n_out).reshape(64, n_out)
    np.testing.assert_array_equal(got, want)
    assert (want[:60, -1] == 9).all() and (want[60:, -1] == -1).all()   # if / else
    assert want[0, 0] == 3 and want[1, 0] == -3 and want[5, 0] == -(1 << 31) and want[4, 0] == -(1 << 31)
    assert want[6, 0] == 5 and want[6, 1] == 0     # x / 0 = x, x % 0 = 0
