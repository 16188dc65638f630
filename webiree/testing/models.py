"""Small models made in code with onnx.helper and seeded weights.

Used by the demo (`webiree demo`), the tests and the benchmarks; nothing is
downloaded and no model file is committed.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10   # what onnxruntime 1.31 reads


def make_model(nodes, inputs, outputs, inits, name="model", opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, inputs, outputs,
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION,
                          producer_name="webiree.testing")
    if any(not o.type.tensor_type.HasField("shape") for o in m.graph.output):
        # outputs declared without a shape get the one ONNX shape inference finds
        inferred = onnx.shape_inference.infer_shapes(m)
        known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
        for o in m.graph.output:
            if not o.type.tensor_type.HasField("shape") and o.name in known:
                o.type.CopyFrom(known[o.name].type)
    onnx.checker.check_model(m)
    return m


def _w(rng, *shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return (rng.standard_normal(shape) * (scale or 1.0 / np.sqrt(fan_in))).astype(np.float32)


def mlp(seed: int = 0, batch: int = 4, sizes=(64, 128, 10)) -> onnx.ModelProto:
    """Gemm + Relu, MatMul + Add + Sigmoid... + Softmax."""
    rng = np.random.default_rng(seed)
    d_in, d_h, d_out = sizes
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"], name="fc1", transB=1),
        helper.make_node("Relu", ["h1"], ["a1"], name="relu1"),
        helper.make_node("MatMul", ["a1", "w2"], ["h2"], name="fc2"),
        helper.make_node("Add", ["h2", "b2"], ["h2b"], name="fc2_bias"),
        helper.make_node("Tanh", ["h2b"], ["a2"], name="tanh2"),
        helper.make_node("Gemm", ["a2", "w3", "b3"], ["logits"], name="fc3", alpha=0.5, beta=2.0),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    inits = {"w1": _w(rng, d_h, d_in), "b1": _w(rng, d_h, scale=0.1), "w2": _w(rng, d_h, d_h),
             "b2": _w(rng, d_h, scale=0.1), "w3": _w(rng, d_h, d_out), "b3": _w(rng, d_out, scale=0.1)}
    return make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, d_in])],
                      [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, d_out]),
                       helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, d_out])],
                      inits, name="mlp")


def small_cnn(seed: int = 0, size: int | None = 32, classes: int = 10) -> onnx.ModelProto:
    """conv+bias+relu, depthwise stride-2 conv + Clip (ReLU6), 1x1 conv + Sigmoid, residual Add,
    MaxPool, AveragePool, GlobalAveragePool, Flatten, Gemm, Softmax. size None: the image's height
    and width are the symbolic dims `height` and `width`."""
    rng = np.random.default_rng(seed)
    c1, c2 = 16, 32
    nodes = [
        helper.make_node("Conv", ["image", "w_stem", "b_stem"], ["s1"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["s1"], ["s1r"], name="stem_relu"),
        helper.make_node("Conv", ["s1r", "w_dw", "b_dw"], ["d1"], name="dw", group=c1, strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d1", "zero", "six"], ["d1c"], name="relu6"),
        helper.make_node("Conv", ["d1c", "w_pw", "b_pw"], ["p1"], name="pw"),
        helper.make_node("Sigmoid", ["p1"], ["p1s"], name="gate"),
        helper.make_node("Mul", ["p1", "p1s"], ["p1g"], name="swish"),
        helper.make_node("Conv", ["p1g", "w_c3", "b_c3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c3", "p1g"], ["res"], name="residual"),
        helper.make_node("MaxPool", ["res"], ["mp"], name="maxpool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["mp"], ["ap"], name="avgpool", kernel_shape=[3, 3], strides=[1, 1],
                         pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["ap"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "w_fc", "b_fc"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax"),
    ]
    inits = {
        "w_stem": _w(rng, c1, 3, 3, 3), "b_stem": _w(rng, c1, scale=0.1),
        "w_dw": _w(rng, c1, 1, 3, 3), "b_dw": _w(rng, c1, scale=0.1),
        "zero": np.array(0.0, np.float32), "six": np.array(6.0, np.float32),
        "w_pw": _w(rng, c2, c1, 1, 1), "b_pw": _w(rng, c2, scale=0.1),
        "w_c3": _w(rng, c2, c2, 3, 3), "b_c3": _w(rng, c2, scale=0.1),
        "w_fc": _w(rng, classes, c2), "b_fc": _w(rng, classes, scale=0.1),
    }
    hw = ["height", "width"] if size is None else [size, size]
    return make_model(nodes, [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, *hw])],
                      [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, classes])], inits,
                      name="small_cnn")


def small_detector(seed: int = 0, classes: int = 4) -> onnx.ModelProto:
    """A detector-style model over an image of symbolic `height` x `width`: a stride-2 backbone to
    1/8, a 2x nearest upsample (Resize) concatenated with the 1/4 features, and two heads (box
    regression + class scores, an FPN in miniature); the 1/8 head is flattened to [1, cells, 4 +
    classes] through Shape -> Gather -> Mul -> Concat -> Reshape, as exporters write it."""
    rng = np.random.default_rng(seed)
    c1, c2, c3, out = 8, 16, 32, 4 + classes
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["f2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["f2"], ["f2r"]),
        helper.make_node("Conv", ["f2r", "w2", "b2"], ["f4"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["f4"], ["f4r"]),
        helper.make_node("Conv", ["f4r", "w3", "b3"], ["f8"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["f8"], ["f8r"]),
        helper.make_node("Resize", ["f8r", "", "scales"], ["up"], mode="nearest"),
        helper.make_node("Concat", ["up", "f4r"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "wh4", "bh4"], ["head4"]),
        helper.make_node("Sigmoid", ["head4"], ["scores4"]),
        helper.make_node("Conv", ["f8r", "wh8", "bh8"], ["head8"]),
        helper.make_node("Shape", ["head8"], ["hs"]),
        helper.make_node("Gather", ["hs", "i2"], ["h8"], axis=0),
        helper.make_node("Gather", ["hs", "i3"], ["w8"], axis=0),
        helper.make_node("Mul", ["h8", "w8"], ["cells"]),
        helper.make_node("Unsqueeze", ["cells", "ax0"], ["cells1"]),
        helper.make_node("Concat", ["one", "nout", "cells1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["head8", "flat_shape"], ["flat8"]),
        helper.make_node("Transpose", ["flat8"], ["boxes8"], perm=[0, 2, 1]),
    ]
    inits = {
        "w1": _w(rng, c1, 3, 3, 3), "b1": _w(rng, c1, scale=0.1),
        "w2": _w(rng, c2, c1, 3, 3), "b2": _w(rng, c2, scale=0.1),
        "w3": _w(rng, c3, c2, 3, 3), "b3": _w(rng, c3, scale=0.1),
        "scales": np.array([1, 1, 2, 2], np.float32),
        "wh4": _w(rng, out, c3 + c2, 1, 1), "bh4": _w(rng, out, scale=0.1),
        "wh8": _w(rng, out, c3, 1, 1), "bh8": _w(rng, out, scale=0.1),
        "i2": np.array(2, np.int64), "i3": np.array(3, np.int64), "ax0": np.array([0], np.int64),
        "one": np.array([1], np.int64), "nout": np.array([out], np.int64),
    }
    f = TensorProto.FLOAT
    return make_model(nodes, [helper.make_tensor_value_info("image", f, [1, 3, "height", "width"])],
                      [helper.make_tensor_value_info("scores4", f, [1, out, "h4", "w4"]),
                       helper.make_tensor_value_info("boxes8", f, [1, "cells", out])], inits, name="small_detector")


def sample_inputs(model: onnx.ModelProto, seed: int = 0) -> dict:
    """Seeded inputs for every graph input (floats ~ N(0,1), ints in [0, 10), bools random)."""
    rng = np.random.default_rng(seed)
    init = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value for d in tt.shape.dim]
        dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dt.kind == "f":
            feeds[vi.name] = rng.standard_normal(shape).astype(dt)
        elif dt == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[vi.name] = rng.integers(0, 10, shape).astype(dt)
    return feeds


def sdpa_block(batch=1, heads=12, m=128, s=128, d=32, dv=32, mask=True, guard=True, scores_out=False,
               dims=None, head_mask=None) -> onnx.ModelProto:
    """Scaled dot-product attention as PyTorch's exporter writes it: softmax(Q @ Kᵀ * d^-1/2 + mask)
    (then `Where(IsNaN(p), 0, p)` where `guard`) @ V, for inputs q [batch, heads, m, d], k [batch,
    heads, s, d], v [batch, heads, s, dv] and mask [batch, 1, m, s] (additive, where `mask`).
    `scores_out`: the scores are a graph output too. `dims`: names for (m, s), symbolic sizes.
    `head_mask`: a factor per head [heads] multiplying the probabilities (Hugging Face's BERT)."""
    F = TensorProto.FLOAT
    mm, ss = dims if dims else (m, s)
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scores"])]
    last = "scores"
    ins = [helper.make_tensor_value_info("q", F, [batch, heads, mm, d]),
           helper.make_tensor_value_info("k", F, [batch, heads, ss, d]),
           helper.make_tensor_value_info("v", F, [batch, heads, ss, dv])]
    if mask:
        nodes.append(helper.make_node("Add", [last, "mask"], ["masked"]))
        last = "masked"
        ins.append(helper.make_tensor_value_info("mask", F, [batch, 1, mm, ss]))
    nodes.append(helper.make_node("Softmax", [last], ["p"], axis=-1))
    last = "p"
    if guard:
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["pg"])]
        last = "pg"
    if head_mask is not None:
        nodes.append(helper.make_node("Mul", [last, "head_mask"], ["ph"]))
        last = "ph"
    nodes.append(helper.make_node("MatMul", [last, "v"], ["y"]))
    outs = [helper.make_tensor_value_info("y", F, [batch, heads, mm, dv])]
    if scores_out:
        outs.append(helper.make_tensor_value_info("scores", F, [batch, heads, mm, ss]))
    inits = {"scale": np.array(d ** -0.5, np.float32), "zero": np.array(0.0, np.float32)}
    if head_mask is not None:
        inits["head_mask"] = np.asarray(head_mask, np.float32).reshape(heads, 1, 1)
    return make_model(nodes, ins, outs, inits, name="sdpa")


