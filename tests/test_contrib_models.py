"""Whole models through onnxruntime's transformer optimizer (issue #22): a small BERT encoder
and a small GPT-2 decoder from `transformers` (seeded random weights from a config, no hub
access), exported to ONNX (opset 17), rewritten by
`onnxruntime.transformers.optimizer.optimize_model` at opt_level 0, 1 and 2 (which fuses
subgraphs into com.microsoft contrib operators), built with `webiree.compile`, and compared
output by output with onnxruntime on the same optimized model.

Exporter: the TorchScript one (`dynamo=False`) with `attn_implementation="eager"`: the
optimizer's fusions pattern-match the graphs that exporter writes; with the SDPA attention
(transformers' default) no Attention is fused, and the dynamo exporter's GPT-2 graph makes
the optimizer raise. What each level emits (torch 2.13, transformers 5.23, onnxruntime 1.31):

    bert  0: Attention x2, SkipLayerNormalization x4, BiasGelu x2
    bert  1: SkipLayerNormalization x4, Gelu x2   (onnxruntime's own graph passes run first at
             levels 1 and 2; with static shapes they fold the attention-mask subgraph, and the
             Attention fusion then fails with "failed to match mask path")
    bert  2: SkipLayerNormalization x4, BiasGelu x2
    gpt2 0-2: SkipLayerNormalization x4, FastGelu x2   (model_type "gpt2" fuses attention only
             "with past" (FusionGptAttention matches the past/present Concat); use_cache=False
             has none, so the attention stays MatMul/Softmax)

    bert_dynamic 0-2: EmbedLayerNormalization x1, Attention x2, SkipLayerNormalization x4,
             BiasGelu x2

`bert` is exported with static shapes; its position ids are then a constant, and the
EmbedLayerNormalization fusion (which matches input_ids -> Shape -> Gather -> ... -> Slice of the
position-id buffer) finds nothing. `bert_dynamic` is the same model exported with symbolic batch
and sequence axes: every level then fuses the embedding and the attention, and webiree builds it
with the input shapes pinned (`input_shapes`) to the same static shapes.
"""

from __future__ import annotations

import collections
import time

import numpy as np
import onnx
import pytest

import webiree

from .conftest import assert_close, ort_run

SEQ = 16
BATCH = 2
HEADS, HIDDEN = 4, 64

# contrib op types each level must contain (at least these; the test prints all of them)
EXPECTED = {
    ("bert", 0): {"Attention", "SkipLayerNormalization", "BiasGelu"},
    ("bert", 1): {"SkipLayerNormalization", "Gelu"},
    ("bert", 2): {"SkipLayerNormalization", "BiasGelu"},
    ("bert_dynamic", 0): {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"},
    ("bert_dynamic", 1): {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"},
    ("bert_dynamic", 2): {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization", "BiasGelu"},
    ("gpt2", 0): {"SkipLayerNormalization", "FastGelu"},
    ("gpt2", 1): {"SkipLayerNormalization", "FastGelu"},
    ("gpt2", 2): {"SkipLayerNormalization", "FastGelu"},
}


def _randomize(model, seed):
    """Non-trivial norm scales/biases and Linear/Conv1D biases (HF zero-initialises biases and
    sets norms to 1/0), so a dropped term in a fused kernel changes the result."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
            norm = "Norm" in type(mod).__name__
            for pname, p in sorted(mod._parameters.items()):
                if p is None:
                    continue
                if norm and pname == "weight":
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                elif pname == "bias":
                    p.copy_((0.1 if norm else 0.02) * torch.randn(p.shape, generator=g))


def _build(name):
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    input_ids = rng.integers(0, 100, size=(BATCH, SEQ), dtype=np.int64)
    attention_mask = np.ones((BATCH, SEQ), np.int64)
    attention_mask[1, SEQ - 5:] = 0                      # the second sequence is padded
    if name == "bert":
        cfg = BertConfig(vocab_size=100, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
                         intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
                         attn_implementation="eager")
        model = BertModel(cfg)
        token_type_ids = np.zeros((BATCH, SEQ), np.int64)
        token_type_ids[:, SEQ // 2:] = 1
        feeds = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        outputs = ["last_hidden_state", "pooler_output"]
    else:
        cfg = GPT2Config(vocab_size=100, n_embd=HIDDEN, n_layer=2, n_head=HEADS, n_positions=64, use_cache=False,
                         bos_token_id=0, eos_token_id=0, attn_implementation="eager")
        model = GPT2Model(cfg)
        feeds = dict(input_ids=input_ids, attention_mask=attention_mask)
        outputs = ["last_hidden_state"]
    _randomize(model, 1)
    return model.eval(), feeds, outputs


def _export(name, path, dynamic=False):
    import torch

    from webiree.testing.models import tuple_outputs

    model, feeds, outputs = _build(name)
    names = list(feeds)
    example = tuple(torch.from_numpy(v) for v in feeds.values())
    torch.onnx.export(tuple_outputs(model, names, outputs), example, str(path),
                      input_names=names, output_names=outputs, opset_version=17, dynamo=False,
                      dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names} if dynamic else None)
    return feeds


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{model name: (path of the exported .onnx, feeds)}, exported once per module."""
    d = tmp_path_factory.mktemp("contrib_models")
    out = {name: (d / f"{name}.onnx", _export(name, d / f"{name}.onnx")) for name in ("bert", "gpt2")}
    out["bert_dynamic"] = (d / "bert_dynamic.onnx", _export("bert", d / "bert_dynamic.onnx", dynamic=True))
    return out


def _contrib_census(model):
    return collections.Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft")


@pytest.mark.slow
@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("name", ["bert", "bert_dynamic", "gpt2"])
def test_optimized_model(name, level, exported, tmp_path, capsys):
    from onnxruntime.transformers.optimizer import optimize_model

    path, feeds = exported[name]
    opt = optimize_model(str(path), model_type=name.split("_")[0], num_heads=HEADS, hidden_size=HIDDEN, opt_level=level)
    opt_path = tmp_path / f"{name}_opt{level}.onnx"
    # save_model_to_file, as users save it: at opt_level 0 only the optimizer's Python fusions
    # run and opt.model lacks the com.microsoft opset import, which the save adds
    opt.save_model_to_file(str(opt_path))
    model = onnx.load(str(opt_path))
    census = _contrib_census(model)
    assert EXPECTED[(name, level)] <= set(census), (name, level, dict(census))

    t0 = time.perf_counter()
    res = webiree.compile(opt_path, tmp_path / "site", {k: v.shape for k, v in feeds.items()})
    build_s = time.perf_counter() - t0
    sess = webiree.InferenceSession(tmp_path / "site")
    got = sess.run(None, feeds)
    ref = ort_run(model, feeds)
    assert len(got) == len(ref) == len(model.graph.output)
    errs = {o.name: assert_close(g, r, 1e-4, f"{name}/opt{level}:{o.name}")
            for g, r, o in zip(got, ref, model.graph.output, strict=True)}
    with capsys.disabled():
        print(f"\n[contrib-models] {name} opt_level={level}: contrib ops "
              + ", ".join(f"{k} x{v}" for k, v in sorted(census.items()))
              + f"; {len(model.graph.node)} nodes, {res.manifest['dispatches']} dispatches, build {build_s:.1f} s; "
              + "max rel. error " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
