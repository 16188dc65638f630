"""com.microsoft GroupQueryAttention (issue #22) against onnxruntime's CPU kernel (1.31), and a
decoder in onnxruntime-genai's layout (MatMulNBits 4-bit projections, SimplifiedLayerNormalization /
SkipSimplifiedLayerNormalization, GroupQueryAttention with rotary and a KV cache) built once as a
dynamic module and decoded natively for 32 steps and in headless Chromium for a few.

Tolerance: conftest's FP32_TOL on every output (max |webiree - onnxruntime| <= 1e-4 * max
|onnxruntime|; present_key / present_value included, their zero rows too). The decoder's logits are
held to the same bound at every step: webiree decodes onnxruntime's greedy tokens (teacher forced)
from its own present KV, fed back on the GPU (`keep`).

What GroupQueryAttention takes (contrib_attention.py has the semantics): sizes come from shapes
(past length = past_key's dim 2, symbolic in a dynamic build; present length = past + sequence;
total_sequence_length must equal it: checked at build, or by the module before any dispatch where
it is computed from shapes); seqlens_k is read per batch entry at run time (right padding inside a
batch is implemented). Refused at build: causal=0, qk_output, sliding_window_cache, a quantized KV
cache (k_quant_type / v_quant_type / kv_cache_bit_width, k_scale / v_scale), q_norm_weight /
k_norm_weight, the output_qk output, local_window_size 0 or below -1.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import webiree
from webiree.errors import FeedError, ShapeError, UnsupportedOpError

from .browser_util import write_blank_page
from .conftest import assert_close, compile_and_run, ort_run
from .test_browser import evaluate
from .test_contrib_quant import pack

MS = "com.microsoft"
F = TensorProto.FLOAT


def _f(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- one GroupQueryAttention node -------------------------------------------------------

def gqa(B=2, S=1, N=4, KVN=2, H=16, past=6, packed=False, rotary=False, interleaved=0, half=None, max_pos=64,
        seqlens=None, pos=None, bias=None, sink=False, seed=0, seq_dim=None, past_dim=None, **attrs):
    """(model, feeds): one GroupQueryAttention of onnxruntime's layout; past None (no past inputs) or
    its length; seq_dim / past_dim name the sequence / past dims in the model's inputs (the presents'
    length is then 'total'); pos / bias: arrays fed as position_ids / attention_bias; sink: a random
    head_sink."""
    rng = np.random.default_rng(seed)
    P = past or 0
    T = P + S
    vi = helper.make_tensor_value_info
    feeds, names, inputs, inits = {}, [], [], {}

    def feed(name, value, shape=None):
        feeds[name] = value
        inputs.append(vi(name, helper.np_dtype_to_tensor_dtype(value.dtype), shape or list(value.shape)))
        names.append(name)
    sd = seq_dim or S
    if packed:
        feed("query", _f(rng, B, S, (N + 2 * KVN) * H), [B, sd, (N + 2 * KVN) * H])
        names += ["", ""]
    else:
        feed("query", _f(rng, B, S, N * H), [B, sd, N * H])
        feed("key", _f(rng, B, S, KVN * H), [B, sd, KVN * H])
        feed("value", _f(rng, B, S, KVN * H), [B, sd, KVN * H])
    if past is None:
        names += ["", ""]
    else:
        feed("past_key", _f(rng, B, KVN, P, H), [B, KVN, past_dim or P, H])
        feed("past_value", _f(rng, B, KVN, P, H), [B, KVN, past_dim or P, H])
    feed("seqlens_k", np.full(B, T - 1, np.int32) if seqlens is None else np.array(seqlens, np.int32))
    feed("total_sequence_length", np.array(T, np.int32))
    if rotary:
        angle = rng.uniform(0, 6.3, (max_pos, half or H // 2))
        inits = {"cos_cache": np.cos(angle).astype(np.float32), "sin_cache": np.sin(angle).astype(np.float32)}
        names += ["cos_cache", "sin_cache"]
        attrs.update(do_rotary=1, rotary_interleaved=interleaved)
    dynamic = bool(seq_dim or past_dim)
    for index, name, value in ((9, "position_ids", pos), (10, "attention_bias", bias),
                               (11, "head_sink", _f(rng, N) if sink else None)):
        if value is not None:
            names += [""] * (index - len(names))
            feed(name, value, [B, sd] if dynamic and index == 9 else
                 [*value.shape[:2], sd, "total"] if dynamic and index == 10 else None)
    t = "total" if dynamic else T
    outs = [vi("output", F, [B, sd, N * H]), vi("present_key", F, [B, KVN, t, H]),
            vi("present_value", F, [B, KVN, t, H])]
    node = helper.make_node("GroupQueryAttention", names, [o.name for o in outs], name="my_GQA", domain=MS,
                            num_heads=N, kv_num_heads=KVN, **attrs)
    g = helper.make_graph([node], "gqa", inputs, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                              ir_version=8)
    return model, feeds


def copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy to build from: the importer writes the pinned input shapes into the ModelProto it is given."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def build(model, **kw):
    """Compile in memory (shaders validated, as compile_and_run does) and open a native session."""
    from webiree.bundler.site import resolve_target, shader_validator
    from webiree.compiler.driver import compile_model

    res = compile_model(copy(model), None, resolve_target("default"), validate=shader_validator, **kw)
    return res, webiree.InferenceSession.from_module(res.module, res.weights)


def check(model, feeds, tmp_path, **kw):
    got, res, sess = compile_and_run(model, feeds, tmp_path, **kw)
    ref = ort_run(model, feeds)
    assert len(got) == len(ref) == 3
    for g, r, o in zip(got, ref, model.graph.output, strict=True):
        assert_close(g, r, name=o.name)
    return res


CASES = {
    # heads: grouped (4 query heads on 2 KV heads), equal, one KV head for all
    "grouped_decode": {},
    "equal_heads_decode": dict(KVN=4),
    "one_kv_head_decode": dict(N=8, KVN=1, H=8),
    "grouped_prompt_no_past": dict(S=5, past=None),
    "equal_heads_prompt_no_past": dict(S=5, KVN=4, past=None),
    "subsequent_prompt": dict(B=1, S=3, past=4),             # a chunk after a past (batch 1, as onnxruntime)
    "decode_long_past": dict(B=1, past=40, H=32),
    # packed QKV
    "packed_decode": dict(packed=True),
    "packed_prompt": dict(packed=True, S=4, past=None),
    # rotary
    "rotary_decode": dict(rotary=True),
    "rotary_interleaved_decode": dict(rotary=True, interleaved=1),
    "rotary_prompt": dict(rotary=True, S=5, past=None),
    "rotary_interleaved_prompt": dict(rotary=True, interleaved=1, S=5, past=None),
    "rotary_subsequent_prompt": dict(B=1, rotary=True, S=3, past=7),
    "rotary_packed": dict(rotary=True, packed=True, B=1, S=2, past=3),
    "rotary_partial": dict(rotary=True, H=32, half=8, S=4, past=None),
    "rotary_position_ids_decode": dict(rotary=True, pos=np.array([[9], [2]], np.int64)),
    "rotary_position_ids_prompt": dict(rotary=True, S=3, past=None, pos=np.array([[4, 0, 0], [1, 1, 1]], np.int64)),
    # local window, softcap, scale, bias, sinks
    "local_window_prompt": dict(S=7, past=None, local_window_size=3),
    "local_window_decode": dict(past=9, local_window_size=4),
    "local_window_rotary_chunk": dict(B=1, S=4, past=5, local_window_size=2, rotary=True),
    "softcap_decode": dict(softcap=1.5, scale=0.7),
    "softcap_prompt": dict(S=5, past=None, softcap=2.0),
    "scale": dict(S=3, past=None, scale=0.1),
    "attention_bias_per_head": dict(B=1, S=2, past=3, bias=np.random.default_rng(1).standard_normal((1, 4, 2, 5))
                                    .astype(np.float32)),
    "attention_bias_per_batch": dict(bias=np.random.default_rng(2).standard_normal((2, 1, 1, 7)).astype(np.float32)),
    "head_sink": dict(sink=True),
    "head_sink_prompt": dict(sink=True, S=4, past=None, local_window_size=2),
    "smooth_softmax": dict(smooth_softmax=1, S=3, past=None),
    # right padding inside a batch: each entry's seqlens_k
    "ragged_decode": dict(B=3, past=6, seqlens=[6, 3, 0], rotary=True),
    "ragged_prompt": dict(B=2, S=5, past=None, seqlens=[4, 1], rotary=True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_group_query_attention(case, tmp_path):
    model, feeds = gqa(**CASES[case])
    check(model, feeds, tmp_path)


def test_empty_past_pinned_at_build(tmp_path):
    """A merged decoder's prompt: past inputs of length 0, a build with the past dim pinned to 0."""
    model, feeds = gqa(B=2, S=5, past=0, past_dim="past_sequence_length", rotary=True)
    check(model, feeds, tmp_path, dims={"past_sequence_length": 0})


