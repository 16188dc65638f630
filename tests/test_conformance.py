"""ONNX conformance: the backend node test suite (every case of the installed onnx).

The full run is `test_node_suite` (slow: about 2 minutes on 2 cores); its ratchet is
the set of passing case names in tests/conformance_passing.txt: every one must still
pass (a folded case, computed at compile time without a webiree kernel, does not count).
`.venv/bin/python -m tests.conformance_report` runs the same cases and writes
docs/conformance.md and that file. The quick tests below check the backend API and a
sample of cases from every op family.
"""

from __future__ import annotations

import json
import os
import unittest

import numpy as np
import pytest

from tests import conformance_report as conf

# A ratchet beside the committed passing set: raise it when more op types pass; never lower it.
MIN_OP_TYPES = 167

# one or two cases per lowering family (handlers, ONNX functions, control flow, loops, quantization)
SAMPLE = [
    "test_abs", "test_add_bcast", "test_bitshift_left_int8", "test_mod_mixed_sign_int32", "test_clip_default_int8_min",
    "test_reduce_max_bool_inputs", "test_argmax_keepdims_random_select_last_index", "test_cumsum_1d_int32_exclusive",
    "test_top_k_smallest", "test_hardmax_axis_0", "test_scatter_elements_with_duplicate_indices",
    "test_scatternd_multiply", "test_convtranspose_pads", "test_maxpool_with_argmax_2d_precomputed_strides",
    "test_gridsample_bicubic", "test_resize_downsample_sizes_linear_antialias", "test_depthtospace_crd_mode_example",
    "test_triu", "test_onehot_negative_indices", "test_layer_normalization_4d_axis1",
    "test_rms_normalization_3d_axis1_epsilon", "test_sce_mean_weight_ii", "test_attention_4d_causal",
    "test_instancenorm_example", "test_lrn", "test_batchnorm_epsilon_training_mode", "test_gru_defaults",
    "test_lstm_with_peepholes", "test_scan9_sum", "test_loop11", "test_if", "test_gathernd_example_int32",
    "test_quantizelinear_axis", "test_qlinearmatmul_3D_uint8_float32", "test_dft_opset19", "test_reshape_allowzero_reordered",
    "test_reduce_sum_empty_set", "test_bitwise_and_ui64_bcast_3v1d", "test_ai_onnx_ml_binarizer",
    "test_ai_onnx_ml_tree_ensemble_set_membership", "test_det_nd", "test_roialign_aligned_true",
    "test_basic_deform_conv_with_padding", "test_stft_with_window", "test_center_crop_pad_crop_expanded",
    "test_affine_grid_2d_expanded", "test_flexattention_causal_mask",
]


@pytest.fixture(scope="module")
def data_dir():
    return conf.ensure_node_data()


def test_backend_api(data_dir):
    from webiree.onnx_backend import WebireeBackend

    assert WebireeBackend.supports_device("CPU")
    assert not WebireeBackend.supports_device("CUDA")
    model, sets = conf.load_case("test_reshape_reordered_all_dims", data_dir)
    rep = WebireeBackend.prepare(model, "CPU")
    (inputs, expected), = sets
    out = rep.run(inputs)
    assert out[0].dtype == expected[0].dtype and out[0].shape == expected[0].shape
    np.testing.assert_array_equal(out[0], expected[0])
    # a shape parameter given as a graph input is compiled in (once per distinct value)
    assert rep.deferred == ["shape"]
    rep.run(inputs)
    assert len(rep._compiled) == 1


def test_errors_propagate(data_dir):
    import webiree
    from webiree.onnx_backend import WebireeBackend

    model, _ = conf.load_case("test_image_decoder_decode_png_rgb", data_dir)
    with pytest.raises(webiree.UnsupportedOpError, match="ImageDecoder"):
        WebireeBackend.prepare(model)
    model, _ = conf.load_case("test_nonzero_example", data_dir)
    with pytest.raises(webiree.UnsupportedOpError, match="NonZero"):
        WebireeBackend.prepare(model)


