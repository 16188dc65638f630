"""Index arithmetic decided by value ranges: divisions, remainders, clamps and tests that the
ranges of their operands settle.

A fused kernel composes its index math from the ops it absorbed: a reshape's `// 384`, a
transpose's `% 32`, a combined product's column offset, a clamp's `min(row, 127)`. Each piece is
right for any value, so the composition is too, but most of it is redundant once the values'
ranges are known: in `((wid.z * 4096 + j * 32 + lid.x * 4 + 3) / 32) % 128` the remainder
`lid.x * 4 + 3` is below 32 and j is below 128, so the whole is `j`. On a GPU an integer division
by a constant is a multiply-high and shifts; on a CPU renderer (lavapipe) a vector of them is
several times that, inside the innermost loops of attention and of every product that reads a
transposed operand.

`simplify(kernel, grid)` knows the range of every builtin (local ids from the workgroup size,
workgroup ids from the dispatch's grid: the largest it is ever dispatched with), of every loop
variable (its constant bounds and step) and of every `Let` (its value's), and rewrites, bottom up,
in i32 (the index type):

- `x / c` and `x % c` (c > 0, x >= 0): with x = sum of k_i * a_i + k_0, the terms whose k_i are
  multiples of c form c * Q and the others the remainder R (k_0 split between them); where R lies
  in [0, c), x / c = Q and x % c = R (TVM's and tinygrad's rule); where R is only known to be
  >= 0, x / c = Q + R / c and x % c = R % c. `x >> s` and `x & (2^s - 1)` are the same
  division and remainder by 2^s.
- `(x / a) / b` = `x / (a * b)`, `(x % (a * b)) % a` = `x % a` (x >= 0).
- `min`, `max`, `clamp` whose result one operand's range decides; `<`, `<=`, `>`, `>=`, `==`, `!=`
  that the ranges decide (a bounds check that always holds).

Each rewrite is exact for every value in the ranges: nothing wraps, since every term's range is
bounded and inside i32. Anything else (loads, mutable variables, floats) is left as it is. The
pass runs once per dispatch before legalization (compiler/driver.py `_render`); both renderers
print its result.
"""

from __future__ import annotations

import math

from . import kir
from .kir import Expr

I32_MAX = (1 << 31) - 1
_UNKNOWN = (-math.inf, math.inf)


def simplify(kernel: kir.Kernel, grid=None) -> kir.Kernel:
    """`kernel` with its integer index math simplified on the ranges of its values. `grid`: the
    largest workgroup count per axis it is dispatched with (None: workgroup ids unbounded)."""
    body = kir.unroll(kernel.body)
    r = _Ranges(kernel, body, grid)
    body = kir.map_exprs(body, r.expr)
    return kir.Kernel(kernel.name, kernel.bindings, kernel.workgroup_size, body, kernel.shared)


def _union(a, b):
    return (min(a[0], b[0]), max(a[1], b[1]))


def _const_int(e: Expr):
    """The value of an integer constant (also through a cast of one), else None."""
    while e.op == "cast" and e.args[0].dtype in ("i32", "u32"):
        e = e.args[0]
    return e.attr if e.op == "const" and e.dtype in ("i32", "u32") else None