def test_one_dynamic_build_every_past_length():
    """One build with symbolic past (0..64) and sequence (1..8) lengths: a prompt from an empty past,
    decode steps and chunks, each step fed the present KV of the one before (the session's own) and
    an attention bias [1, 1, sequence, total] (total: a third symbol, equal to past + sequence at run
    time), compared with onnxruntime on the same feeds; the presents have this step's length."""
    model, _ = gqa(B=1, seq_dim="sequence_length", past_dim="past_sequence_length", rotary=True, interleaved=0,
                   local_window_size=6, softcap=3.0, bias=np.zeros((1, 1, 1, 7), np.float32))
    res, sess = build(model, dims={"past_sequence_length": (0, 64), "sequence_length": (1, 8), "total": (1, 72)})
    assert sorted(s[0] for s in res.module.symbols) == ["past_sequence_length", "sequence_length", "total"]
    rng = np.random.default_rng(4)
    past = {"past_key": np.zeros((1, 2, 0, 16), np.float32), "past_value": np.zeros((1, 2, 0, 16), np.float32)}
    P = 0
    for S in (5, 1, 1, 3, 1, 8, 1):
        T = P + S
        feeds = {"query": _f(rng, 1, S, 64), "key": _f(rng, 1, S, 32), "value": _f(rng, 1, S, 32), **past,
                 "seqlens_k": np.array([T - 1], np.int32), "total_sequence_length": np.array(T, np.int32),
                 "attention_bias": _f(rng, 1, 1, S, T)}
        got = sess.run(None, feeds)
        for g, r, o in zip(got, ort_run(model, feeds), model.graph.output, strict=True):
            assert_close(g, r, name=f"{o.name} at past {P}, sequence {S}")
        assert got[1].shape == (1, 2, T, 16)
        past = {"past_key": got[1], "past_value": got[2]}
        P = T
    assert P == 20
    with pytest.raises(FeedError, match="cannot take these sizes"):   # a bias whose length is not past + sequence
        sess.run(None, {**feeds, **past, "attention_bias": _f(rng, 1, 1, 1, 20)})


