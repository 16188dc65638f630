"""Softmax and layer normalization: one row per workgroup, or per invocation on CPU adapters."""

from __future__ import annotations

from ...ir import program as P
from ...ir import kir
from ...ir.kir import Assign, Barrier, Decl, For, If, Let, Store, f32, i32, lvar
from .common import Strategy, Binder, grid_for, linear_wid, lid, epilogue, NEG_INF
from .pool_reduce import max_nan, tree


class _Rows:
    """How a softmax / layernorm dispatch walks its rows of R elements.

    'workgroup-tree' (GPUs): one row per workgroup; invocations stride over the row and combine
    partial results through workgroup memory. 'row-per-invocation' (CPU adapters, where a
    barrier is a coroutine switch): one row per invocation, serial loops, no barriers."""

    def __init__(self, cfg, rows: int, inner: int, r: int, limits: dict):
        self.lane = cfg.strategy == Strategy.ROW_PER_INVOCATION
        self.wg, self.rows, self.inner, self.r, self.limits = cfg.workgroup_size[0], rows, inner, r, limits
        self.arrays: list[str] = []  # one workgroup array per combine()

    def setup(self) -> list:
        row = lvar("row", "i32")
        base = (row // self.inner) * (self.r * self.inner) + row % self.inner if self.inner > 1 else row * self.r
        return [Let("base", base)]

    def guard(self, work: list) -> list:
        first = linear_wid() * self.wg + lid() if self.lane else linear_wid()
        return [Let("row", first), If(lvar("row", "i32") < self.rows, work)]

    def loop(self, var_name: str, body: list):
        return For(var_name, i32(0), i32(self.r), body) if self.lane else \
            For(var_name, lid(), i32(self.r), body, step=self.wg)

    def combine(self, name: str, combine, value: kir.Expr) -> list:
        """Let `name` = the row's combination of every invocation's `value`.

        Each combination reduces in its own workgroup array, never written again after its result
        is read: Mesa's GLSL compiler (llvmpipe, under Dawn's OpenGL ES backend) moves a read of
        workgroup memory past barrier() to the read's uses, so a later reduction that reused the
        array fed the first one's users another invocation's partial value (MiniLM's LayerNorm
        mean, issue #19 item 6)."""
        if self.lane:
            return [Let(name, value)]
        red = f"red{len(self.arrays)}" if self.arrays else "red"
        self.arrays.append(red)
        return tree(red, self.wg, combine, value, "f32") + [Let(name, kir.sload(red, i32(0), "f32")), Barrier()]

    def shared(self) -> list:
        return [kir.SharedArray(red, "f32", self.wg) for red in self.arrays]

    def grid(self):
        return grid_for(-(-self.rows // self.wg) if self.lane else self.rows, self.limits)


def build_softmax(op: P.Softmax, prog, cfg, limits, b: Binder):
    rows = _Rows(cfg, op.outer * op.inner, op.inner, op.r, limits)
    base, rv = lvar("base", "i32"), lvar("r", "i32")
    idx = base + rv * op.inner
    elem = b.load(op.x, idx)
    out = b.name(op.out)
    work = rows.setup() + [Decl("m", "f32", kir.const(NEG_INF, "f32"))]
    work.append(rows.loop("r", [Assign("m", max_nan(lvar("m", "f32"), elem))]))
    work += rows.combine("mx", max_nan, lvar("m", "f32"))
    mx = lvar("mx", "f32")
    work += [Decl("s", "f32", f32(0.0))]
    work.append(rows.loop("r", [Assign("s", lvar("s", "f32") + kir.unary("exp", elem - mx))]))
    work += rows.combine("total", lambda a, c: a + c, lvar("s", "f32"))
    total = lvar("total", "f32")
    if op.log:
        val = elem - mx - kir.unary("log", total)
    else:
        val = kir.unary("exp", elem - mx) / total
    oi = lvar("oi", "i32")
    work.append(rows.loop("r", [Let("oi", idx), Store(out, oi, epilogue(op, b, val, oi))]))
    return rows.guard(work), rows.shared(), rows.grid()


def build_layernorm(op: P.LayerNorm, prog, cfg, limits, b: Binder):
    rows = _Rows(cfg, op.outer, 1, op.r, limits)
    base, rv = lvar("base", "i32"), lvar("r", "i32")
    elem = b.load(op.x, base + rv)
    out = b.name(op.out)
    work = rows.setup() + [Decl("s", "f32", f32(0.0))]
    work.append(rows.loop("r", [Assign("s", lvar("s", "f32") + elem)]))
    work += rows.combine("rsum", lambda a, c: a + c, lvar("s", "f32"))
    work += [Let("mean", lvar("rsum", "f32") / kir.size_f32(op.r))]
    mean = lvar("mean", "f32")
    work += [Decl("v", "f32", f32(0.0))]
    d = elem - mean
    work.append(rows.loop("r", [Assign("v", lvar("v", "f32") + d * d)]))
    work += rows.combine("rvar", lambda a, c: a + c, lvar("v", "f32"))
    work += [Let("inv", kir.unary("rsqrt", lvar("rvar", "f32") / kir.size_f32(op.r) + op.eps))]
    val = (elem - mean) * lvar("inv", "f32") * b.load(op.scale, rv)
    if op.bias:
        val = val + b.load(op.bias, rv)
    oi = lvar("oi", "i32")
    work.append(rows.loop("r", [Let("oi", base + rv), Store(out, oi, epilogue(op, b, val, oi))]))
    return rows.guard(work), rows.shared(), rows.grid()
