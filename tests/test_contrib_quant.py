"""onnxruntime's block-quantized weight operators (com.microsoft MatMulNBits and
GatherBlockQuantized) against onnxruntime (CPU).

Tolerance: conftest's FP32_TOL (max |diff| <= 1e-4 * max |onnxruntime|). MatMulNBits is compared
at accuracy_level 0, where onnxruntime's CPU kernel dequantizes B and multiplies in float32 (it
agrees with a float64 numpy product to about 4e-7 of the output's scale over these variants);
webiree computes in float32 at every accuracy_level. At accuracy_level 4 onnxruntime quantizes A
to int8 blocks (it differs from the float64 product by about 4e-3 to 1e-2 here, for 2, 4 and 8
bits), so the accuracy_level 4 test compares with onnxruntime's float32 result of the same model
at level 0. GatherBlockQuantized is exact in float32 on both sides ((q - zp) * scale once): it is
compared element-wise as well. The float16 MatMulNBits test allows one float16 rounding of the
output (1e-3 of its scale); 8-bit float zero points, which onnxruntime's CPU kernel refuses, are
compared with the documented formula in float64 numpy.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from webiree.errors import UnsupportedOpError
from webiree.testing.models import IR_VERSION

from .conftest import assert_close, compile_and_run, ort_run

F = TensorProto.FLOAT
MS = "com.microsoft"


def pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack non-negative integers [rows, cols] `bits` wide along each row, low bits first, into
    uint8 [rows, ceil(cols * bits / 8)] (the last byte of a row zero-padded)."""
    per = 8 // bits
    rows, cols = values.shape
    width = -(-cols // per) * per
    v = np.zeros((rows, width), np.uint32)
    v[:, :cols] = values
    v = v.reshape(rows, width // per, per)
    out = np.zeros((rows, width // per), np.uint32)
    for i in range(per):
        out |= v[:, :, i] << (i * bits)
    return out.astype(np.uint8)


def model(nodes, inputs, outputs, inits):
    """inputs / outputs: (name, shape[, type]); inits: name -> numpy array."""
    def vi(spec):
        name, shape, *t = spec
        return helper.make_tensor_value_info(name, t[0] if t else F, shape)
    g = helper.make_graph(nodes, "quant", [vi(s) for s in inputs], [vi(s) for s in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=IR_VERSION)


def compare(m, feeds, tmp_path, ref_model=None, elementwise=False, **kw):
    got, res, _ = compile_and_run(m, feeds, tmp_path, **kw)
    ref = ort_run(ref_model or m, feeds)
    assert len(got) == len(ref) == len(m.graph.output)
    for g, r, o in zip(got, ref, m.graph.output):
        assert_close(g, r, name=o.name, elementwise=elementwise)
    return res


# --- MatMulNBits ------------------------------------------------------------------

def nbits_model(K, N, block, bits=4, zp=None, bias=False, a_shape=(5,), accuracy_level=0, scales_2d=True,
                zp_2d=True, g_idx=False, seed=0):
    """A MatMulNBits of random quantized weights (the padding of the last block random too: it must not
    be read), random scales, zero points `zp` None / 'packed' (uint8) / 'float'; A is a_shape + [K]."""
    rng = np.random.default_rng(seed)
    kb = -(-K // block)
    q = rng.integers(0, 1 << bits, (N, kb * block))
    inits = {"B": pack(q, bits).reshape(N, kb, block * bits // 8)}
    scales = (rng.random((N, kb)) * 0.2 + 0.01).astype(np.float32)
    inits["scales"] = scales if scales_2d else scales.reshape(-1)
    names = ["a", "B", "scales"]
    if zp == "packed":
        z = pack(rng.integers(0, 1 << bits, (N, kb)), bits)
        inits["zp"] = z if zp_2d else z.reshape(-1)
    elif zp == "float":
        z = (rng.random((N, kb)) * (1 << bits)).astype(np.float32)
        inits["zp"] = z if zp_2d else z.reshape(-1)
    names.append("zp" if zp else "")
    if g_idx:
        inits["g_idx"] = (np.arange(K) // block).astype(np.int32)
    names.append("g_idx" if g_idx else "")
    if bias:
        inits["bias"] = rng.standard_normal(N).astype(np.float32)
    names.append("bias" if bias else "")
    while not names[-1]:
        names.pop()
    node = helper.make_node("MatMulNBits", names, ["y"], name="matmulnbits_node", domain=MS, K=K, N=N, bits=bits,
                            block_size=block, accuracy_level=accuracy_level)
    m = model([node], [("a", list(a_shape) + [K])], [("y", list(a_shape) + [N])], inits)
    feeds = {"a": rng.standard_normal(list(a_shape) + [K]).astype(np.float32)}
    return m, feeds


def matmul_dispatches(res):
    return [d for d in res.program.ops if "matmulnbits_node" in d.nodes]


def assert_one_dispatch(res):
    """The dequantization of B runs inside the matmul's loads (a prologue), the bias in its epilogue:
    one dispatch for the node, reading the packed bytes of B (not a dequantized copy): as shipped,
    or, at 4 bits with N % 4 == 0 and no padded block, the same bytes as words along K (B:words)."""
    ops = matmul_dispatches(res)
    assert len(ops) == 1, res.dumps["fuse"]
    (mm,) = ops
    assert type(mm).__name__ == "MatMul" and len(mm.prologues) == 1, res.dumps["fuse"]
    assert ("B:words" if mm.nibbles else "B") in mm.reads(), mm.reads()
    words = res.program.tensors.get("B:words")
    assert mm.nibbles is None or (words.dtype == "u32" and words.data.nbytes == res.graph.constants["B"].nbytes)


@pytest.mark.parametrize("block", [16, 32, 128])
@pytest.mark.parametrize("K", ["multiple", "padded"])
@pytest.mark.parametrize("zp", [None, "packed", "float"])
def test_matmul_nbits_4bit(tmp_path, block, K, zp):
    k = 2 * block if K == "multiple" else 2 * block + 11
    m, feeds = nbits_model(k, 7, block, zp=zp)
    res = compare(m, feeds, tmp_path, dump_after=("fuse",))
    assert_one_dispatch(res)


@pytest.mark.parametrize("bits,zp", [(2, None), (2, "packed"), (2, "float"), (8, None), (8, "packed")])
@pytest.mark.parametrize("K,block", [(64, 16), (70, 32)])
def test_matmul_nbits_2_and_8_bits(tmp_path, bits, zp, K, block):
    m, feeds = nbits_model(K, 9, block, bits=bits, zp=zp, bias=True)
    res = compare(m, feeds, tmp_path, dump_after=("fuse",))
    assert_one_dispatch(res)


@pytest.mark.parametrize("zp", [None, "packed", "float"])
@pytest.mark.parametrize("a_shape", [(6,), (2, 3), (1,), ()])
def test_matmul_nbits_bias_and_batch(tmp_path, zp, a_shape):
    """A 1-D, 2-D and 3-D (batched), the bias fused as the matmul's epilogue; N odd; K padded."""
    m, feeds = nbits_model(70, 13, 32, zp=zp, bias=True, a_shape=a_shape, seed=1)
    res = compare(m, feeds, tmp_path, dump_after=("fuse",))
    assert_one_dispatch(res)
    (mm,) = matmul_dispatches(res)
    assert mm.epilogue is not None


def test_matmul_nbits_1d_params_and_default_g_idx(tmp_path):
    """scales and zero points given flat ([N * k_blocks] / [N * ceil(k_blocks / 2)]), g_idx the
    default k // block_size (onnxruntime then takes its reordering path, with float zero points)."""
    m, feeds = nbits_model(96, 5, 32, zp="packed", scales_2d=False, zp_2d=False, seed=2)
    compare(m, feeds, tmp_path)
    m, feeds = nbits_model(96, 5, 32, zp="float", scales_2d=False, zp_2d=False, g_idx=True, seed=3)
    compare(m, feeds, tmp_path)


def numpy_matmul_nbits(m, a):
    """MatMulNBits in float64 numpy, from the model's initializers (the documented semantics)."""
    node = m.graph.node[0]
    at = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    K, N, bits, bs = at["K"], at["N"], at["bits"], at["block_size"]
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    per, kb = 8 // bits, -(-K // bs)

    def unpack(packed, count):
        rows = packed.reshape(N, -1).astype(np.int64)
        vals = (rows[:, :, None] >> (np.arange(per) * bits)) & ((1 << bits) - 1)
        return vals.reshape(N, -1)[:, :count]
    q = unpack(inits["B"], K)
    zp = inits.get("zp")
    z = np.full((N, kb), 1 << (bits - 1)) if zp is None else \
        unpack(zp, kb) if zp.dtype == np.uint8 else zp.reshape(N, kb).astype(np.float64)
    w = (q - np.repeat(z, bs, axis=1)[:, :K]) * np.repeat(inits["scales"].reshape(N, kb), bs, axis=1)[:, :K]
    y = a.astype(np.float64) @ w.T
    return y + inits["bias"] if "bias" in inits else y


@pytest.mark.parametrize("bits", [4, 8])
def test_matmul_nbits_float_zero_points_vs_numpy(tmp_path, bits):
    """Float zero points at 8 bits, which onnxruntime's CPU kernel refuses ("only 2b and 4b ... for
    unpacked compute"): against the documented formula in float64 numpy (4 bits too, to show the
    formula is onnxruntime's)."""
    m, feeds = nbits_model(70, 9, 32, bits=bits, zp="float", bias=True, seed=6)
    got, _, _ = compile_and_run(m, feeds, tmp_path)
    ref = numpy_matmul_nbits(m, feeds["a"])
    assert_close(got[0], ref)
    if bits == 4:
        assert_close(ort_run(m, feeds)[0], ref)


def test_matmul_nbits_symbolic_sequence(tmp_path):
    """One build for every sequence length in a range (A [batch, seq, K] with seq symbolic): the
    dequantization still fused into the matmul."""
    m, feeds = nbits_model(80, 24, 16, zp="packed", bias=True, a_shape=(2, 3))
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[1].dim_param = "seq"
    _, res, sess = compile_and_run(m, feeds, tmp_path, dims={"seq": (1, 16)}, dump_after=("fuse",))
    assert_one_dispatch(res)
    rng = np.random.default_rng(7)
    for seq in (1, 3, 16):
        f = {"a": rng.standard_normal((2, seq, 80)).astype(np.float32)}
        assert_close(sess.run(None, f)[0], ort_run(m, f)[0])


def test_matmul_nbits_float16(tmp_path):
    """A, scales, bias and Y in float16 (computed in f32, Y rounded to float16 as onnxruntime's CPU
    kernel does): within one float16 rounding of the output (2^-11 relative, scale-relative 1e-3)."""
    m, feeds = nbits_model(96, 10, 32, zp="packed", bias=True, seed=4)
    H = TensorProto.FLOAT16
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.elem_type = H
    for init in m.graph.initializer:
        if init.name in ("scales", "bias"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    feeds = {"a": feeds["a"].astype(np.float16)}
    got, _, _ = compile_and_run(m, feeds, tmp_path)
    ref = ort_run(m, feeds)[0]
    assert got[0].dtype == np.float16
    assert_close(got[0].astype(np.float32), ref.astype(np.float32), tol=1e-3)


def test_matmul_nbits_accuracy_level_4(tmp_path):
    """accuracy_level 4 lets onnxruntime quantize A to int8; webiree computes in f32 at every level,
    so the reference is onnxruntime's f32 result (the same model at level 0)."""
    m, feeds = nbits_model(256, 11, 32, zp="packed", bias=True, a_shape=(2, 4), accuracy_level=4)
    ref_model, _ = nbits_model(256, 11, 32, zp="packed", bias=True, a_shape=(2, 4), accuracy_level=0)
    compare(m, feeds, tmp_path, ref_model=ref_model)


@pytest.mark.parametrize("N", [64, 62])
def test_matmul_nbits_keeps_weights_packed(tmp_path, N):
    """The build's weights hold B's bytes, never a float [N, K] copy: at N % 4 == 0 as u32 words
    [K/8, N] of eight values along K (the same bytes), otherwise as shipped (uint8 elements)."""
    K = 512
    m, feeds = nbits_model(K, N, 32, zp="packed")
    res = compare(m, feeds, tmp_path)
    consts = {t.name: t for t in res.program.tensors.values() if t.kind == "const"}
    if N % 4 == 0:
        assert "B" not in consts and consts["B:words"].shape == (K // 8, N) and consts["B:words"].dtype == "u32"
        words = np.asarray(consts["B:words"].data)
        assert np.array_equal(words.T.copy().view(np.uint8).reshape(-1), res.graph.constants["B"].reshape(-1))
    else:
        assert "B:words" not in consts and consts["B"].shape == (N, K // 32, 16)
    assert not any(t.shape in ((N, K), (K, N)) for t in consts.values())
    assert len(res.weights) < 4 * N * K


def test_matmul_nbits_tied_weight_keeps_its_layout(tmp_path):
    """A B that two MatMulNBits read (a tied weight) is not laid out anew for either: weights.bin
    holds its bytes once."""
    K, N = 256, 32
    m, feeds = nbits_model(K, N, 32)
    node = m.graph.node[0]
    twin = helper.make_node("MatMulNBits", ["a2", "B", "scales"], ["y2"], name="twin", domain=MS, K=K, N=N, bits=4,
                            block_size=32)
    m.graph.node.append(twin)
    m.graph.input.append(helper.make_tensor_value_info("a2", F, [3, K]))
    m.graph.output.append(helper.make_tensor_value_info("y2", F, [3, N]))
    feeds["a2"] = np.random.default_rng(9).standard_normal((3, K)).astype(np.float32)
    res = compare(m, feeds, tmp_path)
    consts = {t.name for t in res.program.tensors.values() if t.kind == "const"}
    assert "B" in consts and "B:words" not in consts, consts
    assert node.name and len(res.weights) < N * K / 2 + 4 * N * (K // 32) + 1024


def parallel_nbits(widths, blocks, zp=None, K=128, rows=10, seed=11):
    """MatMulNBits nodes of one A (a BERT's Q, K and V projections), node i of N = widths[i] and
    block blocks[i], each with a bias; y [rows, len(widths)] holds each output's sums over its
    row after a ReLU (a reduction, as attention reads its projections, not elementwise ops
    alone to the graph output, where a product keeps its own dispatch)."""
    rng = np.random.default_rng(seed)
    nodes, inits, outs = [], {}, []
    for i, (N, block) in enumerate(zip(widths, blocks)):
        kb = K // block
        inits[f"B{i}"] = pack(rng.integers(0, 16, (N, K)), 4).reshape(N, kb, block // 2)
        inits[f"s{i}"] = (rng.random((N, kb)) * 0.2 + 0.01).astype(np.float32)
        inits[f"bias{i}"] = rng.standard_normal(N).astype(np.float32)
        names = ["a", f"B{i}", f"s{i}"]
        if zp:
            inits[f"z{i}"] = pack(rng.integers(0, 16, (N, kb)), 4)
            names.append(f"z{i}")
        names += [""] * (5 - len(names)) + [f"bias{i}"]
        nodes.append(helper.make_node("MatMulNBits", names, [f"p{i}"], name=f"proj{i}", domain=MS, K=K, N=N, bits=4,
                                      block_size=block))
        nodes.append(helper.make_node("Relu", [f"p{i}"], [f"r{i}"]))
        nodes.append(helper.make_node("ReduceSum", [f"r{i}", "axis"], [f"c{i}"], keepdims=1))
        outs.append(f"c{i}")
    inits["axis"] = np.array([1], np.int64)
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
    m = model(nodes, [("a", [rows, K])], [("y", [rows, len(widths)])], inits)
    return m, {"a": rng.standard_normal((rows, K)).astype(np.float32)}


@pytest.mark.parametrize("zp", [None, "packed"])
def test_matmul_nbits_parallel_products_combined(tmp_path, zp):
    """4-bit products of one A with weights of one form are one product (passes.py
    combine_parallel_matmuls): their words, scales and zero points side by side, one
    dequantization; weights.bin keeps their bytes. A product of another block size keeps its own."""
    m, feeds = parallel_nbits([96, 32, 64], [32, 32, 32], zp=zp)
    res = compare(m, feeds, tmp_path / "same")
    mms = [op for op in res.program.ops if type(op).__name__ == "MatMul"]
    assert [(op.n, op.nibbles.words) for op in mms] == [(192, "B0:words:combined")], res.program.summary()
    consts = {t.name: t for t in res.program.tensors.values() if t.kind == "const"}
    assert consts["B0:words:combined"].shape == (128 // 8, 192) and consts["s0:blocks:combined"].shape == (4, 192)
    assert not any(n.startswith(("B1", "B2")) for n in consts)
    m, feeds = parallel_nbits([96, 32, 64], [32, 64, 32], zp=zp)
    res = compare(m, feeds, tmp_path / "blocks")
    mms = [op for op in res.program.ops if type(op).__name__ == "MatMul"]
    assert sorted(op.n for op in mms) == [32, 160], res.program.summary()


def test_matmul_nbits_from_onnxruntime_quantizer(tmp_path):
    """A float MatMul model quantized by onnxruntime's own MatMulNBitsQuantizer (4 bits, block 32,
    asymmetric: packed zero points) builds and matches onnxruntime."""
    from webiree.testing.models import quantize_nbits_model

    rng = np.random.default_rng(5)
    K, N1, N2 = 96, 40, 24
    w1 = (rng.standard_normal((K, N1)) / np.sqrt(K)).astype(np.float32)
    w2 = (rng.standard_normal((N1, N2)) / np.sqrt(N1)).astype(np.float32)
    b1 = rng.standard_normal(N1).astype(np.float32) * 0.1
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", F, [3, 4, K])],
                          [helper.make_tensor_value_info("y", F, [3, 4, N2])],
                          [numpy_helper.from_array(v, k) for k, v in dict(w1=w1, w2=w2, b1=b1).items()])
    f32 = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    qm = quantize_nbits_model(f32, symmetric=False)
    assert [n.op_type for n in qm.graph.node].count("MatMulNBits") == 2, [n.op_type for n in qm.graph.node]
    feeds = {"x": rng.standard_normal((3, 4, K)).astype(np.float32)}
    res = compare(qm, feeds, tmp_path)
    assert not any(t.kind == "const" and t.dtype == "f32" and len(t.shape) == 2 and t.shape[0] * t.shape[1] >= K * N2
                   for t in res.program.tensors.values())
    # and it is close to the float model it was quantized from (4-bit weights: a few percent)
    assert_close(compile_and_run(qm, feeds, tmp_path)[0][0], ort_run(f32, feeds)[0], tol=0.1)


def refused(m, feeds, tmp_path, *words):
    with pytest.raises(UnsupportedOpError) as e:
        compile_and_run(m, feeds, tmp_path)
    text = str(e.value)
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"


def _with_attrs(m, **attrs):
    m = onnx.ModelProto.FromString(m.SerializeToString())
    node = m.graph.node[0]
    for k, v in attrs.items():
        for a in list(node.attribute):
            if a.name == k:
                node.attribute.remove(a)
        node.attribute.append(helper.make_attribute(k, v))
    return m


@pytest.mark.parametrize("attrs,words", [
    ({"bits": 3}, ["bits=3"]),
    ({"weight_prepacked": 1}, ["weight_prepacked=1"]),
    ({"block_size": 24}, ["block_size=24"]),
])
def test_matmul_nbits_refused_attributes(tmp_path, attrs, words):
    m, feeds = nbits_model(64, 4, 16)
    refused(_with_attrs(m, **attrs), feeds, tmp_path, "matmulnbits_node", *words)


def test_matmul_nbits_refused_g_idx(tmp_path):
    m, feeds = nbits_model(64, 4, 16, g_idx=True)
    g = next(i for i in m.graph.initializer if i.name == "g_idx")
    g.CopyFrom(numpy_helper.from_array((np.arange(64) % 4).astype(np.int32), "g_idx"))
    refused(m, feeds, tmp_path, "matmulnbits_node", "g_idx", "act-order")


# --- GatherBlockQuantized -----------------------------------------------------------

def gbq_model(rows, cols, block, bits=4, zp=False, indices_shape=(2, 3), index_values=None, seed=0,
              int64=True):
    """A uint8 table [rows, cols] of `bits`-wide elements packed along its last dim (gather_axis 0,
    quantize_axis 1), scales [rows, ceil(cols / block)], packed zero points."""
    rng = np.random.default_rng(seed)
    nb = -(-cols // block)
    inits = {"data": pack(rng.integers(0, 1 << bits, (rows, cols)), bits),
             "scales": (rng.random((rows, nb)) * 0.2 + 0.01).astype(np.float32)}
    names = ["data", "ids", "scales"]
    if zp:
        inits["zp"] = pack(rng.integers(0, 1 << bits, (rows, nb)), bits)
        names.append("zp")
    node = helper.make_node("GatherBlockQuantized", names, ["y"], name="gbq_node", domain=MS, gather_axis=0,
                            quantize_axis=1, block_size=block, bits=bits)
    it = TensorProto.INT64 if int64 else TensorProto.INT32
    m = model([node], [("ids", list(indices_shape), it)], [("y", list(indices_shape) + [cols])], inits)
    ids = index_values if index_values is not None else rng.integers(-rows, rows, indices_shape)
    return m, {"ids": np.asarray(ids, np.int64 if int64 else np.int32).reshape(indices_shape)}


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("cols,block", [(64, 16), (96, 32), (80, 32)])
def test_gather_block_quantized_uint8(tmp_path, bits, zp, cols, block):
    m, feeds = gbq_model(9, cols, block, bits=bits, zp=zp)
    res = compare(m, feeds, tmp_path, elementwise=True)
    assert len([op for op in res.program.ops if "gbq_node" in op.nodes]) == 1


def test_gather_block_quantized_out_of_range_and_int32(tmp_path):
    """Negative indices count from the end; an index out of range gives a row of zeros (onnxruntime's
    documented behaviour, unlike Gather); int32 indices; a 1-D index tensor."""
    m, feeds = gbq_model(6, 64, 32, zp=True, indices_shape=(5,), index_values=[0, -1, 6, -7, 3], int64=False)
    compare(m, feeds, tmp_path, elementwise=True)


def int4_model(data_shape, gather_axis, quantize_axis, block, signed, zp, indices, seed=0):
    """GatherBlockQuantized of an ONNX int4 / uint4 table (any axes)."""
    rng = np.random.default_rng(seed)
    t = TensorProto.INT4 if signed else TensorProto.UINT4
    lo, hi = (-8, 8) if signed else (0, 16)
    ds = list(data_shape)
    ss = list(ds)
    ss[quantize_axis] = -(-ds[quantize_axis] // block)
    q = rng.integers(lo, hi, ds)
    inits = [helper.make_tensor("data", t, ds, q.reshape(-1).tolist()),
             numpy_helper.from_array((rng.random(ss) * 0.2 + 0.01).astype(np.float32), "scales")]
    names = ["data", "ids", "scales"]
    if zp:
        inits.append(helper.make_tensor("zp", t, ss, rng.integers(lo, hi, ss).reshape(-1).tolist()))
        names.append("zp")
    node = helper.make_node("GatherBlockQuantized", names, ["y"], name="gbq_node", domain=MS,
                            gather_axis=gather_axis, quantize_axis=quantize_axis, block_size=block, bits=4)
    ids = np.asarray(indices, np.int64)
    out = ds[:gather_axis] + list(ids.shape) + ds[gather_axis + 1:]
    g = helper.make_graph([node], "int4", [helper.make_tensor_value_info("ids", TensorProto.INT64, list(ids.shape))],
                          [helper.make_tensor_value_info("y", F, out)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                          ir_version=IR_VERSION)
    return m, {"ids": ids}


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("shape,gather_axis,quantize_axis,ids", [
    ((7, 48), 0, 1, [[1, -2], [6, 0]]),
    ((48, 5), 1, 0, [4, 0, -1]),
    ((3, 6, 33), 1, 2, [[5], [2]]),
    ((3, 32, 5), 2, 1, [2, 9, -5]),
])
def test_gather_block_quantized_int4(tmp_path, signed, zp, shape, gather_axis, quantize_axis, ids):
    """ONNX's int4 / uint4 tables (kept 4 bits an element): any gather and quantize axis; odd
    element counts; an out-of-range index gives zeros."""
    m, feeds = int4_model(shape, gather_axis, quantize_axis, 16, signed, zp, ids)
    compare(m, feeds, tmp_path, elementwise=True)


def test_int4_graph_input_refused(tmp_path):
    """int4 / uint4 stay inside the build (constants kept 4 bits an element): a graph input of such a
    type is refused by name, before any node is compiled."""
    node = helper.make_node("GatherBlockQuantized", ["data", "ids", "scales"], ["y"], name="gbq_node", domain=MS,
                            quantize_axis=1, block_size=16)
    g = helper.make_graph([node], "int4_input", [helper.make_tensor_value_info("data", TensorProto.INT4, [4, 32]),
                                                 helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", F, [2, 32])],
                          [numpy_helper.from_array(np.ones((4, 2), np.float32), "scales")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                          ir_version=IR_VERSION)
    refused(m, {"ids": np.zeros(2, np.int64)}, tmp_path, "graph input (data)", "element type")


@pytest.mark.parametrize("attrs,words", [
    ({"gather_axis": 1}, ["gather_axis=1", "uint8"]),
    ({"bits": 3}, ["bits=3"]),
    ({"block_size": 24}, ["block_size=24"]),
])
def test_gather_block_quantized_refused(tmp_path, attrs, words):
    m, feeds = gbq_model(4, 64, 16)
    refused(_with_attrs(m, **attrs), feeds, tmp_path, "gbq_node", *words)


def test_gather_block_quantized_float8_refused(tmp_path):
    """float8 tables (onnxruntime's symmetric FP8 form) are refused by type."""
    data = helper.make_tensor("data", TensorProto.FLOAT8E4M3FN, [4, 32], np.linspace(-2, 2, 128).tolist())
    node = helper.make_node("GatherBlockQuantized", ["data", "ids", "scales"], ["y"], name="gbq_node", domain=MS,
                            quantize_axis=1, block_size=16)
    g = helper.make_graph([node], "fp8", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                          [helper.make_tensor_value_info("y", F, [2, 32])],
                          [data, numpy_helper.from_array(np.ones((4, 2), np.float32), "scales")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                          ir_version=IR_VERSION)
    refused(m, {"ids": np.zeros(2, np.int64)}, tmp_path, "gbq_node", "ONNX type 17", "uint8, int4 or uint4")
