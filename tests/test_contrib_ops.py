"""onnxruntime's contrib operators (com.microsoft, and the few it defines in the default
domain) against onnxruntime (CPU); BiasAdd and BiasSplitGelu, which onnxruntime runs only
on GPUs, against numpy formulas of its documentation."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from webiree.errors import UnsupportedOpError
from webiree.testing.models import IR_VERSION, sample_inputs

from .conftest import assert_close, compile_and_run

F = TensorProto.FLOAT
MS = "com.microsoft"


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def ms_model(nodes, inputs, outputs, inits=None, opset=17):
    """A model importing com.microsoft; outputs are (name, shape) pairs (ONNX cannot infer them)."""
    g = helper.make_graph(nodes, "contrib", [vi(n, s) for n, s in inputs], [vi(n, s) for n, s in outputs],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=IR_VERSION)


def node(op, ins, outs, domain=MS, **attrs):
    return helper.make_node(op, ins, outs, name=f"{op.lower()}_node", domain=domain, **attrs)


def rng_inits(seed=0, **shapes):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def refused(model, tmp_path, *words):
    """Compiling `model` raises one UnsupportedOpError naming the node and these words."""
    with pytest.raises(UnsupportedOpError) as e:
        compile_and_run(model, sample_inputs(model), tmp_path)
    text = str(e.value)
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"


def gelu_erf(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


# --- activations ------------------------------------------------------------------

def test_gelu(check):
    check(ms_model([node("Gelu", ["x"], ["y"])], [("x", [2, 5, 16])], [("y", [2, 5, 16])]))


@pytest.mark.parametrize("bias_as", ["none", "input", "initializer"])
def test_fast_gelu(check, bias_as):
    ins = [("x", [2, 5, 16])] + ([("b", [16])] if bias_as == "input" else [])
    inits = rng_inits(b=[16]) if bias_as == "initializer" else {}
    check(ms_model([node("FastGelu", ["x", "b"] if bias_as != "none" else ["x"], ["y"])], ins,
                   [("y", [2, 5, 16])], inits))


def test_bias_gelu(check):
    check(ms_model([node("BiasGelu", ["a", "b"], ["y"])], [("a", [3, 4, 8])], [("y", [3, 4, 8])],
                   rng_inits(b=[8])))


@pytest.mark.parametrize("alpha", [None, 1.0, -0.5])
def test_quick_gelu(check, alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    check(ms_model([node("QuickGelu", ["x"], ["y"], **attrs)], [("x", [4, 33])], [("y", [4, 33])]))


def test_bias_add(tmp_path):
    m = ms_model([node("BiasAdd", ["x", "b", "s"], ["y"])], [("x", [2, 3, 8]), ("s", [2, 3, 8])],
                 [("y", [2, 3, 8])], rng_inits(b=[8]))
    feeds = sample_inputs(m)
    got, _, _ = compile_and_run(m, feeds, tmp_path)
    b = numpy_helper.to_array(m.graph.initializer[0])
    assert_close(got[0], feeds["x"] + b + feeds["s"])


def test_bias_split_gelu(tmp_path):
    m = ms_model([node("BiasSplitGelu", ["x", "b"], ["y"])], [("x", [2, 6, 16])], [("y", [2, 6, 8])],
                 rng_inits(b=[16]))
    feeds = sample_inputs(m)
    got, _, _ = compile_and_run(m, feeds, tmp_path)
    a = feeds["x"].astype(np.float64) + numpy_helper.to_array(m.graph.initializer[0])
    assert_close(got[0], a[..., :8] * gelu_erf(a[..., 8:]))


def test_activation_feeds_matmul_epilogue(check):
    """FastGelu after a MatMul + bias: the pattern the BERT optimizer leaves."""
    inits = rng_inits(w=[16, 32], b=[32])
    check(ms_model([helper.make_node("MatMul", ["x", "w"], ["h"]), node("FastGelu", ["h", "b"], ["y"])],
                   [("x", [2, 4, 16])], [("y", [2, 4, 32])], inits))


# --- normalizations ---------------------------------------------------------------

SKIP_OUTS = {"all": ["y", "mean", "inv", "sum"], "output": ["y"], "sum": ["y", "", "", "sum"],
             "inv": ["y", "", "inv"]}


def _stat_shape(shape):
    return list(shape[:-1]) + [1]


@pytest.mark.parametrize("params", ["gamma", "gamma_beta", "gamma_beta_bias", "gamma_bias"])
@pytest.mark.parametrize("outs", list(SKIP_OUTS))
def test_skip_layer_norm(check, params, outs):
    h, shape = 32, [2, 5, 32]
    names = ["x", "s", "gamma", "beta" if "beta" in params else "", "bias" if "bias" in params else ""]
    while not names[-1]:
        names.pop()
    inits = rng_inits(gamma=[h], beta=[h], bias=[h])
    inits = {k: v for k, v in inits.items() if k in names}
    o = SKIP_OUTS[outs]
    shapes = {"y": shape, "mean": _stat_shape(shape), "inv": _stat_shape(shape), "sum": shape}
    check(ms_model([node("SkipLayerNormalization", names, o, epsilon=1e-5)], [("x", shape), ("s", shape)],
                   [(n, shapes[n]) for n in o if n], inits), elementwise=True)


@pytest.mark.parametrize("skip_shape", [[5, 16], [1, 5, 16]])
def test_skip_layer_norm_broadcast_skip(check, skip_shape):
    check(ms_model([node("SkipLayerNormalization", ["x", "s", "gamma", "beta"], ["y", "", "", "sum"])],
                   [("x", [3, 5, 16]), ("s", skip_shape)], [("y", [3, 5, 16]), ("sum", [3, 5, 16])],
                   rng_inits(gamma=[16], beta=[16])), elementwise=True)


def test_skip_layer_norm_2d_default_epsilon(check):
    check(ms_model([node("SkipLayerNormalization", ["x", "s", "gamma"], ["y"])], [("x", [6, 24]), ("s", [6, 24])],
                   [("y", [6, 24])], rng_inits(gamma=[24])), elementwise=True)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("outs", [["y"], ["y", "", "inv", "sum"], ["y", "", "", "sum"]])
def test_skip_simplified_layer_norm(check, bias, outs):
    shape = [2, 7, 32]
    shapes = {"y": shape, "inv": _stat_shape(shape), "sum": shape}
    names = ["x", "s", "gamma"] + (["bias"] if bias else [])
    check(ms_model([node("SkipSimplifiedLayerNormalization", names, outs, epsilon=1e-6)],
                   [("x", shape), ("s", shape)], [(n, shapes[n]) for n in outs if n],
                   rng_inits(gamma=[32], bias=[32])), elementwise=True)


def test_skip_simplified_mean_output_refused(tmp_path):
    m = ms_model([node("SkipSimplifiedLayerNormalization", ["x", "s", "gamma"], ["y", "mean"])],
                 [("x", [2, 3, 8]), ("s", [2, 3, 8])], [("y", [2, 3, 8]), ("mean", [2, 3, 1])],
                 rng_inits(gamma=[8]))
    refused(m, tmp_path, "skipsimplifiedlayernormalization_node", "mean output")


@pytest.mark.parametrize("axis,inv", [(-1, False), (-1, True), (1, True)])
def test_simplified_layer_norm(check, axis, inv):
    shape = [2, 6, 16]
    scale_shape = shape[axis:]
    outs = ["y", "inv"] if inv else ["y"]
    stat = shape[:axis % 3] + [1] * (3 - axis % 3)
    check(ms_model([node("SimplifiedLayerNormalization", ["x", "scale"], outs, domain="", axis=axis, epsilon=1e-6)],
                   [("x", shape)], [("y", shape)] + ([("inv", stat)] if inv else []),
                   rng_inits(scale=scale_shape)), elementwise=True)


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("outs", [["y", "mean", "inv"], ["y", "", "inv"], ["y", "mean"]])
def test_layer_norm_statistics(check, opset, outs):
    """LayerNormalization's Mean/InvStdDev outputs, and the default-domain op onnxruntime accepts
    before opset 17."""
    shape, stat = [3, 4, 16], [3, 1, 1]
    shapes = {"y": shape, "mean": stat, "inv": stat}
    check(ms_model([node("LayerNormalization", ["x", "scale", "b"], outs, domain="", axis=1)],
                   [("x", shape)], [(n, shapes[n]) for n in outs if n], rng_inits(scale=[4, 16], b=[4, 16]),
                   opset=opset), elementwise=True)


@pytest.mark.parametrize("op", ["LayerNormalization", "SimplifiedLayerNormalization"])
def test_stash_type_refused(tmp_path, op):
    m = ms_model([node(op, ["x", "scale"], ["y"], domain="", stash_type=10)], [("x", [2, 8])], [("y", [2, 8])],
                 rng_inits(scale=[8]))
    refused(m, tmp_path, f"{op.lower()}_node", "stash_type=10")


def test_onnx_op_of_a_later_opset_is_not_taken_for_onnxruntimes():
    """Only the ops onnxruntime defines in the default domain skip ONNX's checker: Gelu at opset 17
    (ONNX's from opset 20, onnxruntime's only in com.microsoft) is still an invalid model."""
    from webiree.compiler.importer import import_model
    from webiree.errors import ModelError

    m = ms_model([node("Gelu", ["x"], ["y"], domain="")], [("x", [2, 8])], [("y", [2, 8])])
    with pytest.raises(ModelError, match="No Op registered for Gelu"):
        import_model(m)


# --- fused ops --------------------------------------------------------------------

@pytest.mark.parametrize("ta,tb,alpha", [(0, 0, None), (1, 0, 0.5), (0, 1, 2.0), (1, 1, -1.0)])
@pytest.mark.parametrize("shapes", ["2d", "batched", "broadcast_b"])
def test_fused_matmul(check, ta, tb, alpha, shapes):
    m, k, n = 5, 8, 6
    batch_a, batch_b = {"2d": ([], []), "batched": ([2, 3], [2, 3]), "broadcast_b": ([2, 3], [])}[shapes]
    sa = batch_a + ([k, m] if ta else [m, k])
    sb = batch_b + ([n, k] if tb else [k, n])
    attrs = {"transA": ta, "transB": tb} | ({} if alpha is None else {"alpha": alpha})
    check(ms_model([node("FusedMatMul", ["a", "b"], ["y"], **attrs)], [("a", sa), ("b", sb)],
                   [("y", batch_a + [m, n])]))


@pytest.mark.parametrize("tba,tbb,ta,tb", [(1, 0, 0, 0), (0, 1, 0, 0), (1, 1, 0, 1), (1, 0, 1, 0)])
def test_fused_matmul_trans_batch(check, tba, tbb, ta, tb):
    """transBatchA/B: the stored operand's first dim sits behind its batch dims."""
    m, k, n = 4, 5, 6

    def stored(batch, rows, cols, tbatch, t):
        logical = batch + ([cols, rows] if t else [rows, cols])
        return logical[-2:-1] + logical[:-2] + logical[-1:] if tbatch else logical
    sa, sb = stored([2, 3], m, k, tba, ta), stored([2, 3], k, n, tbb, tb)
    check(ms_model([node("FusedMatMul", ["a", "b"], ["y"], transA=ta, transB=tb, transBatchA=tba,
                         transBatchB=tbb)], [("a", sa), ("b", sb)], [("y", [2, 3, m, n])]))