@pytest.mark.parametrize("attrs, words", [
    (dict(causal=0), ["my_GQA", "causal=0"]),
    (dict(qk_output=1), ["my_GQA", "qk_output=1"]),
    (dict(sliding_window_cache=1, local_window_size=4), ["my_GQA", "sliding_window_cache=1"]),
    (dict(local_window_size=0), ["my_GQA", "local_window_size=0"]),
    (dict(local_window_size=-3), ["my_GQA", "local_window_size=-3"]),
    (dict(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8),
     ["my_GQA", "kv_cache_bit_width=8"]),
    (dict(k_quant_type="PER_CHANNEL"), ["my_GQA", "k_quant_type=PER_CHANNEL"]),
    (dict(smooth_softmax=2), ["my_GQA", "smooth_softmax=2"]),
])
def test_refused_attributes(attrs, words, tmp_path):
    model, feeds = gqa(**attrs)
    with pytest.raises(UnsupportedOpError) as e:
        compile_and_run(model, feeds, tmp_path)
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("index, name", [(12, "k_scale"), (13, "v_scale"), (14, "q_norm_weight"),
                                         (15, "k_norm_weight")])
def test_refused_inputs(index, name, tmp_path):
    model, feeds = gqa()
    node = model.graph.node[0]
    node.input.extend([""] * (index - len(node.input)) + [name])
    model.graph.initializer.append(numpy_helper.from_array(np.ones(1, np.float32), name))
    with pytest.raises(UnsupportedOpError) as e:
        compile_and_run(model, feeds, tmp_path)
    assert "my_GQA" in str(e.value) and f"input {index} ({name}" in str(e.value), str(e.value)


def test_refused_output_qk(tmp_path):
    model, feeds = gqa()
    model.graph.node[0].output.append("qk")
    model.graph.output.append(helper.make_tensor_value_info("qk", F, [2, 4, 1, 7]))
    with pytest.raises(UnsupportedOpError, match=r"my_GQA.*output 3 \(output_qk"):
        compile_and_run(model, feeds, tmp_path)


