"""The op registry: ONNX op type -> handler (see ops/__init__.py)."""

from __future__ import annotations

OPS: dict = {}


class Unsupported(Exception):
    """This node uses a variant of its op that webiree cannot compile."""


def register(*names):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn
    return deco