CONV_ACTS = [("", None), ("Relu", None), ("Tanh", None), ("Sigmoid", None), ("LeakyRelu", [0.2]),
             ("Clip", [-0.5, 0.7]), ("HardSigmoid", [0.3, 0.4]), ("HardSwish", None)]


@pytest.mark.parametrize("act,params", CONV_ACTS)
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(check, act, params, kernel, with_z):
    attrs = ({"activation": act} if act else {}) | ({"activation_params": params} if params else {})
    pads = [kernel // 2] * 4
    ins = [("x", [1, 3, 6, 6])] + ([("z", [1, 4, 6, 6])] if with_z else [])
    names = ["x", "w", "b"] + (["z"] if with_z else [])
    check(ms_model([node("FusedConv", names, ["y"], pads=pads, **attrs)], ins, [("y", [1, 4, 6, 6])],
                   rng_inits(w=[4, 3, kernel, kernel], b=[4])))


def test_fused_conv_no_bias_strided(check):
    check(ms_model([node("FusedConv", ["x", "w"], ["y"], strides=[2, 2], activation="Relu")],
                   [("x", [2, 3, 9, 9])], [("y", [2, 4, 4, 4])], rng_inits(w=[4, 3, 3, 3])))


@pytest.mark.parametrize("attrs,words", [
    ({"activation": "Gelu"}, ["activation='Gelu'"]),
    ({"activation": "LeakyRelu"}, ["activation_params=[]", "LeakyRelu takes 1"]),
])
def test_fused_conv_refused(tmp_path, attrs, words):
    m = ms_model([node("FusedConv", ["x", "w"], ["y"], **attrs)], [("x", [1, 3, 5, 5])], [("y", [1, 4, 5, 5])],
                 rng_inits(w=[4, 3, 1, 1]))
    refused(m, tmp_path, "fusedconv_node", *words)


def test_fused_matmul_refused(tmp_path):
    m = ms_model([node("FusedMatMul", ["a", "b"], ["y"], transBatchA=1)], [("a", [4, 5]), ("b", [5, 6])],
                 [("y", [4, 6])])
    refused(m, tmp_path, "fusedmatmul_node", "transBatchA=1")


I32 = TensorProto.INT32


@pytest.mark.parametrize("variant", ["full", "no_segment", "position_ids_1s", "position_ids_bs", "mask_only_sum"])
def test_embed_layer_norm(check, variant):
    B, S, H, V, P = 2, 6, 16, 13, 9
    rng = np.random.default_rng(3)
    seg = variant in ("full", "mask_only_sum")
    mask = variant in ("full", "mask_only_sum")
    pid_shape = {"position_ids_1s": [1, S], "position_ids_bs": [B, S]}.get(variant)
    names = ["ids", "seg" if seg else "", "we", "pe", "se" if seg else "", "gamma", "beta", "mask" if mask else "",
             "pid" if pid_shape else ""]
    while not names[-1]:
        names.pop()
    outs = {"full": ["y", "mi", "sum"], "mask_only_sum": ["y", "", "sum"]}.get(variant, ["y", "mi"])
    inits = rng_inits(4, we=[V, H], pe=[P, H], se=[2, H], gamma=[H], beta=[H])
    inits = {k: v for k, v in inits.items() if k in names}
    feeds = {"ids": rng.integers(0, V, (B, S)).astype(np.int32)}
    if seg:
        feeds["seg"] = rng.integers(0, 2, (B, S)).astype(np.int32)
    if mask:
        feeds["mask"] = np.array([[1, 1, 0, 1, 0, 0], [1] * S], np.int32)
    if pid_shape:
        feeds["pid"] = rng.integers(0, P, pid_shape).astype(np.int32)
    out_shapes = {"y": ([B, S, H], F), "mi": ([B], I32), "sum": ([B, S, H], F)}
    g = helper.make_graph([node("EmbedLayerNormalization", names, outs, epsilon=1e-5)], "embed",
                          [vi(n, list(v.shape), I32) for n, v in feeds.items()],
                          [vi(o, *out_shapes[o]) for o in outs if o],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                          ir_version=IR_VERSION)
    check(m, feeds=feeds, elementwise=True)


# --- a model through onnxruntime's BERT optimizer ---------------------------------

IMPLEMENTED_MS = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "Gelu", "FastGelu", "BiasGelu",
                  "QuickGelu", "FusedMatMul", "FusedConv", "EmbedLayerNormalization"}


