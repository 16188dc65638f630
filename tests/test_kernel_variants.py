"""Every kernel variant the config can choose, against onnxruntime.

GPU variants come from WebGPU's default limits: the vec4 workgroup-memory matmul
(`kernels/matmul.py`, `_matmul_shared_vec4`) and the scalar one it falls back to. CPU variants come
from `device_class: cpu` plus, where the adapter has them, subgroups: the
subgroup-broadcast matmul (`kernels/matmul.py`, `_matmul_subgroup`), the register-blocked matmul it
falls back to, and the row-per-invocation softmax / layernorm. The CI adapter is lavapipe,
whose subgroup size is 8.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import webiree
from webiree.errors import LimitsError
from webiree.hal_webgpu.requirements import check_requirements
from webiree.hal_webgpu.wgpu_driver import subgroup_size
from webiree.testing.models import make_model, sample_inputs

from .conftest import assert_close, ort_run
from .test_ops import single, vi

F = TensorProto.FLOAT


@pytest.fixture(scope="module")
def cpu_limits():
    size = subgroup_size()
    assert size in (4, 8, 16), "the test adapter (lavapipe) should run workgroups of 8 as one subgroup"
    return {"device_class": "cpu", "subgroup_size": size}


def run_cpu(model, tmp_path, limits, feeds=None, targets=None, elementwise=False):
    """Build with `limits`, run natively, compare with onnxruntime (element by element too where
    `elementwise`: softmax and normalizations)."""
    feeds = feeds if feeds is not None else sample_inputs(model)
    res = webiree.compile(model, tmp_path / "build", limits=limits, targets=targets)
    got = webiree.InferenceSession(tmp_path / "build").run(None, feeds)
    assert len(got) == len(model.graph.output), (len(got), len(model.graph.output))
    for g, r, o in zip(got, ort_run(model, feeds), model.graph.output, strict=True):
        assert_close(g, r, name=o.name, elementwise=elementwise)
    return res, got


def strategies(res):
    return [d["config"]["strategy"] for d in res.module.info["dispatches"]]


@pytest.mark.parametrize("sa,sb", [
    ([128, 384], [384, 96]),       # K a multiple of 32: no tail
    ([40, 96], [96, 4225]),        # N not a multiple of 4: one column per slot (a 65x65 pointwise conv)
    ([5, 36], [36, 20]),           # tail of 4 values of K, one row
    ([33, 72], [72, 12]),          # rows past a block, tail of 8
    ([1, 64], [64, 1000]),         # one row (a classifier)
    ([2, 3, 17, 40], [40, 24]),    # batch broadcast on B
    ([3, 17, 8], [3, 8, 36]),      # batched, K below one block
])
def test_subgroup_matmul(sa, sb, tmp_path, cpu_limits):
    out = list(np.matmul(np.zeros(sa), np.zeros(sb)).shape)
    res, _ = run_cpu(single("MatMul", [sa, sb], out), tmp_path, cpu_limits)
    assert strategies(res) == ["subgroup-broadcast"]
    assert res.module.limits["subgroup_size"] == cpu_limits["subgroup_size"]


def _same_bits_without_words(m, feeds, got, tmp_path, cpu_limits, monkeypatch, chooser, off):
    """`got` (the build whose subgroup kernel reads B as vec4<u32> words) equals, bit for bit, its
    SPIR-V executable's result and the build with matmul.`chooser` answering `off` (B read
    without words)."""
    from webiree.wgsl_codegen.kernels import matmul
    _, spirv = run_cpu(m, tmp_path / "spirv", cpu_limits, feeds, targets=["spirv"])
    monkeypatch.setattr(matmul, chooser, lambda *a: off)
    res, plain = run_cpu(m, tmp_path / "plain", cpu_limits, feeds)
    assert "array<vec4<u32>>" not in res.module.executables[0].code.decode()
    for other in (plain, spirv):
        np.testing.assert_array_equal(got[0].view(np.uint32), other[0].view(np.uint32))


@pytest.mark.parametrize("sa,sb", [
    ([128, 384], [384, 96]),       # slot pairs, no tail of K
    ([33, 72], [72, 48]),          # rows past a block, a tail of K
    ([3, 17, 40], [3, 40, 64]),    # batched B
    ([5, 36], [36, 20]),           # 5 slots a row: two words a slot
])
def test_subgroup_matmul_of_half_weights(sa, sb, tmp_path, cpu_limits, monkeypatch):
    """A constant B whose every value is a half is stored as f16 pairs (ir/packing.py); where N %
    8 == 0 the subgroup kernel reads 8 of them, two slots, with one vec4<u32> load
    (matmul._half_pairs) instead of two u32 loads a slot. Against onnxruntime, and bit for bit
    against the same model read two words a slot and against its SPIR-V executable."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal(sb).astype(np.float16).astype(np.float32)
    out = list(np.matmul(np.zeros(sa), np.zeros(sb)).shape)
    m = make_model([helper.make_node("MatMul", ["a", "w"], ["y"])], [vi("a", sa)], [vi("y", out)], {"w": w})
    feeds = sample_inputs(m)
    res, got = run_cpu(m, tmp_path / "pairs", cpu_limits, feeds)
    assert strategies(res) == ["subgroup-broadcast"]
    assert res.module.info["memory"]["weights_by_form"] == {"f16": w.size * 2}
    code = res.module.executables[0].code.decode()
    assert ("array<vec4<u32>>" in code) == (sb[-1] % 8 == 0), code[:300]
    _same_bits_without_words(m, feeds, got, tmp_path, cpu_limits, monkeypatch, "_half_pairs", False)


