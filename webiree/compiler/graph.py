"""Graph IR: the ONNX model as the compiler's first passes see it.

A `Graph` is a topologically ordered list of `Node`s over named tensors. Every
tensor has a static shape once imported (symbolic input dims are pinned by the
user); constants (initializers and folded values) are numpy arrays.

Internal element types: 'f32', 'i32' (every ONNX integer type up to 32 bits,
and int64 narrowed at the boundary), 'u32' (uint32, and uint64 narrowed), 'bool'
(stored as u32).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..dtypes import storage_of

NUMPY_OF_INTERNAL = {"f32": np.float32, "i32": np.int32, "u32": np.uint32, "bool": np.bool_}


def internal_dtype(elem_type: int) -> str | None:
    return storage_of(elem_type)


def internal_of_numpy(dt: np.dtype) -> str | None:
    dt = np.dtype(dt)
    if dt == np.float32:
        return "f32"
    if dt == np.bool_:
        return "bool"
    if dt == np.uint32 or dt == np.uint64:
        return "u32"
    if dt.kind in "iu" and dt.itemsize <= 8:
        return "i32"
    return None


@dataclass
class Node:
    name: str
    op: str
    inputs: list[str]          # '' for an omitted optional input
    outputs: list[str]
    attrs: dict                # attribute name -> python value (tensors as numpy, graphs as GraphProto)
    domain: str = ""
    proto: object = None       # the onnx NodeProto (for folding with the reference evaluator)
    opset: int | None = None   # the default-domain opset this node is read at (nodes of an expanded
                               # ONNX function keep the function's own); None: the graph's

    def attr(self, key, default=None):
        return self.attrs.get(key, default)

    def input(self, i: int) -> str:
        """The i-th input name, '' when absent."""
        return self.inputs[i] if i < len(self.inputs) else ""


@dataclass
class TensorType:
    shape: tuple[int, ...]
    elem_type: int             # ONNX TensorProto data type

    @property
    def dtype(self) -> str | None:
        return internal_dtype(self.elem_type)


@dataclass
class Graph:
    name: str
    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    types: dict[str, TensorType]             # every known tensor's type
    constants: dict[str, np.ndarray]         # initializers and folded values
    opset: int = 17
    symbolic_inputs: dict = field(default_factory=dict)  # input -> dims as given in the file
    symbols: dict = field(default_factory=dict)          # symbolic dim name -> its Dim (ir/sym.py)
    domain_opsets: dict = field(default_factory=dict)    # other imported domains -> their opset version

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def summary(self) -> str:
        lines = [f"graph {self.name}: {len(self.nodes)} nodes, {len(self.constants)} constants"]
        for n in self.nodes:
            shapes = [self.types[o].shape if o in self.types else "?" for o in n.outputs]
            lines.append(f"  {n.op:<20} {n.name:<30} {n.inputs} -> {n.outputs} {shapes}")
        return "\n".join(lines)
