"""A DynamicQuantizeLinear's range, reduced by the kernel that writes its input (Tensor.ranges,
compiler/passes.py ranges_from_producers).

`record` rewrites the producer's kernel: every invocation keeps the minima of the values it
stores and of their negations, the workgroup reduces both in one tree at the end, and its first
invocation stores them in the workgroup's slot of the tail after the values; workgroup 0 also
stores how many slots were written. A producer whose workgroups outnumber the slots, whose
workgroup is not a power of 2 or whose workgroup memory has no room for the tree stores a count
of 0, and the range-pack then scans the values itself. `read_range` is the range-pack's side
(kernels/matmul_int8.py build_quantize_words). The tail's layout: ir/program.py RANGE_SLOTS."""

from __future__ import annotations

import itertools
import math

from ...errors import CompilerBug
from ...ir import kir
from ...ir import program as P
from ...ir.kir import Assign, Decl, For, If, Let, Store, i32, lvar
from ...ir.sym import upper
from .common import Binder, arrays_bytes, lid
from .pool_reduce import min_nan, tree


TREE = "qrlo_s"        # the recording's workgroup memory (and `TREE + "_neg"`)


def records(kernel: kir.Kernel) -> bool:
    """Whether a kernel records its result's range (False: it stores a count of 0)."""
    return any(a.name == TREE for a in kernel.shared)


def _tail_store(b: Binder, root: str, index4, lanes) -> list:
    """Stores of the f32 values `lanes` at the start of vec4 `index4` of the tensor `root`,
    through the binding its kernel already has (a vec4 one, else the scalar one)."""
    if (root, True) in b.slots:
        lanes = list(lanes) + [lanes[-1]] * (4 - len(lanes))
        return [Store(b.name(root, vec=True), index4, kir.vec4(*lanes))]
    return [Store(b.name(root), index4 * 4 + q, v) for q, v in enumerate(lanes)]


def _track(body: list, outs: set, names) -> list:
    """body with every store to the bindings `outs` also folded into the minima qrlo, qrnh (the
    stored values' Lets numbered by `names`, a counter per kernel: layers alike stay alike)."""
    lo, nh = lvar("qrlo", "f32"), lvar("qrnh", "f32")
    out = []
    for s in body:
        if isinstance(s, Store) and s.buf in outs:
            if s.value.dtype not in ("f32", "vec4f"):
                raise CompilerBug(f"a range is recorded from {s.value.dtype} stores")
            v = f"rv{next(names)}"
            val = lvar(v, s.value.dtype)
            lanes = [kir.lane(val, q) for q in range(4)] if s.value.dtype == "vec4f" else [val]
            out += [Let(v, s.value), Store(s.buf, s.index, val)]
            for x in lanes:
                out += [Assign("qrlo", min_nan(lo, x)), Assign("qrnh", min_nan(nh, -x))]
        elif isinstance(s, For):
            out.append(For(s.var, s.start, s.stop, _track(s.body, outs, names), s.step, s.unroll))
        elif isinstance(s, If):
            out.append(If(s.cond, _track(s.then, outs, names), _track(s.orelse, outs, names)))
        else:
            out.append(s)
    return out


def record(op: P.Op, prog: P.Program, b: Binder, body: list, shared: list, grid, workgroup_size,
           limits: dict) -> tuple[list, list]:
    """(body, shared) of the kernel writing op.out (a tensor with `ranges`), recording its range."""
    root = prog.root(op.out)
    n4 = P.numel(prog.tensors[root].shape) // 4
    outs = {b.name(root, vec) for key, vec in ((root, False), (root, True)) if (key, vec) in b.slots}
    wg = math.prod(workgroup_size)
    groups = math.prod(upper(g) for g in grid)
    wid = kir.cast((kir.WID[2] * kir.NWG[1] + kir.WID[1]) * kir.NWG[0] + kir.WID[0], "i32")
    li = kir.cast(kir.LINDEX, "i32")
    first = kir.binary("and", kir.binary("eq", wid, i32(0)), kir.binary("eq", li, i32(0)))
    if groups > P.RANGE_SLOTS or wg & (wg - 1) or arrays_bytes(shared) + 8 * wg > limits["max_compute_workgroup_storage_size"]:
        return body + [If(first, _tail_store(b, root, i32(n4), [kir.f32(0.0)]))], shared
    inf = kir.const(float("inf"), "f32")
    count = kir.cast(kir.NWG[0] * kir.NWG[1] * kir.NWG[2], "f32")
    body = [Decl("qrlo", "f32", inf), Decl("qrnh", "f32", inf)] + _track(body, outs, itertools.count())
    body += tree(TREE, wg, min_nan, lvar("qrlo", "f32"), "f32", twin=(TREE + "_neg", lvar("qrnh", "f32")), li=li)
    mins = [kir.sload(TREE, i32(0), "f32"), kir.sload(TREE + "_neg", i32(0), "f32")]
    body.append(If(kir.binary("eq", li, i32(0)), _tail_store(b, root, n4 + 1 + wid, mins)))
    body.append(If(first, _tail_store(b, root, i32(n4), [count])))
    return body, shared + [kir.SharedArray(TREE, "f32", wg), kir.SharedArray(TREE + "_neg", "f32", wg)]


def read_range(b: Binder, t: str, vec: bool, n4: int, wg: int, lo: str, nh: str, li=None) -> tuple[list, kir.Expr]:
    """The range-pack's reads of the slots of t (after n4 vec4s of values), strided over its wg
    invocations and folded into its minima `lo` and `nh` (declared f32 locals), through t's vec4
    binding (`vec`: the range-pack's x itself) or its scalar one (the tensor x's prologue reads);
    with the end of its scan of the values: 0 where slots were written, else n4. li: the
    invocation's index in the workgroup (default its x: a 1-D workgroup)."""
    def word(index4, q):
        return kir.lane(b.load4(t, index4), q) if vec else b.load(t, index4 * 4 + q)
    parts, s = lvar("parts", "i32"), lvar("s", "i32")
    body = [Let("parts", kir.cast(word(i32(n4), 0), "i32")),
            For("s", lid() if li is None else li, parts, [Assign(lo, min_nan(lvar(lo, "f32"), word(n4 + 1 + s, 0))),
                                    Assign(nh, min_nan(lvar(nh, "f32"), word(n4 + 1 + s, 1)))], step=wg)]
    return body, kir.select(kir.binary("eq", parts, i32(0)), i32(n4), i32(0))