def tiny_attention(seed: int = 0, seq: int = 8, vocab: int = 32, d: int = 16, heads: int = 2) -> onnx.ModelProto:
    """An attention block over int64 token ids: Gather (embedding), LayerNorm, Q/K/V MatMuls,
    head split (Reshape + Transpose), scaled scores, a padding mask from Equal + Where,
    Softmax, context MatMul, output projection and a residual Add. The head-split target shape
    is computed from Shape + Gather + Concat (folded at compile time)."""
    rng = np.random.default_rng(seed)
    dh = d // heads
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
        helper.make_node("Add", ["emb", "pos"], ["x"], name="add_pos"),
        helper.make_node("LayerNormalization", ["x", "ln_g", "ln_b"], ["xn"], name="ln", axis=-1),
        helper.make_node("MatMul", ["xn", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["xn", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["xn", "wv"], ["v"], name="v_proj"),
        helper.make_node("Shape", ["ids"], ["ids_shape"], name="ids_shape"),
        helper.make_node("Concat", ["ids_shape", "head_dims"], ["split_shape"], name="split_shape", axis=0),
        helper.make_node("Reshape", ["q", "split_shape"], ["q4"], name="q_split"),
        helper.make_node("Reshape", ["k", "split_shape"], ["k4"], name="k_split"),
        helper.make_node("Reshape", ["v", "split_shape"], ["v4"], name="v_split"),
        helper.make_node("Transpose", ["q4"], ["qh"], name="q_heads", perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k4"], ["kt"], name="k_heads", perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v4"], ["vh"], name="v_heads", perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qh", "kt"], ["s"], name="scores"),
        helper.make_node("Mul", ["s", "scale"], ["ss"], name="scale"),
        helper.make_node("Equal", ["ids", "pad_id"], ["is_pad"], name="is_pad"),
        helper.make_node("Unsqueeze", ["is_pad", "mask_axes"], ["mask"], name="mask"),
        helper.make_node("Where", ["mask", "neg", "ss"], ["sm"], name="apply_mask"),
        helper.make_node("Softmax", ["sm"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "vh"], ["ctx"], name="context"),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], name="merge_heads", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merged"], ["ctx2"], name="merge"),
        helper.make_node("MatMul", ["ctx2", "wo"], ["o"], name="o_proj"),
        helper.make_node("Add", ["o", "x"], ["y"], name="residual"),
    ]
    inits = {
        "table": _w(rng, vocab, d, scale=1.0), "pos": _w(rng, seq, d, scale=0.1),
        "ln_g": np.ones(d, np.float32), "ln_b": np.zeros(d, np.float32),
        "wq": _w(rng, d, d), "wk": _w(rng, d, d), "wv": _w(rng, d, d), "wo": _w(rng, d, d),
        "head_dims": np.array([heads, dh], np.int64), "scale": np.array(1.0 / np.sqrt(dh), np.float32),
        "pad_id": np.array(0, np.int64), "mask_axes": np.array([1, 2], np.int64),
        "neg": np.array(-1e9, np.float32), "merged": np.array([1, seq, d], np.int64),
    }
    return make_model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d])], inits,
                      name="tiny_attention")