@pytest.mark.parametrize("K,N,block,zp,a_shape", [
    (256, 96, 32, None, (128,)),       # the MiniLM quantizer's form: symmetric, no zero points
    (96, 40, 16, "packed", (33,)),     # blocks shorter than a step of K, a tail of K, rows past a block
    (512, 64, 128, "float", (2, 9)),   # blocks longer than a step, batched A
    (64, 1024, 64, "packed", (1,)),    # one row: a decode step's LM head
])
def test_subgroup_matmul_of_4bit_weights(K, N, block, zp, a_shape, tmp_path, cpu_limits, monkeypatch):
    """A MatMulNBits weight laid out as words of eight 4-bit values of K (compiler/ops/contrib_quant.py
    _nibble_words): the subgroup kernel reads four columns' words with one vec4<u32> load and a
    block's scales with one vec4 load (matmul._nibbles). Against onnxruntime, and bit for bit
    against the same kernel computing B through its prologue and against its SPIR-V executable;
    weights.bin holds the words, scales and zero points in the bytes they were shipped in."""
    from .test_contrib_quant import nbits_model
    m, feeds = nbits_model(K, N, block, zp=zp, bias=True, a_shape=a_shape, seed=K + N)
    res, got = run_cpu(m, tmp_path / "words", cpu_limits, feeds)
    assert strategies(res)[0] == "subgroup-broadcast", strategies(res)
    (mm,) = [d for d in res.module.info["dispatches"] if "matmulnbits_node" in d["nodes"]]
    code = res.module.executables[mm["exec"]].code.decode()
    assert "array<vec4<u32>>" in code, code[:600]
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    memory = res.module.info["memory"]
    zp_bytes = N * (K // block) // 2 if zp == "packed" else 0      # the zero points' nibbles without padding
    assert memory["weights_by_form"]["u4"] == inits["B"].nbytes + zp_bytes, memory
    assert sum(memory["weights_by_form"].values()) <= sum(v.nbytes for v in inits.values()), memory
    _same_bits_without_words(m, feeds, got, tmp_path, cpu_limits, monkeypatch, "_nibbles", None)


def test_subgroup_matmul_epilogue_alpha_and_prologue(tmp_path, cpu_limits):
    """Gemm alpha/beta/bias as the epilogue, A computed by a fused prologue (four values a vec4)."""
    rng = np.random.default_rng(4)
    m = make_model([helper.make_node("Relu", ["a"], ["ar"]),
                    helper.make_node("Gemm", ["ar", "b", "c"], ["g"], alpha=0.7, beta=1.3),
                    helper.make_node("Tanh", ["g"], ["y"])],
                   [vi("a", [19, 44])], [vi("y", [19, 28])],
                   {"b": rng.standard_normal([44, 28]).astype(np.float32),
                    "c": rng.standard_normal([28]).astype(np.float32)})
    res, _ = run_cpu(m, tmp_path, cpu_limits)
    assert strategies(res) == ["subgroup-broadcast"]


def test_subgroup_matmul_with_a_computed_b(tmp_path, cpu_limits):
    """B computed by a fused prologue (attention's bias + transpose) is read one column a slot."""
    rng = np.random.default_rng(10)
    m = make_model([helper.make_node("Add", ["k", "bias"], ["kb"]),
                    helper.make_node("Transpose", ["kb"], ["kt"], perm=[0, 2, 1]),
                    helper.make_node("MatMul", ["q", "kt"], ["y"])],
                   [vi("q", [3, 20, 32]), vi("k", [3, 24, 32])], [vi("y", [3, 20, 24])],
                   {"bias": rng.standard_normal([32]).astype(np.float32)})
    res, _ = run_cpu(m, tmp_path, cpu_limits)
    assert strategies(res) == ["subgroup-broadcast"]
    assert res.module.info["dispatches"][0]["config"]["vector"] == 1


@pytest.mark.parametrize("sa,sb,tb", [([9, 30], [30, 16], 0),    # K not a multiple of 4
                                      ([9, 32], [16, 32], 1)])   # B transposed
def test_matmuls_the_subgroup_kernel_cannot_take(sa, sb, tb, tmp_path, cpu_limits):
    rng = np.random.default_rng(5)
    n = sb[0] if tb else sb[1]
    m = make_model([helper.make_node("Gemm", ["a", "b"], ["y"], transB=tb)], [vi("a", sa)], [vi("y", [sa[0], n])],
                   {"b": rng.standard_normal(sb).astype(np.float32)})
    res, _ = run_cpu(m, tmp_path, cpu_limits)
    assert strategies(res) == ["register-blocked"]
    assert "subgroup_size" not in res.module.limits    # recorded only where a kernel relies on it


@pytest.mark.parametrize("shape,axis", [([12, 128], -1), ([2, 5, 7], 1), ([3, 300], 1)])
def test_row_per_invocation_softmax(shape, axis, tmp_path, cpu_limits):
    x = (np.random.default_rng(6).standard_normal(shape) * 30).astype(np.float32)
    res, _ = run_cpu(single("Softmax", [shape], shape, {"axis": axis}), tmp_path, cpu_limits, {"x0": x},
                     elementwise=True)
    assert strategies(res) == ["row-per-invocation"]


def test_row_per_invocation_layernorm(tmp_path, cpu_limits):
    rng = np.random.default_rng(7)
    m = make_model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)],
                   [vi("x", [13, 384])], [vi("y", [13, 384])],
                   {"s": rng.standard_normal([384]).astype(np.float32),
                    "b": rng.standard_normal([384]).astype(np.float32)})
    res, _ = run_cpu(m, tmp_path, cpu_limits, elementwise=True)
    assert strategies(res) == ["row-per-invocation"]


