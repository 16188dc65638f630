"""The suite's own rules (tests/conftest.py): a skip or an xfail fails the run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("call,outcome", [
    ("skip", "1 skipped"),
    ("xfail", "1 xfailed"),
    ("assert", "2 passed"),
])
def test_skip_or_xfail_fails_the_run(tmp_path, call, outcome):
    """A throw-away test file that skips or xfails one test (or passes both) run with our conftest."""
    body = "assert True" if call == "assert" else f"getattr(pytest, {call!r})('reason')"
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text(f"import pytest\n\ndef test_a():\n    {body}\n\ndef test_b():\n    pass\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert outcome in p.stdout, p.stdout
    if outcome == "2 passed":
        assert p.returncode == 0, p.stdout
    else:
        assert p.returncode == 1 and "the run fails (no escape hatches)" in p.stdout, p.stdout