def export_bert_dynamic(path, seed: int = 0, hidden: int = 64, layers: int = 2, heads: int = 4,
                        max_positions: int = 512, attn: str = "sdpa", vocab_size: int = 100) -> list[str]:
    """A BERT encoder from `transformers` (seeded random weights from a config, no hub access)
    exported to ONNX with symbolic `batch` and `sequence` axes on every input (TorchScript
    exporter, opset 17), as a user exports one. Needs torch and transformers (the models extra).
    Returns the input names (input_ids, attention_mask, token_type_ids)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=2 * hidden, max_position_embeddings=max_positions, type_vocab_size=2,
                     attn_implementation=attn)
    model = BertModel(cfg).eval()
    with torch.no_grad():       # non-trivial norms and biases (transformers initialises them to 1 / 0)
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in sorted(model.named_parameters()):
            if name.endswith("bias") or "LayerNorm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = tuple(torch.ones((2, 16), dtype=torch.int64) for _ in names)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(tuple_outputs(model, names, ["last_hidden_state", "pooler_output"]), example, str(path),
                          input_names=names, output_names=["last_hidden_state", "pooler_output"], opset_version=17,
                          dynamo=False, dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names})
    return names


GPT2_DIMS = {"batch": 1, "sequence": (1, 128), "past_sequence": (0, 127), "total_sequence": (1, 128)}


def gpt2_lm(seed: int = 0, layers: int = 2, n_embd: int = 64, heads: int = 4, vocab: int = 128, positions: int = 128,
            std: float = 0.3):
    """The `transformers` GPT2LMHeadModel (eval mode, tied embeddings) that export_gpt2_with_past
    exports, with its seeded weights: the same arguments give the same weights, so a benchmark can
    run the exported file and the torch model side by side. Needs torch and transformers."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=vocab, n_embd=n_embd, n_layer=layers, n_head=heads, n_positions=positions,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if ".ln" in name or name.startswith("transformer.ln"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))
    return model.eval()