def test_onnx_backend_test_runner(data_dir):
    """onnx's own BackendTest drives the backend (node cases collected in-process by onnx)."""
    import onnx.backend.test

    from webiree.onnx_backend import WebireeBackend

    bt = onnx.backend.test.BackendTest(WebireeBackend, __name__)
    bt.include(r"^test_(relu|gather_0|softmax_axis_1|conv_with_strides_padding)_cpu$")
    result = unittest.TextTestRunner(verbosity=0, stream=open(os.devnull, "w")).run(bt.test_suite)
    assert result.wasSuccessful(), result.failures + result.errors
    assert result.testsRun - len(result.skipped) == 4    # the others are skipped by the include pattern


def test_sample_cases(data_dir):
    """Every sample case exists in the installed onnx and passes with a webiree kernel (not folded)."""
    names = SAMPLE
    assert not [n for n in names if not (data_dir / n).exists()], "the installed onnx lacks sample cases"
    results = conf.run_all(names, data_dir, jobs=1)
    assert [r["name"] for r in results] == names
    bad = [(r["name"], r.get("error") or r.get("reason")) for r in results if r["status"] != "passed"]
    assert not bad, bad


def test_folded_cases_are_told_apart(data_dir):
    """A case whose every output the compiler computes (all inputs compiled in, or outputs that do
    not depend on the inputs' values) is 'folded'; one a kernel computes from its inputs is 'passed'."""
    results = conf.run_all(["test_hannwindow", "test_shape", "test_constant", "test_identity", "test_abs",
                            "test_reshape_reordered_all_dims"], data_dir, jobs=1)
    assert [r["status"] for r in results] == ["folded"] * 3 + ["passed"] * 3, results
    s = conf.summarize(results)
    assert (s["passed"], s["folded"]) == (3, 3)
    assert "Shape" not in s["ops_passing"] and "Abs" in s["ops_passing"]


def test_exclusion_reasons_are_honest(data_dir):
    """Static classification only: every exclusion names one reason of the fixed list."""
    for name in ["test_cast_FLOAT_to_DOUBLE", "test_sequence_insert_at_back", "test_nonzero_example",
                 "test_adam", "test_training_dropout", "test_cast_FLOAT_to_FLOAT8E4M3FN"]:
        model, sets = conf.load_case(name, data_dir)
        assert conf.exclusion_reason(model, sets) in conf.EXCLUSIONS, name
    for name in ["test_abs", "test_loop11", "test_gru_defaults", "test_attention_4d", "test_cast_FLOAT_to_FLOAT16"]:
        model, sets = conf.load_case(name, data_dir)
        assert conf.exclusion_reason(model, sets) is None, name


@pytest.mark.slow
def test_node_suite(data_dir, tmp_path, capsys):
    names = conf.case_names(data_dir)
    results = conf.run_all(names, data_dir)
    conf.resolve_ops(results, data_dir)
    (tmp_path / "results.json").write_text(json.dumps(results, indent=1))
    s = conf.summarize(results)
    assert s["total"] == len(names)
    assert {r["reason"] for r in results if r["status"] == "excluded"} <= set(conf.EXCLUSIONS)
    crashed = [r["name"] for r in results if r["status"] == "failed" and
               r["error"].startswith(("worker crashed", "timeout", "runner:"))]
    assert not crashed, crashed
    passing = {r["name"] for r in results if r["status"] == "passed"}
    ratchet = conf.read_passing()
    assert ratchet <= set(names), f"the ratchet names cases the installed onnx lacks: {sorted(ratchet - set(names))[:10]}"
    lost = {r["name"]: r.get("error") or r["status"] for r in results if r["name"] in ratchet - passing}
    assert not lost, f"{len(lost)} cases of tests/conformance_passing.txt no longer pass: {lost}"
    assert len(s["ops_passing"]) >= MIN_OP_TYPES, f"{len(s['ops_passing'])} op types pass"
    with capsys.disabled():
        print(f"\n[conformance] {s['passed']} passed ({len(passing - ratchet)} beyond the ratchet's {len(ratchet)}), "
              f"{s['folded']} folded, {s['failed']} failed, {s['excluded']} excluded; "
              f"{len(s['ops_passing'])} op types pass")