@pytest.mark.parametrize("which", ["matmul", "matmul_columns", "depthwise"])
def test_cpu_kernels_from_spirv(which, tmp_path, cpu_limits):
    """The same kernel IR as SPIR-V (OpGroupNonUniformBroadcast; spirv-val runs at build)."""
    m = {"matmul": lambda: single("MatMul", [[33, 72], [72, 12]], [33, 12]),
         "matmul_columns": lambda: single("MatMul", [[33, 72], [72, 13]], [33, 13]),
         "depthwise": lambda: single("Conv", [[1, 4, 9, 11], [4, 1, 3, 3]], [1, 4, 9, 11],
                                     {"group": 4, "pads": [1, 1, 1, 1]})}[which]()
    feeds = sample_inputs(m)
    _, spv = run_cpu(m, tmp_path / "spv", cpu_limits, feeds, targets="spirv")
    _, wgsl = run_cpu(m, tmp_path / "wgsl", cpu_limits, feeds)
    np.testing.assert_array_equal(spv[0], wgsl[0])


def test_subgroup_size_is_checked_at_load():
    needed = {"subgroup_size": 8}
    check_requirements(needed, {"subgroup_size": 8})
    with pytest.raises(LimitsError, match="subgroups of 8 .* has no usable subgroups"):
        check_requirements(needed, {})
    with pytest.raises(LimitsError, match="runs subgroups of 4") as e:
        check_requirements(needed, {"subgroup_size": 4})
    assert "--limits adapter" in e.value.hint


@pytest.mark.parametrize("sa,sb", [
    ([1000, 64], [64, 520]),       # many tiles, rows and columns past the last one
    ([1000, 36], [36, 264]),       # K not a multiple of the K step: the last step is zero-filled
    ([2, 3, 200, 24], [24, 256]),  # batch broadcast on B
    ([24, 70, 8], [24, 8, 128]),   # batched, one K step
    ([1000, 64], [64, 4225]),      # N not a multiple of 4 (a 65 x 65 pointwise conv): B gathered, a tail slot
    ([3, 300, 36], [36, 130]),     # batched, N % 4 == 2
])
def test_vec4_tiled_matmul(sa, sb, check):
    out = list(np.matmul(np.zeros(sa), np.zeros(sb)).shape)
    res = check(single("MatMul", [sa, sb], out))
    assert strategies(res) == ["tiled-shared-vec4"]


