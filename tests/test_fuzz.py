"""The model fuzzer (webiree/testing/fuzz.py): seeded mutations of the test models
(mlp, small_cnn, tiny_attention) must each end in success or a WebireeError within a
time bound. Zero other exceptions, zero hangs, zero worker crashes, zero CompilerBugs,
and where onnxruntime runs a mutated model too, the results agree -- for at least
MIN_AGREED_SHARE of the cases, so that the agreement check cannot pass empty.

    WEBIREE_FUZZ_CASES=2000 WEBIREE_FUZZ_SEED=7 pytest tests/test_fuzz.py -s   # a longer campaign
    python -m webiree.testing.fuzz --cases 500 --seed 0                       # the report alone
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from webiree.testing import fuzz

CASES = int(os.environ.get("WEBIREE_FUZZ_CASES", "510"))
SEED = int(os.environ.get("WEBIREE_FUZZ_SEED", "0"))
# Cases compared with onnxruntime and agreeing, as a share of all cases. Measured: 97 of 510
# (19 %) for seed 0, 95 of 510 for seed 1; 1,870 of 11,000 (17 %) over seeds 0-9 in
# docs/reliability.md. 16 % (81 of 510) leaves room for a few more rejected mutations, and
# fails when the comparisons thin out or vanish.
MIN_AGREED_SHARE = 0.16


def test_generation_is_seeded_and_covers_every_mutation():
    a = [(c.kind, c.base, c.desc, c.model) for c in fuzz.generate(60, seed=3)]
    b = [(c.kind, c.base, c.desc, c.model) for c in fuzz.generate(60, seed=3)]
    assert a == b
    assert {k for k, *_ in a} == set(fuzz.MUTATIONS)
    assert {base for _, base, *_ in a} == set(fuzz.BASE_MODELS)
    assert a != [(c.kind, c.base, c.desc, c.model) for c in fuzz.generate(60, seed=4)]


def test_compile_deadline_interrupts_and_restores_outer_timer():
    import signal

    signal.setitimer(signal.ITIMER_REAL, 100.0)    # stands for pytest-timeout's own alarm
    try:
        t0 = time.monotonic()
        with pytest.raises(fuzz.Deadline):
            with fuzz.deadline(0.2):
                while True:
                    pass
        assert time.monotonic() - t0 < 5
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90 < left <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_worker_crash_and_hang_are_detected_and_the_worker_replaced(tmp_path):
    w = fuzz.Worker()
    try:
        w.submit(1, str(tmp_path), "", selftest="crash")
        assert w.collect(30)["outcome"] == "crash"
        w.submit(2, str(tmp_path), "", selftest="hang")
        assert w.collect(2)["outcome"] == "hang"
        w.submit(3, str(tmp_path / "nothing"), "")       # a fresh worker answers again
        got = w.collect(60)
        assert got["outcome"] == "ModelError" and got["id"] == 3
        assert w.restarts == 2
    finally:
        w.close()


def test_onnxruntime_comparison(tmp_path):
    """The worker's check: agreement, each kind of difference (output count included), refusal."""
    import numpy as np
    import onnxruntime as ort

    from webiree.testing import models

    m = models.mlp()
    path = tmp_path / "mlp.onnx"
    path.write_bytes(m.SerializeToString())
    feeds = models.sample_inputs(m)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)

    assert len(ref) == 2        # probs, logits
    assert fuzz._compare_ort(ort, str(path), feeds, ref) == ("agree", "")
    assert fuzz._compare_ort(ort, str(path), feeds, ref + ref[:1]) == (
        "differ", "webiree gives 3 outputs, onnxruntime 2")
    assert fuzz._compare_ort(ort, str(path), feeds, ref[:1]) == ("differ", "webiree gives 1 outputs, onnxruntime 2")
    verdict, detail = fuzz._compare_ort(ort, str(path), feeds, [ref[0], ref[1] * 1.01])
    assert verdict == "differ" and detail.startswith("output 1:") and "1.00e-02" in detail
    verdict, detail = fuzz._compare_ort(ort, str(path), feeds, [ref[0][:1], ref[1]])
    assert verdict == "differ" and detail.startswith("output 0: shape")
    nan = ref[0].copy()
    nan[0, 0] = np.nan
    assert fuzz._compare_ort(ort, str(path), feeds, [nan, ref[1]]) == ("differ", "output 0: NaN in other places")

    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    verdict, detail = fuzz._compare_ort(ort, str(tmp_path / "bad.onnx"), feeds, ref)
    assert verdict == "refused" and detail.startswith("InvalidProtobuf")
    with pytest.raises(ValueError):     # feeds that miss the model's inputs: not a refusal, propagates
        fuzz._compare_ort(ort, str(path), {"nothing": feeds["x"]}, ref)


def test_campaign_without_onnxruntime_fails_loudly(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)     # makes `import onnxruntime` fail
    with pytest.raises(ImportError):
        fuzz.run_campaign(1, SEED)


@pytest.mark.timeout(600)
def test_fuzz_campaign(capsys):
    rep = fuzz.run_campaign(CASES, SEED)
    with capsys.disabled():
        print(f"\n[fuzz] seed {SEED}\n{rep.text()}\n[fuzz] {rep.summary()}")
    assert len(rep.results) == CASES >= 500
    assert not rep.bugs(), "non-WebireeError exceptions, hangs or crashes:\n" + rep.text()
    assert not rep.compiler_bugs(), "CompilerBugs:\n" + rep.text()
    assert not rep.disagreements(), "results differ from onnxruntime:\n" + rep.text()
    # every case that ran natively was either compared with onnxruntime or refused by it
    ran = [r for r in rep.results if r.run == "ok"]
    assert len(ran) == len(rep.compared()) + len(rep.refused()), rep.summary()
    min_agreed = int(MIN_AGREED_SHARE * CASES)
    assert len(rep.agreed()) >= min_agreed, (
        f"fewer than {min_agreed} cases compared with onnxruntime and agreeing: {rep.summary()}")
    assert rep.worker_restarts == 0
    table = rep.table()
    assert set(table) == set(fuzz.MUTATIONS)
    assert len(ran) >= CASES // 10, "too few mutated models compile: the mutations only test the parser"
    assert max(r.seconds for r in rep.results) < fuzz.COMPILE_DEADLINE_S