def encoder(B=2, S=6, H=16, FF=32, seed=0):
    """One BERT-like encoder layer in plain ONNX ops: single-head attention (a form the BERT
    optimizer does not fuse into Attention), residual + LayerNorm, a feed-forward block with the
    erf Gelu spelled out, residual + LayerNorm."""
    rng = np.random.default_rng(seed)

    def w(*s):
        return (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
    mk = helper.make_node
    nodes = [
        mk("MatMul", ["x", "wq"], ["q"]), mk("MatMul", ["x", "wk"], ["k"]), mk("MatMul", ["x", "wv"], ["v"]),
        mk("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), mk("MatMul", ["q", "kt"], ["s"]),
        mk("Mul", ["s", "scale"], ["ss"]), mk("Softmax", ["ss"], ["p"], axis=-1), mk("MatMul", ["p", "v"], ["c"]),
        mk("MatMul", ["c", "wo"], ["o0"]), mk("Add", ["o0", "bo"], ["o"]), mk("Add", ["o", "x"], ["r1"]),
        mk("LayerNormalization", ["r1", "g1", "b1"], ["h1"], axis=-1, epsilon=1e-12),
        mk("MatMul", ["h1", "w1"], ["f0"]), mk("Add", ["f0", "bf1"], ["f1"]),
        mk("Div", ["f1", "sqrt2"], ["gd"]), mk("Erf", ["gd"], ["ge"]), mk("Add", ["ge", "one"], ["ga"]),
        mk("Mul", ["f1", "ga"], ["gm"]), mk("Mul", ["gm", "half"], ["gl"]),
        mk("MatMul", ["gl", "w2"], ["f2"]), mk("Add", ["f2", "bf2"], ["f3"]), mk("Add", ["f3", "h1"], ["r2"]),
        mk("LayerNormalization", ["r2", "g2", "b2"], ["y"], axis=-1, epsilon=1e-12),
    ]
    inits = dict(wq=w(H, H), wk=w(H, H), wv=w(H, H), wo=w(H, H), bo=w(H) * 0.1, scale=np.array(0.25, np.float32),
                 g1=1 + w(H) * 0.1, b1=w(H) * 0.1, w1=w(H, FF), bf1=w(FF) * 0.1, sqrt2=np.array(np.sqrt(2), np.float32),
                 one=np.array(1.0, np.float32), half=np.array(0.5, np.float32), w2=w(FF, H), bf2=w(H) * 0.1,
                 g2=1 + w(H) * 0.1, b2=w(H) * 0.1)
    g = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", F, [B, S, H])],
                          [helper.make_tensor_value_info("y", F, [B, S, H])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)


def test_bert_optimized_encoder(check, tmp_path):
    """The BERT optimizer's output (SkipLayerNormalization, Gelu, Gemm) runs as onnxruntime runs it."""
    import logging

    from onnxruntime.transformers.optimizer import optimize_model

    path = tmp_path / "encoder.onnx"
    onnx.save(encoder(), path)
    logging.disable(logging.WARNING)
    try:
        opt = optimize_model(str(path), model_type="bert", num_heads=1, hidden_size=16, opt_level=1).model
    finally:
        logging.disable(logging.NOTSET)
    contrib = {n.op_type for n in opt.graph.node if n.domain == MS}
    assert "SkipLayerNormalization" in contrib and "Gelu" in contrib, contrib
    assert contrib <= IMPLEMENTED_MS, contrib - IMPLEMENTED_MS
    check(opt, elementwise=True)