def test_small_gpu_matmul_takes_the_scalar_tiles(check):
    """Too few vec4 tiles to fill a GPU and K too short to split: the scalar kernel's smaller tiles."""
    assert strategies(check(single("MatMul", [[128, 96], [96, 128]], [128, 128]))) == ["tiled-shared"]
    assert strategies(check(single("MatMul", [[128, 160], [160, 128]], [128, 128]))) == ["tiled-shared"]


@pytest.mark.parametrize("sa,sb,tb", [([128, 512], [512, 128], 0),   # BERT's bottleneck product
                                      ([37, 300], [29, 300], 1),     # B transposed, tiles and K ragged
                                      ([4, 20, 260], [260, 12], 0),  # batched
                                      ([128, 128], [128, 256], 0)])  # K = 128 (config.SPLIT_K_SHORT)
def test_split_k_matmul(sa, sb, tb, check):
    rng = np.random.default_rng(9)
    n = sb[-2] if tb else sb[-1]
    m = make_model([helper.make_node("MatMul" if not tb else "Gemm", ["a", "b"], ["y"], **({"transB": 1} if tb else {}))],
                   [vi("a", sa)], [vi("y", sa[:-1] + [n])], {"b": rng.standard_normal(sb).astype(np.float32)})
    res = check(m)
    assert strategies(res) == ["split-k"]


def test_vec4_tiled_matmul_epilogue_alpha_and_spirv(tmp_path):
    rng = np.random.default_rng(8)
    m = make_model([helper.make_node("Gemm", ["a", "b", "c"], ["g"], alpha=0.7, beta=1.3),
                    helper.make_node("Tanh", ["g"], ["y"])],
                   [vi("a", [640, 44])], [vi("y", [640, 200])],
                   {"b": rng.standard_normal([44, 200]).astype(np.float32),
                    "c": rng.standard_normal([200]).astype(np.float32)})
    feeds = sample_inputs(m)
    res, wgsl = run_cpu(m, tmp_path / "wgsl", "gpu", feeds)
    assert strategies(res) == ["tiled-shared-vec4"]
    _, spv = run_cpu(m, tmp_path / "spv", "gpu", feeds, targets="spirv")
    np.testing.assert_array_equal(spv[0], wgsl[0])


def test_vec4_tiled_pointwise_conv_with_a_column_tail_and_spirv(tmp_path):
    """DeepLabV3's 1x1 convolutions over 65 x 65 positions: 4,225 columns, B's rows gathered value by
    value, the last slot stored lane by lane through the bias and clip epilogue; a fused Relu on
    B's producer is computed in the gather. SPIR-V gives the same bits."""
    rng = np.random.default_rng(14)
    m = make_model([helper.make_node("Relu", ["x"], ["r"]),
                    helper.make_node("Conv", ["r", "w", "b"], ["c"]),
                    helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
                   [vi("x", [1, 48, 65, 65])], [vi("y", [1, 160, 65, 65])],
                   {"w": rng.standard_normal([160, 48, 1, 1]).astype(np.float32),
                    "b": rng.standard_normal([160]).astype(np.float32),
                    "lo": np.array(-1.0, np.float32), "hi": np.array(6.0, np.float32)})
    feeds = sample_inputs(m)
    res, wgsl = run_cpu(m, tmp_path / "wgsl", "gpu", feeds)
    assert strategies(res) == ["tiled-shared-vec4"]
    _, spv = run_cpu(m, tmp_path / "spv", "gpu", feeds, targets="spirv")
    np.testing.assert_array_equal(spv[0], wgsl[0])


@pytest.mark.parametrize("x,w,kw", [
    ([1, 8, 13, 14], [8, 1, 3, 3], dict(group=8, pads=[1, 1, 1, 1])),                 # depthwise
    ([1, 8, 13, 15], [8, 1, 3, 3], dict(group=8, strides=[2, 2], pads=[1, 1, 1, 1])),  # strided, ragged row
    ([2, 6, 12, 12], [6, 1, 3, 3], dict(group=6, dilations=[2, 2], pads=[2, 2, 2, 2])),  # dilated, batch 2
    ([1, 3, 17, 17], [16, 3, 3, 3], dict(strides=[2, 2], pads=[1, 1, 1, 1])),       # a stem: 3 input channels
    ([1, 4, 9, 10], [4, 2, 1, 5], dict(group=2, pads=[0, 2, 0, 2])),                 # grouped 1x5
])
def test_row_block_conv(x, w, kw, tmp_path, cpu_limits):
    rng = np.random.default_rng(12)
    out = [x[0], w[0], *(
        (x[2 + d] + kw.get("pads", [0] * 4)[d] + kw.get("pads", [0] * 4)[d + 2]
         - kw.get("dilations", [1, 1])[d] * (w[2 + d] - 1) - 1) // kw.get("strides", [1, 1])[d] + 1 for d in range(2))]
    m = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], **kw),
                    helper.make_node("Clip", ["c", "lo", "hi"], ["y"])],
                   [vi("x", x)], [vi("y", out)],
                   {"w": rng.standard_normal(w).astype(np.float32), "b": rng.standard_normal([w[0]]).astype(np.float32),
                    "lo": np.array(-1.0, np.float32), "hi": np.array(6.0, np.float32)})
    res, _ = run_cpu(m, tmp_path, cpu_limits)
    assert strategies(res) == ["row-block"]


