"""Transformer architectures with 64-value attention heads (BERT-base's, GPT-2's, ViT-base's, T5's,
Whisper's, CLIP's), as `transformers` exports them: each builds with the default limits, its
attention is one dispatch a layer (compiler/passes.py fuse_attention; config.py _attention_online
fits such heads in the default 16 KiB of workgroup memory), and the GPU variant and the variant
this adapter picks match onnxruntime. Before 7 Dec 2026 none of these built with the default
limits ("no fused-attention kernel fits this adapter's limits"). One layer each, seeded random
weights, narrow models (the head size is what matters here), exported by TorchScript."""

from __future__ import annotations

import numpy as np
import pytest

import webiree

from .conftest import assert_close, ort_run

SEQ = 24


def _case(name):
    """(model, feeds: name -> array, output names)."""
    import torch
    import transformers as T

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 90, (1, SEQ)).astype(np.int64)
    mask = np.ones((1, SEQ), np.int64)
    mask[0, -5:] = 0
    if name == "distilbert":
        m = T.DistilBertModel(T.DistilBertConfig(vocab_size=100, dim=128, n_heads=2, hidden_dim=256, n_layers=1,
                                                 max_position_embeddings=64, attn_implementation="eager"))
        return m, {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state"]
    if name == "vit":
        m = T.ViTModel(T.ViTConfig(hidden_size=128, num_attention_heads=2, intermediate_size=256, num_hidden_layers=1,
                                   image_size=64, patch_size=16, attn_implementation="eager"))
        return m, {"pixel_values": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}, \
            ["last_hidden_state", "pooler_output"]
    if name == "t5_encoder":
        m = T.T5EncoderModel(T.T5Config(vocab_size=100, d_model=128, d_kv=64, num_heads=2, d_ff=256, num_layers=1))
        return m, {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state"]
    if name == "clip_text":
        m = T.CLIPTextModel(T.CLIPTextConfig(vocab_size=100, hidden_size=128, num_attention_heads=2,
                                             intermediate_size=256, num_hidden_layers=1, max_position_embeddings=64,
                                             attn_implementation="eager"))
        return m, {"input_ids": ids}, ["last_hidden_state", "pooler_output"]
    assert name == "whisper_encoder"
    m = T.WhisperModel(T.WhisperConfig(d_model=128, encoder_attention_heads=2, encoder_ffn_dim=256, encoder_layers=1,
                                       decoder_attention_heads=2, decoder_ffn_dim=256, decoder_layers=1, num_mel_bins=16, max_source_positions=SEQ,
                                       attn_implementation="eager")).encoder
    return m, {"input_features": rng.standard_normal((1, 16, 2 * SEQ)).astype(np.float32)}, ["last_hidden_state"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["distilbert", "vit", "t5_encoder", "clip_text", "whisper_encoder"])
def test_64_value_heads_build_fused_and_match(name, tmp_path):
    import onnx
    import torch

    from webiree.testing.models import tuple_outputs

    model, feeds, outputs = _case(name)
    path = tmp_path / f"{name}.onnx"
    names = list(feeds)
    with torch.no_grad():
        torch.onnx.export(tuple_outputs(model.eval(), names, outputs), tuple(torch.from_numpy(v) for v in feeds.values()),
                          str(path), input_names=names, output_names=outputs, opset_version=17, dynamo=False)
    proto = onnx.load(str(path))
    feeds = {i.name: feeds[i.name] for i in proto.graph.input}      # (an input the trace left unused is gone)
    ref = ort_run(proto, feeds)
    res = webiree.compile(path, tmp_path / "site")
    attention = [d for d in res.dispatches if d.kind == "attention"]
    assert len(attention) == 1, [(d.kind, d.nodes) for d in res.dispatches]
    for variant in ("gpu", None):
        got = webiree.InferenceSession(tmp_path / "site", variant=variant).run(None, feeds)
        assert len(got) == len(ref) == len(outputs)
        for g, r, o in zip(got, ref, outputs):
            assert_close(g, r, name=f"{name} {variant or 'picked'} {o}")
