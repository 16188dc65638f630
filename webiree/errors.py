"""One error type for everything a user can get wrong (DESIGN.md contract 8).

Every failure a user can cause — a bad file, an unsupported op, a shape that
cannot be resolved, a wrong feed, no GPU — raises a subclass of
`WebireeError`. It carries the ONNX node (name and op type) where there is one
and a hint that says what to do. The CLI prints `str(err)` as one line plus
the hint and exits non-zero; it never shows a traceback unless `--debug`.
"""

from __future__ import annotations


class WebireeError(Exception):
    """Base class of every error webiree raises on purpose."""

    kind = "error"

    def __init_subclass__(cls, kind: str = "", **kw):
        super().__init_subclass__(**kw)
        cls.kind = kind or cls.kind     # each kind of error names itself in its class statement

    def __init__(self, message: str, *, node: str | None = None, op: str | None = None,
                 hint: str | None = None):
        self.message = message
        self.node = node
        self.op = op
        self.hint = hint
        super().__init__(self._format())

    def _format(self) -> str:
        where = ""
        if self.node is not None or self.op is not None:
            where = f" [node {self.node!r} ({self.op})]" if self.node else f" [{self.op}]"
        return f"{self.message}{where}"


class ModelError(WebireeError, kind="model"):
    """The file is missing, is not ONNX, or the graph is malformed."""


class UnsupportedOpError(WebireeError, kind="unsupported"):
    """The model uses ops (or op variants) webiree cannot compile yet."""


class ShapeError(WebireeError, kind="shape"):
    """A shape cannot be resolved at compile time or is inconsistent."""


class FeedError(WebireeError, kind="feed"):
    """Inputs given to `run` do not match the model (name, shape, dtype, range)."""


class DeviceError(WebireeError, kind="device"):
    """No usable WebGPU adapter/device, or the device failed."""


class LimitsError(WebireeError, kind="limits"):
    """The model needs more than the adapter's limits allow."""


class CompilerBug(WebireeError, kind="internal"):
    """An internal invariant failed (e.g. naga rejected a shader we emitted)."""