def test_total_sequence_length_must_match_the_shapes(tmp_path):
    """A constant total_sequence_length other than past + sequence length is a build error."""
    model, feeds = gqa()
    model.graph.input.remove(next(i for i in model.graph.input if i.name == "total_sequence_length"))
    model.graph.initializer.append(numpy_helper.from_array(np.array(9, np.int32), "total_sequence_length"))
    del feeds["total_sequence_length"]
    with pytest.raises(ShapeError, match=r"total_sequence_length is 9, but the past length \+ sequence length is "
                                         r"7 .*node 'my_GQA'"):
        compile_and_run(model, feeds, tmp_path)


# --- a decoder in onnxruntime-genai's layout ------------------------------------------

VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS, INTER, BLOCK, MAX_POS = 96, 64, 4, 2, 2, 128, 32, 128
HEAD = HIDDEN // HEADS
PROMPT = [3, 17, 42, 5, 60]
STEPS = 32
DIMS = {"batch_size": 1, "sequence_length": (1, 8), "past_sequence_length": (0, 40),
        "total_sequence_length": (1, 48)}
PAST = [f"past_key_values.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]
PRESENT = [f"present.{i}.{k}" for i in range(LAYERS) for k in ("key", "value")]


def genai_decoder(seed: int = 0) -> onnx.ModelProto:
    """A 2-layer decoder as onnxruntime-genai's model builder writes one for int4 CPU: the attention
    mask reformatted into seqlens_k (ReduceSum - 1) and total_sequence_length (Shape -> Gather);
    embedding Gather; per layer SimplifiedLayerNormalization (then SkipSimplifiedLayerNormalization
    carrying the residual), 4-bit MatMulNBits projections (block 32, packed zero points; layer 0 Q, K,
    V apart, layer 1 one packed QKV), GroupQueryAttention with rotary (cos/sin caches as
    initializers) and past/present KV, SiLU-gated MLP; a final norm and a MatMulNBits LM head."""
    rng = np.random.default_rng(seed)
    inits, nodes = {}, []

    def node(op, inputs, outputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))

    def nbits(name, x, K, N, out):
        kb = K // BLOCK
        inits[f"{name}.qweight"] = pack(rng.integers(0, 16, (N, K)), 4).reshape(N, kb, BLOCK // 2)
        inits[f"{name}.scales"] = (rng.random((N, kb)) * 0.02 + 0.02).astype(np.float32) * np.float32(8 / np.sqrt(K))
        inits[f"{name}.qzeros"] = pack(rng.integers(6, 10, (N, kb)), 4)
        node("MatMulNBits", [x, f"{name}.qweight", f"{name}.scales", f"{name}.qzeros"], [out], f"/{name}/MatMulNBits",
             domain=MS, K=K, N=N, bits=4, block_size=BLOCK, accuracy_level=0)

    def norm_weight(name):
        inits[name] = (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
        return name

    inits["model.embed_tokens.weight"] = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    angle = np.arange(MAX_POS)[:, None] / 10000.0 ** (np.arange(0, HEAD, 2) / HEAD)[None]
    inits["cos_cache"], inits["sin_cache"] = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    inits["one"], inits["axes_1"] = np.array(1, np.int64), np.array([1], np.int64)
    m = "/model/attn_mask_reformat/attn_mask_subgraph"
    node("ReduceSum", ["attention_mask", "axes_1"], ["mask_sum"], f"{m}/ReduceSum", keepdims=0)
    node("Sub", ["mask_sum", "one"], ["mask_sum_1"], f"{m}/Sub")
    node("Cast", ["mask_sum_1"], ["seqlens_k"], f"{m}/Sub/Cast", to=TensorProto.INT32)
    node("Shape", ["attention_mask"], ["mask_shape"], f"{m}/Shape")
    node("Gather", ["mask_shape", "one"], ["total_len"], f"{m}/Gather", axis=0)
    node("Cast", ["total_len"], ["total_seq_len"], f"{m}/Gather/Cast", to=TensorProto.INT32)
    node("Gather", ["model.embed_tokens.weight", "input_ids"], ["embeds"], "/model/embed_tokens/Gather")

    residual, hidden, kv = "embeds", None, KV_HEADS * HEAD
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        if i == 0:
            node("SimplifiedLayerNormalization", ["embeds", norm_weight(f"{p}.input_layernorm.weight")], [f"{p}.ln1"],
                 f"/{p}/input_layernorm/LayerNorm", axis=-1, epsilon=1e-5, stash_type=1)
        else:
            node("SkipSimplifiedLayerNormalization", [hidden, residual, norm_weight(f"{p}.input_layernorm.weight")],
                 [f"{p}.ln1", "", "", f"{p}.res1"], f"/{p}/input_layernorm/SkipLayerNorm", domain=MS, epsilon=1e-5)
            residual = f"{p}.res1"
        if i % 2 == 0:
            for proj, width in (("q", HIDDEN), ("k", kv), ("v", kv)):
                nbits(f"{p}.attn.{proj}_proj", f"{p}.ln1", HIDDEN, width, f"{p}.{proj}")
            qkv = [f"{p}.q", f"{p}.k", f"{p}.v"]
        else:
            nbits(f"{p}.attn.qkv_proj", f"{p}.ln1", HIDDEN, HIDDEN + 2 * kv, f"{p}.qkv")
            qkv = [f"{p}.qkv", "", ""]
        node("GroupQueryAttention", qkv + [PAST[2 * i], PAST[2 * i + 1], "seqlens_k", "total_seq_len", "cos_cache",
                                           "sin_cache"],
             [f"{p}.attn_out", PRESENT[2 * i], PRESENT[2 * i + 1]], f"/{p}/attn/GroupQueryAttention", domain=MS,
             num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1, rotary_interleaved=0, local_window_size=-1,
             scale=float(1.0 / np.sqrt(HEAD)), softcap=0.0)
        nbits(f"{p}.attn.o_proj", f"{p}.attn_out", HIDDEN, HIDDEN, f"{p}.o")
        node("SkipSimplifiedLayerNormalization", [f"{p}.o", residual,
                                                  norm_weight(f"{p}.post_attention_layernorm.weight")],
             [f"{p}.ln2", "", "", f"{p}.res2"], f"/{p}/post_attention_layernorm/SkipLayerNorm", domain=MS,
             epsilon=1e-5)
        residual = f"{p}.res2"
        nbits(f"{p}.mlp.gate_proj", f"{p}.ln2", HIDDEN, INTER, f"{p}.gate")
        nbits(f"{p}.mlp.up_proj", f"{p}.ln2", HIDDEN, INTER, f"{p}.up")
        node("Sigmoid", [f"{p}.gate"], [f"{p}.gate_sigmoid"], f"/{p}/mlp/act_fn/Sigmoid")
        node("Mul", [f"{p}.gate", f"{p}.gate_sigmoid"], [f"{p}.act"], f"/{p}/mlp/act_fn/Mul")
        node("Mul", [f"{p}.act", f"{p}.up"], [f"{p}.gated"], f"/{p}/mlp/Mul")
        nbits(f"{p}.mlp.down_proj", f"{p}.gated", INTER, HIDDEN, f"{p}.down")
        hidden = f"{p}.down"
    node("SkipSimplifiedLayerNormalization", [hidden, residual, norm_weight("model.norm.weight")], ["final_norm"],
         "/model/norm/SkipLayerNorm", domain=MS, epsilon=1e-5)
    nbits("lm_head", "final_norm", HIDDEN, VOCAB, "logits")

    vi = helper.make_tensor_value_info
    inputs = [vi("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              vi("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]
    inputs += [vi(n, F, ["batch_size", KV_HEADS, "past_sequence_length", HEAD]) for n in PAST]
    outputs = [vi("logits", F, ["batch_size", "sequence_length", VOCAB])]
    outputs += [vi(n, F, ["batch_size", KV_HEADS, "total_sequence_length", HEAD]) for n in PRESENT]
    g = helper.make_graph(nodes, "genai_decoder", inputs, outputs,
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                             ir_version=8)


def step_feeds(ids, total: int, past: dict) -> dict:
    return {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, total), np.int64), **past}


def empty_past() -> dict:
    return {n: np.zeros((1, KV_HEADS, 0, HEAD), np.float32) for n in PAST}


@pytest.fixture(scope="module")
def decoder():
    """(model, steps): onnxruntime's greedy decode from an empty past, the prompt then STEPS tokens;
    steps[i] = (token ids fed, total length, onnxruntime's logits, onnxruntime's presents)."""
    import onnxruntime as ort

    model = genai_decoder()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ids, past, total, steps = PROMPT, empty_past(), 0, []
    for _ in range(STEPS + 1):
        total += len(ids)
        logits, *presents = sess.run(None, step_feeds(ids, total, past))
        steps.append((ids, total, logits, presents))
        past = dict(zip(PAST, presents))
        ids = [int(logits[0, -1].argmax())]
    return model, steps


def test_genai_decoder_decodes_32_steps_from_one_build(decoder, capsys):
    """Built once (symbolic sequence, past and total lengths), decoded teacher-forced along
    onnxruntime's greedy path: the prompt, then 32 steps of one token, the present KV kept on the GPU
    and fed back; the logits within FP32_TOL of onnxruntime's at every step, the last presents too."""
    import time

    model, steps = decoder
    contrib = {n.op_type for n in model.graph.node if n.domain == MS}
    assert contrib == {"MatMulNBits", "GroupQueryAttention", "SkipSimplifiedLayerNormalization"}
    t0 = time.perf_counter()
    res, sess = build(model, dims=DIMS)
    build_s = time.perf_counter() - t0
    assert [s[0] for s in res.module.symbols] == ["sequence_length", "total_sequence_length",
                                                  "past_sequence_length"]
    past, errs = empty_past(), []
    t0 = time.perf_counter()
    for ids, total, want, _ in steps:
        logits, *presents = sess.run(None, step_feeds(ids, total, past), keep=PRESENT)
        assert logits.shape == (1, len(ids), VOCAB) and presents[0].shape == (1, KV_HEADS, total, HEAD)
        errs.append(assert_close(logits, want, name=f"logits at total length {total}"))
        for t in past.values():
            if isinstance(t, webiree.DeviceTensor):
                t.release()
        past = dict(zip(PAST, presents))
    decode_s = time.perf_counter() - t0
    for got, want in zip(past.values(), steps[-1][3], strict=True):
        assert_close(got.numpy(), want, name="last present")
    # a mask whose length is not past + sequence length: the module's size check, before any dispatch
    with pytest.raises(FeedError, match="cannot take these sizes"):
        sess.run(None, step_feeds([1], 3, empty_past()))
    with capsys.disabled():
        print(f"\n[gqa-decoder] {len(res.module.info['dispatches'])} dispatches, build {build_s:.1f} s, "
              f"{len(steps)} steps in {decode_s:.1f} s; max rel. error of the logits {max(errs):.1e}")


# --- the same decoder in headless Chromium --------------------------------------------

BROWSER_STEPS = 4       # the prompt + 3 decode steps

DECODE_JS = """async ({url, steps, past, present, kvShape}) => {
  const w = await import(url + 'webiree.js');
  const session = await w.InferenceSession.create(url);
  const out = [];
  const cache = {};
  for (const name of past) cache[name] = new w.Tensor('float32', new Float32Array(0), [1, kvShape[0], 0, kvShape[1]]);
  try {
    for (const {ids, total} of steps) {
      const feeds = {input_ids: new w.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, ids.length]),
                     attention_mask: new w.Tensor('int64', new BigInt64Array(total).fill(1n), [1, total]), ...cache};
      const r = await session.run(feeds, {keep: present});
      out.push({dims: r.logits.dims, logits: Array.from(r.logits.data), location: r[present[0]].location,
                presentDims: r[present[0]].dims});
      past.forEach((name, i) => { cache[name].dispose(); cache[name] = r[present[i]]; });
    }
  } catch (e) {
    out.push({error: String(e.message)});
  } finally {
    await session.release();
  }
  return out;
}"""


@pytest.fixture(scope="module")
def site_root(tmp_path_factory, decoder):
    root = tmp_path_factory.mktemp("gqa_site")
    write_blank_page(root)
    webiree.compile(copy(decoder[0]), root / "decoder", dims=DIMS)
    return root


@pytest.mark.browser
def test_genai_decoder_in_chromium(page, server, decoder):
    """webiree.js runs the dynamic build: the prompt from an empty past, then 3 decode steps, the
    present KV kept on the GPU and fed back; logits compared with onnxruntime's."""
    _, steps = decoder
    runs = [{"ids": list(ids), "total": total} for ids, total, _, _ in steps[:BROWSER_STEPS]]
    got = evaluate(page, DECODE_JS, {"url": f"{server}decoder/", "steps": runs, "past": PAST, "present": PRESENT,
                                     "kvShape": [KV_HEADS, HEAD]}, timeout_s=300)
    assert len(got) == BROWSER_STEPS and "error" not in got[-1], got[-1]
    for r, (ids, total, want, _) in zip(got, steps[:BROWSER_STEPS], strict=True):
        assert r["dims"] == [1, len(ids), VOCAB] and r["presentDims"] == [1, KV_HEADS, total, HEAD]
        assert r["location"] == "gpu-buffer"
        assert_close(np.array(r["logits"], np.float32).reshape(want.shape), want, name=f"logits at total {total}")
    assert not page.errors
