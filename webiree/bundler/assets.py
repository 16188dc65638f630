"""Where the browser runtime's files are: web/ in a source checkout, web_assets/ in a wheel."""

from __future__ import annotations

from pathlib import Path

from ..errors import WebireeError

RUNTIME_FILES = ("webiree.js", "webiree.d.ts", "worker.js", "tokenizer.js", "tokenizer.d.ts")


def runtime_dir() -> Path:
    """The folder holding the runtime files (RUNTIME_FILES: webiree.js, worker.js, tokenizer.js and their types)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parents[1] / "web", here / "web_assets"):
        if all((candidate / f).is_file() for f in RUNTIME_FILES):
            return candidate
    raise WebireeError("the browser runtime (web/webiree.js) is missing from this webiree installation",
                       hint="install webiree from a source checkout (pip install -e .)")