def export_gpt2_with_past(path, seed: int = 0, layers: int = 2, n_embd: int = 64, heads: int = 4, vocab: int = 128,
                          positions: int = 128, std: float = 0.3) -> list[str]:
    """A GPT-2 decoder from `transformers` (GPT2LMHeadModel, seeded random weights from a small
    config, tied embeddings; gpt2_lm builds it) exported with its KV cache as decoders for
    onnxruntime are (TorchScript exporter, opset 17): inputs input_ids [batch, sequence],
    attention_mask [batch, total_sequence], position_ids [batch, sequence] and
    past_key_values.{i}.key / .value [batch, heads, past_sequence, head_dim]; outputs logits
    [batch, sequence, vocab] and present.{i}.key / .value [batch, heads, total_sequence, head_dim].
    The first step runs with a past of length 0. transformers passes the cache as a DynamicCache
    object: a wrapper builds one from the flat past tensors and returns its layers' keys and values.
    Weights are N(0, std) (0.3, not GPT-2's 0.02, so that greedy decoding does not repeat one token
    and the top two logits stay well apart), LayerNorms and biases perturbed. Needs torch and
    transformers. Returns the input names; GPT2_DIMS are ranges that build it for generation up to
    `positions` tokens (benchmarks/generation.py exports it at GPT-2-small size)."""
    import warnings

    import torch
    from transformers.cache_utils import DynamicCache

    model = gpt2_lm(seed, layers, n_embd, heads, vocab, positions, std)
    cfg = model.config

    class WithPast(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(layers)], config=cfg)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True)
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits, *present)

    wrapped = WithPast(model).eval()    # eval before export: the exporter restores the mode it found
    past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    names = ["input_ids", "attention_mask", "position_ids"] + past_names
    outputs = ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    b, s, p = 1, 3, 5       # traced with a past of 5; every axis that varies is dynamic
    example = (torch.randint(0, vocab, (b, s)), torch.ones(b, p + s, dtype=torch.int64),
               torch.arange(p, p + s).unsqueeze(0), *[torch.randn(b, heads, p, n_embd // heads) for _ in past_names])
    dynamic = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total_sequence"},
               "position_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"},
               **{n: {0: "batch", 2: "past_sequence"} for n in past_names},
               **{n: {0: "batch", 2: "total_sequence"} for n in outputs[1:]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapped, example, str(path), input_names=names, output_names=outputs, opset_version=17,
                          dynamo=False, dynamic_axes=dynamic)
    return names


def tuple_outputs(model, input_names: list, output_names: list):
    """A torch module calling a `transformers` model with keyword inputs (in `input_names` order)
    and returning its named outputs as a tuple, as torch.onnx.export wants it."""
    import torch

    class TupleOut(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, *args):
            out = self.m(**dict(zip(input_names, args, strict=True)))
            return tuple(out[k] for k in output_names)
    return TupleOut(model)


def bert_feeds(batch: int, seq: int, seed: int = 0) -> dict:
    """Token ids, an attention mask with the last third of the second sequence padded, and
    token types (second half 1) for export_bert_dynamic's model."""
    rng = np.random.default_rng(seed + seq)
    ids = rng.integers(0, 100, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    if batch > 1 and seq > 2:
        mask[1, seq - seq // 3:] = 0
    types = np.zeros((batch, seq), np.int64)
    types[:, seq // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def export_tiny_mobilenet_v2(path, seed: int = 0, size: int = 32, classes: int = 10, width: int = 8) -> list[str]:
    """A MobileNetV2 in miniature from torch (seeded weights; torchvision not needed): a stride-2
    3x3 stem, inverted residual blocks (1x1 expand, 3x3 depthwise, linear 1x1 project, a residual
    Add where stride is 1 and the widths agree), BatchNorm after every conv, ReLU6, a 1x1 head
    conv, global average pool and a Linear classifier. Exported like torchvision's
    mobilenet_v2 is (TorchScript exporter, opset 17, eval mode): BatchNorm folds into the convs,
    ReLU6 is Clip(0, 6), the pool is GlobalAveragePool and the classifier Gemm. The input is
    `image` [1, 3, size, size], the output `logits` [1, classes]. Needs torch (the models extra).
    Returns the input names."""
    import warnings

    import torch
    from torch import nn

    def conv_bn(cin, cout, k, stride=1, groups=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return layers + ([nn.ReLU6()] if act else [])

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hid = cin * expand
            self.residual = stride == 1 and cin == cout
            self.body = nn.Sequential(*(conv_bn(cin, hid, 1) if expand != 1 else []),
                                      *conv_bn(hid, hid, 3, stride, groups=hid), *conv_bn(hid, cout, 1, act=False))

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    class TinyMobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            w = width
            # (expand, out, repeats, first stride), MobileNetV2's table cut down
            cfg = [(1, w, 1, 1), (6, 2 * w, 2, 2), (6, 3 * w, 2, 2), (6, 4 * w, 1, 1)]
            layers, cin = conv_bn(3, w, 3, 2), w
            for t, c, n, s in cfg:
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers += conv_bn(cin, 8 * w, 1)
            self.features = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Linear(8 * w, classes)

        def forward(self, image):
            return self.classifier(torch.flatten(self.pool(self.features(image)), 1))

    torch.manual_seed(seed)
    model = TinyMobileNetV2()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():   # trained-looking BatchNorm statistics, so the folded convs are not plain He init
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.weight.copy_(1.0 + 0.2 * torch.randn(n, generator=g))
                m.bias.copy_(0.1 * torch.randn(n, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(n, generator=g))
                m.running_var.copy_(0.5 + torch.rand(n, generator=g))
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(1, 3, size, size),), str(path), input_names=["image"],
                          output_names=["logits"], opset_version=17, dynamo=False)
    return ["image"]


def float16_model(model, keep_io_types: bool) -> onnx.ModelProto:
    """`model` (a ModelProto or path) through onnxruntime's float16 converter
    (onnxruntime.transformers.float16.convert_float_to_float16) with its defaults, as users ship
    an fp16 model; keep_io_types=True keeps float32 graph inputs/outputs (Casts at the boundary)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    m = onnx.load(str(model)) if not isinstance(model, onnx.ModelProto) else model
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert_float_to_float16(m, keep_io_types=keep_io_types)


def quantize_dynamic_model(src, dst, weight_type: str = "QInt8") -> onnx.ModelProto:
    """onnxruntime.quantization.quantize_dynamic of the f32 model at `src` into `dst` (weight_type
    'QInt8' or 'QUInt8'): MatMul weights become 8-bit initializers with DequantizeLinear, activations
    DynamicQuantizeLinear, and the products MatMulInteger. Returns the written model."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=getattr(QuantType, weight_type))
    return onnx.load(str(dst))


def exact_integer_reference(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model for onnxruntime to compute exactly: each MatMulInteger / QLinearMatMul of a
    uint8 A with a constant int8 B takes B + 128 as uint8 and its zero point + 128 (the same values
    B - zero point). On x86 CPUs without VNNI (AVX2), onnxruntime's u8 x s8 kernels add pairs of
    products in saturating 16 bits (vpmaddubsw; why quantize_dynamic has reduce_range), so its
    result is not the operator's exact one there, while its u8 x u8 kernels are exact. Returns
    `model` itself where there is no such product."""
    inits = {i.name: i for i in model.graph.initializer}
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    types.update({v.name: v.type.tensor_type.elem_type for v in model.graph.input})
    types.update({n: i.data_type for n, i in inits.items()})
    for node in model.graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            types[node.output[0]] = TensorProto.UINT8
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    changed = False
    for k, node in enumerate(m.graph.node):
        a, b, zp_at = {"MatMulInteger": (0, 1, 3), "QLinearMatMul": (0, 3, 5)}.get(node.op_type, (None,) * 3)
        if a is None or types.get(node.input[a]) != TensorProto.UINT8 or node.input[b] not in inits \
                or inits[node.input[b]].data_type != TensorProto.INT8:
            continue
        w = numpy_helper.to_array(inits[node.input[b]]).astype(np.int16)
        zp_name = node.input[zp_at] if len(node.input) > zp_at else ""
        if zp_name and zp_name not in inits:
            continue                              # a run-time zero point: leave the node as it is
        zp = numpy_helper.to_array(inits[zp_name]).astype(np.int16) if zp_name else np.array(0, np.int16)
        names = (f"{node.name or k}/b_as_u8", f"{node.name or k}/b_zero_point_as_u8")
        m.graph.initializer.extend([numpy_helper.from_array((w + 128).astype(np.uint8), names[0]),
                                    numpy_helper.from_array((zp + 128).astype(np.uint8), names[1])])
        inputs = list(node.input) + [""] * (zp_at + 1 - len(node.input))
        inputs[b], inputs[zp_at] = names
        del node.input[:]
        node.input.extend(inputs)
        changed = True
    return m if changed else model


def quantize_nbits_model(model, block_size: int = 32, symmetric: bool = True, op_types=None) -> onnx.ModelProto:
    """`model` (a ModelProto or path) through onnxruntime's MatMulNBitsQuantizer (4 bits, blocks of
    `block_size`; op_types e.g. ("MatMul", "Gather"), default the quantizer's own), as q4 models ship."""
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    m = onnx.load(str(model)) if not isinstance(model, onnx.ModelProto) else model
    kw = {"op_types_to_quantize": tuple(op_types)} if op_types else {}
    logging.disable(logging.WARNING)       # (it logs every node it quantizes)
    try:
        q = MatMulNBitsQuantizer(m, block_size=block_size, is_symmetric=symmetric, **kw)
        q.process()
    finally:
        logging.disable(logging.NOTSET)
    return q.model.model


def quantize_static_qdq(src, dst, feeds: list[dict], per_channel: bool = True, **options) -> onnx.ModelProto:
    """onnxruntime.quantization.quantize_static of the f32 model at `src` into `dst` in QDQ format
    (int8 activations and weights, MinMax calibration over `feeds`, a list of input dicts; further
    quantize_static options, e.g. op_types_to_quantize, as given). Returns the written model."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel, **options)
    return onnx.load(str(dst))
