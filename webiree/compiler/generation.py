"""The generation head: next-token selection appended to a decoder at build time.

`add_generation_head(model, top_k)` returns a copy of an ONNX decoder (the names of
module/generation.py: input_ids, attention_mask, position_ids, past_key_values.* in; logits,
present.* out) with the head's inputs and outputs added, in plain opset ops, so that one
dispatch list per step runs the decoder and picks the next token on the GPU:

    last      = logits[:, -1:, :] / temperature                       [batch, 1, vocab]
    greedy    = ArgMax(last)                                          (first index on ties)
    rng_next  = rng * 1664525 + 1013904223  (uint32, wraps)           a 32-bit LCG
    u         = (rng_next >> 8) * 2^-24                               uniform in [0, 1)
    top       = TopK(last, K)       entries past k masked to -1e30    K: the build's top-k limit
    p, cdf    = Softmax(top), CumSum(p)
    sampled   = top's index at min(count(cdf <= u * cdf[-1]), k - 1)  inverse-CDF sampling
    token     = greedy where k == 1, else sampled                     [batch, 1]

and the next step's attention_mask (one more 1) and position_ids (the last one + 1), so that
the host feeds only the token id. top_k=0 builds the greedy part only (no TopK).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import ModelError
from ..module import generation as G

DEFAULT_TOP_K = 64


def _dims(vi) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


def add_generation_head(model: onnx.ModelProto, top_k: int = DEFAULT_TOP_K) -> onnx.ModelProto:
    """A copy of `model` with the generation head (see the module docstring); top_k: the largest
    k top-k sampling may use (capped at the vocabulary size; 0: greedy only)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name for t in g.initializer}
    inputs = {vi.name: vi for vi in g.input if vi.name not in inits}
    outputs = {vi.name: vi for vi in g.output}
    G.check_decoder(list(inputs), list(outputs))
    taken = set(inputs) | set(outputs) | inits | {o for n in g.node for o in n.output}
    clash = sorted(taken & set(G.HEAD_INPUTS + G.HEAD_OUTPUTS))
    if clash:
        raise ModelError(f"the model already has {clash}", hint="build the decoder without a generation head of its own")
    logits = _dims(outputs[G.LOGITS])
    if len(logits) != 3:
        raise ModelError(f"logits has rank {len(logits)}; generation takes logits [batch, sequence, vocab]")
    vocab = logits[2]
    if not isinstance(vocab, int) or vocab < 1:
        raise ModelError("the logits' vocabulary dim is not a fixed size", hint="export logits as [batch, sequence, vocab]")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ModelError(f"generation top_k must be an int >= 0, got {top_k!r}")
    top_k = min(top_k, vocab)
    ids_type = inputs[G.INPUT_IDS].type.tensor_type.elem_type
    if ids_type not in (TensorProto.INT64, TensorProto.INT32):
        raise ModelError("input_ids must be int64 or int32")

    nodes, consts = [], {}

    def const(name, value):
        n = f"generation/{name}"
        consts[n] = np.asarray(value)
        return n

    def node(op, ins, name, **attrs):
        out = f"generation/{name}"
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    big = np.iinfo(np.int64).max
    last = node("Slice", [G.LOGITS, const("minus1", [-1]), const("end", [big]), const("axis1", [1])], "last")
    scaled = node("Div", [last, G.TEMPERATURE], "scaled")
    greedy = node("ArgMax", [scaled], "greedy", axis=-1, keepdims=0)                     # [batch, 1] int64
    state = node("Add", [node("Mul", [G.RNG, const("lcg_a", np.array([G.LCG_A], np.uint32))], "lcg_mul"),
                         const("lcg_c", np.array([G.LCG_C], np.uint32))], "lcg")
    nodes.append(helper.make_node("Identity", [state], [G.RNG_NEXT], name="generation/rng_next"))
    if top_k:
        high = node("BitShift", [state, const("shift8", np.array([8], np.uint32))], "high", direction="RIGHT")
        u = node("Mul", [node("Cast", [high], "high_f", to=TensorProto.FLOAT),
                         const("inv24", np.array([2.0 ** -24], np.float32))], "uniform")
        k_f = node("Cast", [G.K], "k_f", to=TensorProto.FLOAT)
        vals = f"generation/top_values"
        idx = f"generation/top_indices"
        nodes.append(helper.make_node("TopK", [scaled, const("topk", [top_k])], [vals, idx], name="generation/topk",
                                      axis=-1))
        inside = node("Less", [const("ranks", np.arange(top_k, dtype=np.float32)), k_f], "inside")     # [K]
        masked = node("Where", [inside, vals, const("neg", np.array(-1e30, np.float32))], "masked")
        p = node("Softmax", [masked], "p", axis=-1)
        cdf = node("CumSum", [p, const("minus1_axis", np.array(-1, np.int64))], "cdf")
        total = node("Slice", [cdf, const("minus1b", [-1]), const("endb", [big]), const("axis2", [2])], "total")
        below = node("LessOrEqual", [cdf, node("Mul", [total, u], "threshold")], "below")
        count = node("ReduceSum", [node("Cast", [below], "below_f", to=TensorProto.FLOAT), const("axes2", [2])],
                     "count", keepdims=1)
        j = node("Cast", [node("Min", [count, node("Sub", [k_f, const("one_f", np.array(1, np.float32))], "k1")],
                               "j_f")], "j", to=TensorProto.INT64)
        sampled = node("Squeeze", [node("GatherElements", [idx, j], "pick", axis=2), const("axes2b", [2])],
                       "sampled")
        is_greedy = node("Less", [k_f, const("two_f", np.array(2, np.float32))], "is_greedy")
        token = node("Where", [is_greedy, greedy, sampled], "token")
    else:
        token = greedy
    if ids_type != TensorProto.INT64:
        token = node("Cast", [token], "token_cast", to=ids_type)
    nodes.append(helper.make_node("Identity", [token], [G.TOKEN], name="generation/token_out"))
    if G.ATTENTION_MASK in inputs:
        mask = G.ATTENTION_MASK
        col = node("Slice", [mask, const("minus1c", [-1]), const("endc", [big]), const("axis1c", [1])], "mask_last")
        one = node("Add", [node("Mul", [col, const("zero_m", np.array(0, _np(inputs[mask])))], "mask_zero"),
                           const("one_m", np.array(1, _np(inputs[mask])))], "mask_one")
        nodes.append(helper.make_node("Concat", [mask, one], [G.MASK_NEXT], name="generation/mask_next", axis=1))
    if G.POSITION_IDS in inputs:
        pos = G.POSITION_IDS
        col = node("Slice", [pos, const("minus1d", [-1]), const("endd", [big]), const("axis1d", [1])], "pos_last")
        nodes.append(helper.make_node("Add", [col, const("one_p", np.array(1, _np(inputs[pos])))],
                                      [G.POSITIONS_NEXT], name="generation/positions_next"))

    g.node.extend(nodes)
    g.initializer.extend(numpy_helper.from_array(v, n) for n, v in consts.items())
    vi = helper.make_tensor_value_info
    g.input.extend([vi(G.K, TensorProto.INT64, [1]), vi(G.TEMPERATURE, TensorProto.FLOAT, [1]),
                    vi(G.RNG, TensorProto.UINT32, [1])])
    batch = _dims(inputs[G.INPUT_IDS])[0]
    g.output.extend([vi(G.TOKEN, ids_type, [batch, 1]), vi(G.RNG_NEXT, TensorProto.UINT32, [1])])
    if G.ATTENTION_MASK in inputs:
        g.output.append(vi(G.MASK_NEXT, inputs[G.ATTENTION_MASK].type.tensor_type.elem_type, [batch, None]))
    if G.POSITION_IDS in inputs:
        g.output.append(vi(G.POSITIONS_NEXT, inputs[G.POSITION_IDS].type.tensor_type.elem_type, [batch, 1]))
    return m


def head_top_k(generation):
    """compile_model's `generation=` as a top-k limit: None/False -> None (no head), True -> the
    default, an int -> itself (0: greedy only)."""
    if generation is None or generation is False:
        return None
    if generation is True:
        return DEFAULT_TOP_K
    if isinstance(generation, int) and generation >= 0:
        return generation
    raise ModelError(f"generation= takes True, False or a top-k limit (an int >= 0), got {generation!r}")


def vocab_top_k(model: onnx.ModelProto) -> int:
    """The top-k limit the head of `model` (with the head) was built with."""
    for n in model.graph.node:
        if n.name == "generation/topk":
            k = next(t for t in model.graph.initializer if t.name == n.input[1])
            return int(numpy_helper.to_array(k)[0])
    return 0


def _np(vi):
    return helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