def test_every_op_kind_has_a_strategy_for_every_device_class():
    from webiree.ir import program as P
    from webiree.wgsl_codegen import config

    kinds = {c for c in vars(P).values() if isinstance(c, type) and issubclass(c, P.Op) and c not in (P.Op, P.Anchor)}
    assert kinds == set(config.TABLE)
    for kind, by_class in config.TABLE.items():
        assert set(by_class) == {"cpu", "gpu"} and all(by_class.values()), kind
        assert all(s in config.PLANNERS for ss in by_class.values() for s in ss), kind


def test_forced_strategy_that_breaks_a_prerequisite_names_it(tmp_path, monkeypatch):
    """A tuning table or benchmark that forces vec4 tiles on a product whose K is not a multiple of
    4 gets an error naming the strategy and the prerequisite, never a wrong kernel."""
    from webiree.ir import program as P
    from webiree.wgsl_codegen import config

    forced = config.KernelConfig((16, 16, 1), (1, 1, 16), 4, "tiled-shared-vec4")
    original = config.choose
    monkeypatch.setattr(config, "choose", lambda op, prog, lim: forced if isinstance(op, P.MatMul)
                        else original(op, prog, lim))
    m = single("MatMul", [[32, 18], [18, 30]], [32, 30])
    with pytest.raises(webiree.CompilerBug, match="the tiled-shared-vec4 kernel needs vec4 rows"):
        webiree.compile(m, tmp_path)


@pytest.mark.parametrize("n,vector", [(96, 4), (49, 1)])
def test_subgroup_blocks_of_four_wide_subgroups_stay_small(n, vector, tmp_path):
    """Where subgroups are 4 wide (SwiftShader, which compiles every pipeline before a page's first
    result) the register block is at most 8 rows x 4 slots (config.SMALL_SUBGROUP_ROWS); with
    subgroups of 8 (lavapipe) it keeps 16 rows. Sizes are read from the recorded plan."""
    m = single("MatMul", [[128, 384], [384, n]], [128, n])
    tiles = {}
    for sg in (4, 8):
        res = webiree.compile(m, tmp_path / f"sg{sg}", limits={"device_class": "cpu", "subgroup_size": sg})
        cfg = res.module.info["dispatches"][0]["config"]
        assert (cfg["strategy"], cfg["vector"], cfg["workgroup_size"]) == ("subgroup-broadcast", vector, (sg, 1, 1))
        tiles[sg] = tuple(cfg["tile"])
    slots = n // vector
    assert tiles[4] == (8, min(4, -(-slots // 4), 2 if vector == 4 else 8), 16)
    assert tiles[8] == (16, min(-(-slots // 8), 2 if vector == 4 else 8), 32)


def test_subgroup_blocks_of_four_with_a_computed_b(tmp_path):
    """A B computed where it is loaded (attention's K: bias added, transposed) takes 2 column slots
    where subgroups are 4 wide: its computation is repeated for every slot of every K step."""
    rng = np.random.default_rng(11)
    m = make_model([helper.make_node("Add", ["k", "bias"], ["kb"]),
                    helper.make_node("Transpose", ["kb"], ["kt"], perm=[0, 2, 1]),
                    helper.make_node("Mul", ["kt", "s"], ["ks"]),
                    helper.make_node("MatMul", ["q", "ks"], ["y"])],
                   [vi("q", [12, 128, 32]), vi("k", [12, 128, 32])], [vi("y", [12, 128, 128])],
                   {"bias": rng.standard_normal([32]).astype(np.float32), "s": np.float32(0.125)})
    tiles = {}
    for sg in (4, 8):
        res = webiree.compile(m, tmp_path / f"sg{sg}", limits={"device_class": "cpu", "subgroup_size": sg})
        (cfg,) = [d["config"] for d in res.module.info["dispatches"]]
        assert (cfg["strategy"], cfg["vector"]) == ("subgroup-broadcast", 1)
        tiles[sg] = tuple(cfg["tile"])
    assert tiles == {4: (8, 2, 16), 8: (16, 8, 32)}
