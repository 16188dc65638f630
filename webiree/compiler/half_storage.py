"""Half storage: float16 activations kept as f16 in GPU memory where the adapter has `shader-f16`.

A float16 model's run-time tensors are computed in f32 and rounded to float16 where the graph
produces them (lowering.round_narrow_outputs), so every value such a tensor holds is a half. On
an adapter without `shader-f16` they sit in f32 words. A kernel variant built for `shader-f16`
(names ending in `-f16`, compiler/driver.py) stores them as `array<f16>` instead: each store
converts an exact half (exact on every adapter), each load widens it back, and the arithmetic
between stays in f32, as before. The results are bit for bit those of the f32-storage variant;
what changes is the memory traffic of every dispatch that reads or writes such a tensor, halved.

Which tensors (`half_tensors`): temporaries only (inputs, outputs and constants keep their
form: the runtimes' boundary and weights.bin are shared by every variant) whose producer's
result is provably a half: a rounding to f16, or data movement among halves. Views read their
root's storage, so the decision is per buffer root.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..ir import kir, packing
from ..ir import program as P

FEATURE = "shader_f16"          # Target.features / module limits key; WebGPU's 'shader-f16'
HALF = {"f32": "f16", "vec4f": "vec4h"}

_EXACT_OPS = {"select", "neg", "abs", "min", "max"}     # give back one of their operands' values


def _result(op: P.Op):
    """The expression of the op's stored value (None: an anchor's unrounded accumulator)."""
    if isinstance(op, P.Generic):
        return op.expr
    if isinstance(op, P.Loop):
        return op.result
    return getattr(op, "epilogue", None)


def _only_halves(e: kir.Expr, leaf) -> bool:
    """Whether every value `e` can take is a half: a rounding to f16, a weight's unpacked half, a
    constant that is one, or a select, min, max, negation or absolute value of halves; `leaf`
    decides the rest (loads, variables). Non-float parts (a select's condition) do not matter."""
    if e.dtype != "f32":
        return True
    if e.op in ("round_f16", "unpack_f16"):
        return True
    if e.op == "const":
        return bool(packing.is_exact(np.float32(e.attr), "f16"))
    if e.op in _EXACT_OPS:
        return all(_only_halves(a, leaf) for a in e.args)
    return leaf(e)


def _is_half(e: kir.Expr, prog: P.Program, halves: set) -> bool:
    """In the program: a load of a tensor rounded to f16, or of one stored as halves, is a half."""
    def leaf(n):
        t = prog.tensors.get(n.attr) if n.op == "load" else None
        return t is not None and (t.rounded == "f16" or prog.root(n.attr) in halves)
    return _only_halves(e, leaf)


def half_tensors(prog: P.Program) -> frozenset:
    """Buffer roots a `-f16` variant stores as halves (see the module's docstring)."""
    producer = {op.out: op for op in prog.ops}
    out = set()
    for name, t in prog.tensors.items():
        if t.alias_of is not None or t.kind != "temp" or t.dtype != "f32" or t.rounded != "f16":
            continue
        op = producer.get(name)
        e = _result(op) if op is not None else None
        if e is not None and _is_half(e, prog, out):
            out.add(name)
    return frozenset(out)


def store_halves(kernel: kir.Kernel, tensors: list, prog: P.Program, halves: frozenset) -> kir.Kernel:
    """The kernel with the bindings of `halves` (slot i binds tensors[i]) as f16 arrays: stores
    convert, loads widen. The kernel itself when it binds none."""
    names = {b.name: HALF[b.dtype] for b in kernel.bindings
             if not b.uniform and b.dtype in HALF and prog.root(tensors[b.slot]) in halves}
    if not names:
        return kernel

    def fn(node):
        if node.op == "load" and node.attr in names:
            index = kir.substitute(node.args[0], {"__fn__": fn})
            return kir.cast(kir.load(node.attr, index, names[node.attr]), node.dtype)
        return None
    cache: dict = {}
    body = kir.map_exprs(kernel.body, lambda e: kir.substitute(e, {"__fn__": fn}, cache))
    body = _convert_stores(body, names)
    bindings = [dataclasses.replace(b, dtype=names.get(b.name, b.dtype)) for b in kernel.bindings]
    return dataclasses.replace(kernel, bindings=bindings, body=body)


def _convert_stores(body: list, names: dict) -> list:
    out = []
    for s in body:
        if isinstance(s, kir.Store) and s.buf in names:
            s = kir.Store(s.buf, s.index, kir.cast(s.value, names[s.buf]))
        elif isinstance(s, kir.For):
            s = dataclasses.replace(s, body=_convert_stores(s.body, names))
        elif isinstance(s, kir.If):
            s = kir.If(s.cond, _convert_stores(s.then, names), _convert_stores(s.orelse, names))
        out.append(s)
    return out


_HALF_ARITH = ("add", "sub", "mul")


def _half(e: kir.Expr, lets: set) -> bool:
    """In a `-f16` kernel: a load of halves (widened at once) and a `Let` of a half (`lets`: their
    names) are halves too."""
    return _only_halves(e, lambda n: n.op == "cast" and n.args[0].dtype == "f16" or n.op == "var" and n.attr in lets)


def half_arithmetic(kernel: kir.Kernel) -> tuple[kir.Kernel, int]:
    """A `-f16` kernel's roundings of a sum, difference or product of two halves, `round_f16(a + b)`,
    as f16 arithmetic, `f32(f16(a) + f16(b))`, and how many there are: the same bits, since f16's
    +, - and * are correctly rounded (WGSL) and rounding the exact result once equals rounding
    f32's (itself exact for a product of halves) to f16 (f32 has 24 >= 2 x 11 + 2 bits: the double
    rounding is innocuous), where the integer rounding of legalize.py takes 17 operations. For
    WGSL (the kernel has `enable f16;` already); SPIR-V keeps the integer rounding. A GPU compiler
    may still contract such a product into the next such sum (one rounding where the graph has
    two): at most a half's step, within the model's tolerance (docs/precision.md)."""
    cache: dict = {}
    lets: set = set()
    count = [0]

    def as_half(e: kir.Expr) -> kir.Expr:
        return e.args[0] if e.op == "cast" and e.args[0].dtype == "f16" else kir.cast(e, "f16")

    def fn(node):
        if node.op != "round_f16" or node.args[0].op not in _HALF_ARITH:
            return None
        x = node.args[0]
        a, b = (kir.substitute(y, {"__fn__": fn}, cache) for y in x.args)
        if not (_half(a, lets) and _half(b, lets)):
            return kir.unary("round_f16", kir.binary(x.op, a, b))
        count[0] += 1
        return kir.cast(kir.binary(x.op, as_half(a), as_half(b)), "f32")

    def walk(body: list) -> list:
        out = []
        for st in body:
            if isinstance(st, kir.Let):
                value = kir.substitute(st.value, {"__fn__": fn}, cache)
                if _half(value, lets):
                    lets.add(st.name)
                out.append(kir.Let(st.name, value))
            elif isinstance(st, kir.For):
                out.append(dataclasses.replace(st, body=walk(st.body)))
            elif isinstance(st, kir.If):
                out.append(kir.If(st.cond, walk(st.then), walk(st.orelse)))
            else:
                out.extend(kir.map_exprs([st], lambda e: kir.substitute(e, {"__fn__": fn}, cache)))
        return out

    body = walk(kernel.body)
    return dataclasses.replace(kernel, body=body), count[0]


def half_arithmetic_ops(kernel: kir.Kernel) -> int:
    """How many roundings `half_arithmetic` computes in f16 (inspect's precision plan names them)."""
    return half_arithmetic(kernel)[1]


def uses_halves(kernel: kir.Kernel) -> bool:
    return any(b.dtype in HALF.values() for b in kernel.bindings)
