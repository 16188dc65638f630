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


class ModelError(WebireeError):
    """The file is missing, is not ONNX, or the graph is malformed."""

    kind = "model"


class UnsupportedOpError(WebireeError):
    """The model uses ops (or op variants) webiree cannot compile yet."""

    kind = "unsupported"


class ShapeError(WebireeError):
    """A shape cannot be resolved at compile time or is inconsistent."""

    kind = "shape"


class FeedError(WebireeError):
    """Inputs given to `run` do not match the model (name, shape, dtype, range)."""

    kind = "feed"


class DeviceError(WebireeError):
    """No usable WebGPU adapter/device, or the device failed."""

    kind = "device"


class LimitsError(WebireeError):
    """The model needs more than the adapter's limits allow."""

    kind = "limits"


class CompilerBug(WebireeError):
    """An internal invariant failed (e.g. naga rejected a shader we emitted)."""

    kind = "internal"
