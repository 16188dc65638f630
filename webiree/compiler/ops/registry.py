"""The op registry: ONNX op type -> handler (see ops/__init__.py)."""

from __future__ import annotations

OPS: dict = {}

# Ops onnxruntime defines in the default domain where ONNX does not (at the model's opset):
# the importer has ONNX's checker treat them as custom-domain ops; their handlers add them.
ONNXRUNTIME_DEFAULT_DOMAIN: set = set()


class Unsupported(Exception):
    """This node uses a variant of its op that webiree cannot compile."""


def register(*names):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn
    return deco
