"""onnxruntime's attention family (com.microsoft Attention, MultiHeadAttention, RotaryEmbedding)
against onnxruntime's CPU kernels, and the variants refused at build with one clear error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from webiree.errors import UnsupportedOpError

from .conftest import assert_close, compile_and_run, ort_run


def _model(op, inputs, feeds, inits, outs, **attrs):
    """One com.microsoft node; `inputs` names its inputs in order ('' for an absent one)."""
    node = helper.make_node(op, inputs, list(outs), name=f"my_{op}", domain="com.microsoft", **attrs)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in outs.items()],
        [numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def _check(model, feeds, tmp_path, reference=None, reference_feeds=None):
    """webiree against onnxruntime on `reference` (an equivalent model), or on the model itself."""
    got, _, _ = compile_and_run(model, feeds, tmp_path)
    ref = ort_run(reference or model, reference_feeds or feeds)
    for g, r, o in zip(got, ref, model.graph.output, strict=True):
        assert_close(g, r, name=o.name)


def _refused(model, tmp_path, *words):
    with pytest.raises(UnsupportedOpError) as e:
        compile_and_run(model, {}, tmp_path)
    text = str(e.value)
    for w in words:
        assert w in text, text


def _f(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- Attention -----------------------------------------------------------------------

def _attention(B=2, S=5, hidden=16, N=2, mask=None, bias=True, past=None, present=False, attn_bias=None,
               sizes=None, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    cols = sum(sizes) if sizes else 3 * hidden
    feeds = {"x": _f(rng, B, S, hidden)}
    inits = {"w": _f(rng, hidden, cols) * 0.3}
    inputs = ["x", "w", "b" if bias else ""]
    if bias:
        inits["b"] = _f(rng, cols)
    for name, v in (("mask", mask), ("past", past), ("attn_bias", attn_bias)):
        if v is not None:
            feeds[name] = v
        inputs.append(name if v is not None else "")
    while inputs and not inputs[-1]:
        inputs.pop()
    dv = sizes[2] if sizes else hidden
    outs = {"y": [B, S, dv]}
    if present:
        P = past.shape[3] if past is not None else 0
        outs["present"] = [2, B, N, P + S, hidden // N]
    if sizes:
        attrs["qkv_hidden_sizes"] = sizes
    return _model("Attention", inputs, feeds, inits, outs, num_heads=N, **attrs), feeds


ATTENTION_CASES = {
    "plain": {},
    "heads4_headsize8": dict(hidden=32, N=4),
    "heads1": dict(hidden=12, N=1, S=3),
    "key_lengths": dict(mask=np.array([3, 5], np.int32)),
    "end_and_start": dict(mask=np.array([4, 5, 1, 0], np.int32)),
    "mask_2d": dict(mask=np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1]], np.int32)),
    "mask_3d": dict(mask=(np.arange(50).reshape(2, 5, 5) % 3 != 1).astype(np.int32)),
    "causal": dict(unidirectional=1),
    "causal_lengths": dict(unidirectional=1, mask=np.array([4, 2], np.int32)),
    "causal_mask_2d_filter": dict(unidirectional=1, mask_filter_value=-3.0,
                                  mask=np.array([[0, 1, 1, 0, 1], [1, 0, 1, 1, 1]], np.int32)),
    "scale": dict(scale=0.5),
    "attention_bias": dict(attn_bias=np.random.default_rng(7).standard_normal((1, 2, 5, 5)).astype(np.float32)),
    "v_hidden_size": dict(sizes=[16, 16, 8]),
    "present": dict(present=True, unidirectional=1),
    "past": dict(past=np.random.default_rng(8).standard_normal((2, 2, 2, 3, 8)).astype(np.float32), present=True,
                 unidirectional=1, S=2),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention(case, tmp_path):
    model, feeds = _attention(**ATTENTION_CASES[case])
    _check(model, feeds, tmp_path)


def test_attention_without_bias(tmp_path):
    """onnxruntime's CPU kernel crashes without a bias: its reference is the model with a zero bias."""
    model, feeds = _attention(bias=False)
    reference, _ = _attention()
    reference.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros(48, np.float32), "b"))
    _check(model, feeds, tmp_path, reference)