class _Ranges:
    def __init__(self, kernel: kir.Kernel, body: list, grid):
        wg = kernel.workgroup_size
        self.vars: dict[str, tuple] = {}
        for c, n in zip("xyz", wg):
            self.vars[f"lid.{c}"] = (0, n - 1)
            if grid is not None:
                self.vars[f"wid.{c}"] = (0, grid["xyz".index(c)] - 1)
                self.vars[f"gid.{c}"] = (0, grid["xyz".index(c)] * n - 1)
                self.vars[f"nwg.{c}"] = (1, grid["xyz".index(c)])
            else:
                self.vars[f"wid.{c}"] = self.vars[f"gid.{c}"] = (0, math.inf)
                self.vars[f"nwg.{c}"] = (1, math.inf)
        self.vars["lindex"] = (0, wg[0] * wg[1] * wg[2] - 1)
        self.bound: dict[str, list] = {}         # Let / For name -> what binds it
        self.mutable: set[str] = set()
        for s in kir.statements(body):
            if isinstance(s, (kir.Decl, kir.Assign)):
                self.mutable.add(s.name)
            elif isinstance(s, kir.Let):
                self.bound.setdefault(s.name, []).append(s.value)
            elif isinstance(s, kir.For):
                self.bound.setdefault(s.var, []).append(s)
        self.memo: dict = {}
        self.busy: set = set()
        self.done: dict = {}      # original node -> rewritten node
        self.seen: set = set()    # ids of the nodes in `done` (kept alive by it)

    # ---- ranges ---------------------------------------------------------------------------

    def range(self, e: Expr) -> tuple:
        """(lo, hi) of an integer expression (infinite ends where unknown)."""
        if e.dtype not in ("i32", "u32"):
            return _UNKNOWN
        got = self.memo.get(e)
        if got is None:
            got = self.memo[e] = self._range(e)
        return got

    def _var(self, name: str) -> tuple:
        if name in self.vars:
            return self.vars[name]
        if name in self.mutable or name not in self.bound or name in self.busy:
            return _UNKNOWN
        self.busy.add(name)
        try:
            out = None
            for b in self.bound[name]:
                if isinstance(b, kir.For):
                    lo, hi = self.range(b.start)[0], self.range(b.stop)[1] - 1
                    if b.step > 1 and b.start.is_const and b.stop.is_const:
                        hi = b.start.attr + (b.stop.attr - 1 - b.start.attr) // b.step * b.step
                    here = (lo, hi) if b.step > 0 else _UNKNOWN
                else:
                    here = self.range(b)
                out = here if out is None else _union(out, here)
            return out
        finally:
            self.busy.discard(name)

    def _range(self, e: Expr) -> tuple:
        op, a = e.op, e.args
        if op == "const":
            return (int(e.attr), int(e.attr))
        if op == "var":
            return self._var(e.attr)
        if op == "cast":
            if a[0].dtype not in ("i32", "u32"):
                return _UNKNOWN
            lo, hi = self.range(a[0])
            return (lo, hi) if lo >= 0 and hi <= I32_MAX else _UNKNOWN
        if op in ("add", "sub", "mul"):
            (al, ah), (bl, bh) = self.range(a[0]), self.range(a[1])
            if op == "add":
                return (al + bl, ah + bh)
            if op == "sub":
                return (al - bh, ah - bl)
            ps = [0 if x == 0 or y == 0 else x * y for x in (al, ah) for y in (bl, bh)]   # 0 * inf = 0
            return (min(ps), max(ps))
        if op in ("min", "max"):
            (al, ah), (bl, bh) = self.range(a[0]), self.range(a[1])
            f = min if op == "min" else max
            return (f(al, bl), f(ah, bh))
        if op == "clamp":
            (xl, xh), (ll, _), (_, hh) = (self.range(x) for x in a)
            return (min(max(xl, ll), hh), max(min(xh, hh), ll))
        if op == "select":
            return _union(self.range(a[1]), self.range(a[2]))
        c = _const_int(a[1]) if len(a) == 2 else None
        lo, hi = self.range(a[0]) if a else _UNKNOWN
        if c is not None and c > 0 and lo >= 0:
            if op == "div":
                return (lo // c, hi // c)
            if op == "mod":
                return (lo, hi) if hi < c else (0, c - 1)
            if op == "shr" and c < 32:
                return (lo >> c, hi >> c if hi != math.inf else hi)
            if op == "band":
                return (0, min(c, hi))
        return _UNKNOWN

    def _bounded(self, e: Expr) -> bool:
        lo, hi = self.range(e)
        return -I32_MAX <= lo and hi <= I32_MAX

    # ---- rewriting ------------------------------------------------------------------------

    def expr(self, root: Expr) -> Expr:
        """`root` rewritten bottom up: each node gets its rewritten children, then its rule."""
        for n in kir.walk(root, self.seen):
            args = tuple(self.done[a] for a in n.args)
            node = n if all(x is y for x, y in zip(args, n.args)) else kir.rebuild(n, args)
            out = self.rule(node) if node.dtype in ("i32", "u32", "bool") else None
            self.done[n] = node if out is None else out
        return self.done[root]

    def rule(self, e: Expr) -> Expr | None:
        op, a = e.op, e.args
        if op in ("min", "max") and e.dtype in ("i32", "u32"):
            (al, ah), (bl, bh) = self.range(a[0]), self.range(a[1])
            if (ah <= bl) if op == "min" else (al >= bh):
                return a[0]
            if (bh <= al) if op == "min" else (bl >= ah):
                return a[1]
            return None
        if op == "clamp" and e.dtype in ("i32", "u32"):
            (xl, xh), (_, lh), (hl, _) = (self.range(x) for x in a)
            return a[0] if lh <= xl and xh <= hl else None
        if op in ("lt", "le", "gt", "ge", "eq", "ne") and a[0].dtype in ("i32", "u32"):
            return self.compare(op, self.range(a[0]), self.range(a[1]))
        if e.dtype != "i32":
            return None
        c = _const_int(a[1]) if len(a) == 2 else None
        if c is None or c <= 0:
            return None
        if op == "shr" and c < 31:
            return self.divide(a[0], 1 << c, "div")
        if op == "band" and c & (c + 1) == 0:
            return self.divide(a[0], c + 1, "mod")
        if op in ("div", "mod"):
            return self.divide(a[0], c, op)
        return None

    @staticmethod
    def compare(op, x, y) -> Expr | None:
        (xl, xh), (yl, yh) = x, y
        truth = {"lt": (xh < yl, xl >= yh), "le": (xh <= yl, xl > yh), "gt": (xl > yh, xh <= yl),
                 "ge": (xl >= yh, xh < yl), "eq": (xl == xh == yl == yh, xh < yl or yh < xl),
                 "ne": (xh < yl or yh < xl, xl == xh == yl == yh)}[op]
        if truth[0]:
            return kir.const(True, "bool")
        if truth[1]:
            return kir.const(False, "bool")
        return None

    def divide(self, x: Expr, c: int, op: str) -> Expr | None:
        """x / c or x % c (c > 0) by the quotient / remainder split, None where it does not apply."""
        lo, hi = self.range(x)
        if lo < 0 or hi > I32_MAX:
            return None
        inner = _const_int(x.args[1]) if x.op in ("div", "mod") else None
        if inner is not None and inner > 0 and self.range(x.args[0])[0] >= 0:
            if x.op == "div" and op == "div" and inner * c <= I32_MAX:     # (y / a) / c = y / (a c)
                return self.divide(x.args[0], inner * c, "div") or x.args[0] / kir.i32(inner * c)
            if x.op == "mod" and op == "mod" and inner % c == 0:            # (y % (a c)) % c = y % c
                return self.divide(x.args[0], c, op) or x.args[0] % kir.i32(c)
        lin = self.linear(x)
        if lin is None:
            return None
        terms, k0 = lin
        if sum(max(abs(v) for v in self.range(t)) * abs(k) for t, k in terms.items()) + abs(k0) > I32_MAX:
            return None
        quot = {t: k // c for t, k in terms.items() if k % c == 0}
        rest = {t: k for t, k in terms.items() if k % c}
        r_lo = r_hi = k0 % c
        for t, k in rest.items():
            tl, th = self.range(t)
            r_lo, r_hi = r_lo + min(tl * k, th * k), r_hi + max(tl * k, th * k)
        if r_lo < 0 or (r_hi >= c and not quot and k0 // c == 0):    # (nothing would come off)
            return None
        if r_hi >= c:       # (c Q + R) / c = Q + R / c and (c Q + R) % c = R % c, for R >= 0
            if op == "div":
                return _build(quot, k0 // c) + _build(rest, k0 % c) / kir.i32(c)
            return _build(rest, k0 % c) % kir.i32(c)
        if op == "div":
            return _build(quot, k0 // c)
        out = _build(rest, k0 % c)
        return None if out is x else out

    def linear(self, e: Expr) -> tuple[dict, int] | None:
        """e as ({atom: coefficient}, constant), every atom's range bounded; None if it is not."""
        if e.op == "const":
            return {}, int(e.attr)
        if e.op in ("add", "sub"):
            x, y = self.linear(e.args[0]), self.linear(e.args[1])
            if x is None or y is None:
                return None
            s = -1 if e.op == "sub" else 1
            terms = dict(x[0])
            for atom, k in y[0].items():
                terms[atom] = terms.get(atom, 0) + s * k
            return {t: k for t, k in terms.items() if k}, x[1] + s * y[1]
        if e.op == "mul" and (e.args[0].is_const or e.args[1].is_const):
            k, other = (e.args[0].attr, e.args[1]) if e.args[0].is_const else (e.args[1].attr, e.args[0])
            x = self.linear(other)
            if x is None:
                return None
            return ({t: c * k for t, c in x[0].items()} if k else {}), x[1] * k
        return ({e: 1}, 0) if self._bounded(e) else None


def _build(terms: dict, k0: int) -> Expr:
    """sum of k * atom, plus k0, in i32 (terms in their order of first appearance)."""
    out = None
    for t, k in terms.items():
        t = kir.cast(t, "i32")
        term = t if k == 1 else t * kir.i32(k)
        out = term if out is None else out + term
    if out is None:
        return kir.i32(k0)
    return out + kir.i32(k0) if k0 else out
