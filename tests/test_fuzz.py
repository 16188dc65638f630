"""The model fuzzer (webiree/testing/fuzz.py): seeded mutations of the test models
(mlp, small_cnn, tiny_attention) must each end in success or a WebireeError within a
time bound. Zero other exceptions, zero hangs, zero worker crashes, zero CompilerBugs,
and where onnxruntime runs a mutated model too, the results agree.

    WEBIREE_FUZZ_CASES=2000 WEBIREE_FUZZ_SEED=7 pytest tests/test_fuzz.py -s   # a longer campaign
    python -m webiree.testing.fuzz --cases 500 --seed 0                       # the report alone
"""

from __future__ import annotations

import os
import time

import pytest

from webiree.testing import fuzz

CASES = int(os.environ.get("WEBIREE_FUZZ_CASES", "510"))
SEED = int(os.environ.get("WEBIREE_FUZZ_SEED", "0"))


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


@pytest.mark.timeout(600)
def test_fuzz_campaign(capsys):
    rep = fuzz.run_campaign(CASES, SEED)
    with capsys.disabled():
        print(f"\n[fuzz] seed {SEED}\n" + rep.text())
    assert len(rep.results) == CASES >= 500
    assert not rep.bugs(), "non-WebireeError exceptions, hangs or crashes:\n" + rep.text()
    assert not rep.compiler_bugs(), "CompilerBugs:\n" + rep.text()
    assert not rep.disagreements(), "results differ from onnxruntime:\n" + rep.text()
    assert rep.worker_restarts == 0
    table = rep.table()
    assert set(table) == set(fuzz.MUTATIONS)
    ran = sum(r.run == "ok" for r in rep.results)
    assert ran >= CASES // 10, "too few mutated models compile: the mutations only test the parser"
    assert max(r.seconds for r in rep.results) < fuzz.COMPILE_DEADLINE_S