@pytest.mark.parametrize("attrs, words", [
    (dict(do_rotary=1), ["my_Attention", "do_rotary=1"]),
    (dict(past_present_share_buffer=1), ["my_Attention", "past_present_share_buffer=1"]),
])
def test_attention_refused_attributes(attrs, words, tmp_path):
    model, _ = _attention(**attrs)
    _refused(model, tmp_path, *words)


def test_attention_refuses_4d_mask(tmp_path):
    model, _ = _attention(mask=np.ones((2, 1, 5, 5), np.int32))
    _refused(model, tmp_path, "my_Attention", "mask_index of shape (2, 1, 5, 5)")


def test_attention_refuses_past_sequence_length(tmp_path):
    model, _ = _attention()
    node = model.graph.node[0]
    node.input.extend(["", "", "", "psl"])
    model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int32), "psl"))
    _refused(model, tmp_path, "my_Attention", "past_sequence_length")


# --- MultiHeadAttention ----------------------------------------------------------------

def _mha(B=2, S=4, L=6, hidden=16, v_hidden=None, N=2, form="separate", bias=True, kpm=None, attn_bias=None,
         past=0, outputs=("y",), seed=0, **attrs):
    rng = np.random.default_rng(seed)
    H = hidden // N
    dv = v_hidden or hidden
    feeds, inits = {}, {}
    if form == "packed_qkv":
        L = S
        feeds["q"] = _f(rng, B, S, N, 3, H)
        inputs = ["q", "", ""]
    elif form == "packed_kv":
        feeds["q"], feeds["k"] = _f(rng, B, S, hidden), _f(rng, B, L, N, 2, H)
        inputs = ["q", "k", ""]
    elif form == "per_head":     # K and V given as (batch, num_heads, kv_sequence, head_size)
        feeds["q"], feeds["k"], feeds["v"] = _f(rng, B, S, hidden), _f(rng, B, N, L, H), _f(rng, B, N, L, dv // N)
        inputs = ["q", "k", "v"]
    else:
        feeds["q"], feeds["k"], feeds["v"] = _f(rng, B, S, hidden), _f(rng, B, L, hidden), _f(rng, B, L, dv)
        inputs = ["q", "k", "v"]
    if bias:
        inits["b"] = _f(np.random.default_rng(seed + 100), 2 * hidden + dv)   # the same for every form
    inputs.append("b" if bias else "")
    for name, v in (("kpm", kpm), ("attn_bias", attn_bias)):
        if v is not None:
            feeds[name] = v
        inputs.append(name if v is not None else "")
    if past:
        feeds["past_k"], feeds["past_v"] = _f(rng, B, N, past, H), _f(rng, B, N, past, dv // N)
        inputs += ["past_k", "past_v"]
    while inputs and not inputs[-1]:
        inputs.pop()
    T = past + L
    shapes = {"y": [B, S, dv], "present_k": [B, N, T, H], "present_v": [B, N, T, dv // N], "qk": [B, N, S, T]}
    outs = {o: shapes[o] for o in outputs}
    names = ["y", "present_k", "present_v", "qk"]
    node_outs = {n: shapes[n] for n in names[:max(names.index(o) for o in outputs) + 1]}
    model = _model("MultiHeadAttention", inputs, feeds, inits, node_outs, num_heads=N, **attrs)
    for o in list(model.graph.output):
        if o.name not in outs:
            model.graph.output.remove(o)
            model.graph.node[0].output[names.index(o.name)] = ""
    return model, feeds


MHA_CASES = {
    "cross": {},
    "self_no_bias": dict(L=4, bias=False),
    "heads4": dict(hidden=32, N=4),
    "v_hidden_size": dict(v_hidden=8),
    "key_lengths": dict(kpm=np.array([2, 6], np.int32)),
    "key_mask_2d": dict(kpm=np.array([[1, 0, 1, 1, 0, 1], [0, 1, 1, 1, 1, 1]], np.int32)),
    "mask_3d": dict(kpm=(np.arange(48).reshape(2, 4, 6) % 4 != 2).astype(np.int32)),
    "attention_bias": dict(attn_bias=np.random.default_rng(5).standard_normal((2, 1, 4, 6)).astype(np.float32)),
    "bias_and_mask": dict(attn_bias=np.random.default_rng(6).standard_normal((1, 2, 4, 6)).astype(np.float32),
                          kpm=np.array([3, 5], np.int32), mask_filter_value=-50.0),
    "scale": dict(scale=0.25),
    "causal": dict(L=4, unidirectional=1),
    "present": dict(outputs=("y", "present_k", "present_v")),
    "past": dict(past=3, L=4, S=4, unidirectional=1, outputs=("y", "present_k", "present_v")),
    "qk": dict(outputs=("y", "qk"), kpm=np.array([2, 6], np.int32)),
    "per_head_kv": dict(form="per_head", bias=False),
    "per_head_kv_query_bias": dict(form="per_head", kpm=np.array([5, 6], np.int32)),   # the bias applies to Q only
}


@pytest.mark.parametrize("case", list(MHA_CASES))
def test_multi_head_attention(case, tmp_path):
    model, feeds = _mha(**MHA_CASES[case])
    _check(model, feeds, tmp_path)


@pytest.mark.parametrize("form", ["packed_qkv", "packed_kv"])
@pytest.mark.parametrize("bias", [False, True])
def test_mha_packed(form, bias, tmp_path):
    """onnxruntime's CPU kernel has no packed forms: its reference is the same heads given separately."""
    model, feeds = _mha(form=form, bias=bias)
    reference, sep = _mha(L=feeds["q"].shape[1] if form == "packed_qkv" else 6, bias=bias)
    B, S, N, H = 2, 4, 2, 8
    if form == "packed_qkv":
        q, k, v = (feeds["q"][:, :, :, j].reshape(B, S, N * H) for j in range(3))
    else:
        q = feeds["q"]
        k, v = (feeds["k"][:, :, :, j].reshape(B, 6, N * H) for j in range(2))
    _check(model, feeds, tmp_path, reference, {"q": q, "k": k, "v": v})


def test_mha_refuses_cache_indirection(tmp_path):
    model, _ = _mha(past=2)
    node = model.graph.node[0]
    node.input.extend(["", "ci"])
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((2, 1, 8), np.int32), "ci"))
    _refused(model, tmp_path, "my_MultiHeadAttention", "cache_indirection")


def test_mha_refuses_3b2_mask(tmp_path):
    model, _ = _mha(kpm=np.array([4, 6, 0, 0, 4, 6, 10, 12], np.int32))
    _refused(model, tmp_path, "my_MultiHeadAttention", "key_padding_mask of shape (8,)")


# --- RotaryEmbedding -------------------------------------------------------------------

def _rotary(shape=(2, 5, 16), N=2, R=0, interleaved=0, pos="per_token", M=12, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    B, S = (shape[0], shape[2]) if len(shape) == 4 else shape[:2]
    H = shape[3] if len(shape) == 4 else shape[2] // N
    half = (R or H) // 2
    feeds = {"x": _f(rng, *shape)}
    feeds["pos"] = (rng.integers(0, M, (B, S)) if pos == "per_token" else np.array([3])).astype(np.int64)
    angle = rng.uniform(0, 6.3, (M, half))
    inits = {"cos": np.cos(angle).astype(np.float32), "sin": np.sin(angle).astype(np.float32)}
    if R:
        attrs.update(rotary_embedding_dim=R, num_heads=N)
    return _model("RotaryEmbedding", ["x", "pos", "cos", "sin"], feeds, inits, {"y": list(shape)},
                  interleaved=interleaved, **attrs), feeds


ROTARY_CASES = {
    "halves": {},
    "interleaved": dict(interleaved=1),
    "offset_position": dict(pos="offset"),
    "heads4_headsize4": dict(shape=(1, 3, 16), N=4, M=4),
    "4d": dict(shape=(2, 3, 4, 8)),
    "4d_interleaved": dict(shape=(2, 3, 4, 8), interleaved=1),
    "partial_rotary": dict(R=8, N=2, shape=(2, 4, 32)),
    "partial_rotary_interleaved": dict(R=8, N=2, shape=(2, 4, 32), interleaved=1),
}


@pytest.mark.parametrize("case", list(ROTARY_CASES))
def test_rotary_embedding(case, tmp_path):
    model, feeds = _rotary(**ROTARY_CASES[case])
    _check(model, feeds, tmp_path)


def test_rotary_refuses_packed_batching(tmp_path):
    model, _ = _rotary(is_packed_batching=1)
    _refused(model, tmp_path, "my_RotaryEmbedding", "is_packed_batching=1")


# --- a model: a BERT-like encoder layer after onnxruntime's transformer optimizer -----

def _encoder_layer(B=2, S=6, hidden=16, N=2) -> onnx.ModelProto:
    """Self-attention (Q, K, V projections, additive 0/1 mask), output projection, residual and
    LayerNormalization, in the standard op set, in the pattern onnxruntime's optimizer fuses."""
    H = hidden // N
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)
    inits = {"Wq": w(hidden, hidden), "Wk": w(hidden, hidden), "Wv": w(hidden, hidden), "Wo": w(hidden, hidden),
             "bq": w(hidden), "bk": w(hidden), "bv": w(hidden), "bo": w(hidden), "gamma": 1 + w(hidden),
             "beta": w(hidden), "heads": np.array([B, S, N, H], np.int64), "rows": np.array([B, S, hidden], np.int64),
             "sqrt": np.array(np.sqrt(H), np.float32), "one": np.array(1.0, np.float32),
             "filter": np.array(-10000.0, np.float32), "ax1": np.array([1], np.int64), "ax2": np.array([2], np.int64)}
    mk = helper.make_node
    nodes = []
    for p, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [mk("MatMul", ["x", f"W{p}"], [f"{p}0"]), mk("Add", [f"{p}0", f"b{p}"], [f"{p}1"]),
                  mk("Reshape", [f"{p}1", "heads"], [f"{p}2"]), mk("Transpose", [f"{p}2"], [f"{p}3"], perm=perm)]
    nodes += [mk("Unsqueeze", ["mask", "ax1"], ["m1"]), mk("Unsqueeze", ["m1", "ax2"], ["m2"]),
              mk("Cast", ["m2"], ["m3"], to=onnx.TensorProto.FLOAT), mk("Sub", ["one", "m3"], ["m4"]),
              mk("Mul", ["m4", "filter"], ["m5"]),
              mk("MatMul", ["q3", "k3"], ["qk"]), mk("Div", ["qk", "sqrt"], ["qk1"]), mk("Add", ["qk1", "m5"], ["qk2"]),
              mk("Softmax", ["qk2"], ["p"], axis=-1), mk("MatMul", ["p", "v3"], ["c"]),
              mk("Transpose", ["c"], ["c1"], perm=[0, 2, 1, 3]), mk("Reshape", ["c1", "rows"], ["c2"]),
              mk("MatMul", ["c2", "Wo"], ["o"]), mk("Add", ["o", "bo"], ["o1"]), mk("Add", ["o1", "x"], ["r"]),
              mk("LayerNormalization", ["r", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    g = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [B, S, hidden]),
                                             helper.make_tensor_value_info("mask", onnx.TensorProto.INT64, [B, S])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [B, S, hidden])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_bert_layer_fused_by_onnxruntime(tmp_path):
    """The optimizer fuses the attention into com.microsoft.Attention (with a key-length mask_index);
    its other fusions (SkipLayerNormalization, Gelu, ...) belong to another op family and are off."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    path = tmp_path / "encoder.onnx"
    onnx.save(_encoder_layer(), path)
    options = FusionOptions("bert")
    for flag in ("enable_skip_layer_norm", "enable_bias_skip_layer_norm", "enable_gelu", "enable_bias_gelu",
                 "enable_embed_layer_norm", "enable_layer_norm"):
        setattr(options, flag, False)
    optimized = optimize_model(str(path), model_type="bert", num_heads=2, hidden_size=16, opt_level=0,
                               optimization_options=options)
    optimized.save_model_to_file(str(tmp_path / "fused.onnx"))   # as users get it (adds the com.microsoft import)
    fused = onnx.load(tmp_path / "fused.onnx")
    assert [n.op_type for n in fused.graph.node if n.domain == "com.microsoft"] == ["Attention"]
    rng = np.random.default_rng(1)
    feeds = {"x": _f(rng, 2, 6, 16), "mask": np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int64)}
    _check(fused, feeds, tmp_path)
