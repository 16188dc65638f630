"""Symbolic dims: small integer expressions of the model's symbolic input sizes.

A model declares some dims by name (`batch`, `seq`, `height`); a build bounds each
with a range (`--input-shape ids=1,1..512`, `--dim seq=1..512`) and carries it
through the compiler as a `Symbol`. Shapes are tuples of `int | Dim`, where a
`Dim` is an expression of symbols:

    Dim  := sum of  coeff * atom * atom * ...   (+ a constant)
    atom := Symbol | floor(Dim / Dim) | ceil(Dim / int) | Dim mod int | min(Dim, Dim) | max(Dim, Dim)

kept in a normal form (a polynomial over atoms), so equal sizes compare equal
(`seq*12*64 == seq*768`), exact divisions cancel (`(b*seq*768) // (b*seq) == 768`)
and a constant result is a plain int. Python arithmetic builds them, so most
shape rules work on symbolic shapes unchanged; a rule that needs a plain int
(`range(d)`, `int(d)`) or an order the bounds cannot decide raises
`SymbolicDimError`, which the compiler reports as "this op does not take a
symbolic dim yet".

Three consumers read a Dim (all in this one form, DESIGN.md "One build, many
deployments"): `bounds()` for planning at the maximum, `to_kir()` for a kernel
that reads the symbols from the dims buffer (`DIMS_BUFFER`, one i32 per
symbol, written per inference), and the schedule module's register arithmetic
(`module/registers.py`) for workgroup counts and output shapes. No computer
algebra library: this file is the whole of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DIMS_BUFFER = "__dims"      # the kernels' name of the per-inference parameter buffer


class SymbolicDimError(TypeError):
    """A symbolic dim used where a plain int (or a decidable order) is needed."""


@dataclass(frozen=True)
class Symbol:
    """A named input size with its declared range; `index` is its word in the dims buffer; `opt`
    the size kernels are tuned for (TensorRT's min / opt / max profile; memory is planned for hi)."""
    name: str
    index: int
    lo: int
    hi: int
    opt: int = 0

    def key(self):
        return (0, self.index, self.name)

    def __str__(self):
        return self.name


@dataclass(frozen=True)
class _Atom:
    """floor(a / b), ceil(a / b), a mod b (a >= 0, b a positive int), min(a, b) or max(a, b) of two
    Dims / ints (kind: 'floordiv' | 'ceildiv' | 'mod' | 'min' | 'max')."""
    kind: str
    a: object
    b: object

    def key(self):
        return (1, self.kind, _key(self.a), _key(self.b))

    def __str__(self):
        a = f"({self.a})" if isinstance(self.a, Dim) and len(self.a.terms) > 1 else str(self.a)
        if self.kind == "floordiv":
            return f"{a} // {self.b}"
        if self.kind == "ceildiv":
            return f"ceil({self.a} / {self.b})"
        if self.kind == "mod":
            return f"{a} % {self.b}"
        return f"{self.kind}({self.a}, {self.b})"


def _key(x):
    if isinstance(x, Dim):
        return (2, tuple((tuple(a.key() for a in m), c) for m, c in x.terms))
    return (3, x)


def _atom_bounds(atom) -> tuple:
    if isinstance(atom, Symbol):
        return atom.lo, atom.hi
    alo, ahi = bounds(atom.a)
    blo, bhi = bounds(atom.b)
    if atom.kind == "mod":
        return (0, blo - 1) if blo == bhi and alo >= 0 else (min(0, alo), max(ahi, bhi))
    if atom.kind in ("floordiv", "ceildiv"):
        if blo <= 0:
            raise SymbolicDimError(f"division by {atom.b}, which may be zero or negative")
        f = (lambda x, y: x // y) if atom.kind == "floordiv" else (lambda x, y: -(-x // y))
        cands = [f(x, y) for x in (alo, ahi) for y in (blo, bhi)]
        return min(cands), max(cands)
    if atom.kind == "min":
        return min(alo, blo), min(ahi, bhi)
    return max(alo, blo), max(ahi, bhi)


def _mul_interval(a, b):
    c = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
    return min(c), max(c)


def _norm(terms: dict):
    terms = {m: c for m, c in terms.items() if c}
    if not terms:
        return 0
    if set(terms) == {()}:
        return terms[()]
    d = Dim.__new__(Dim)
    d.terms = tuple(sorted(terms.items(), key=lambda mc: tuple(a.key() for a in mc[0])))
    d._hash = hash(_key(d))
    return d


def _terms(x) -> dict:
    if isinstance(x, Dim):
        return dict(x.terms)
    if isinstance(x, bool) or not isinstance(x, int):
        try:
            x = int(x)      # numpy integers
        except (TypeError, ValueError):
            raise SymbolicDimError(f"{x!r} is not a size") from None
    return {(): x} if x else {}


def _atom_dim(atom) -> "Dim":
    return _norm({(atom,): 1})


def symbol(name: str, index: int, lo: int, hi: int, opt: int | None = None) -> "Dim":
    """The Dim of one symbol (a size the model declares by name), in [lo, hi]; kernels are tuned
    for `opt` (default: a quarter of the largest size, a multiple of 8 above 16: tuned toward the
    long inputs, whose latency matters most; a short input is quick either way)."""
    lo, hi = int(lo), int(hi)
    if opt is None:
        opt = hi // 4
        if opt > 16:
            opt = opt // 8 * 8
    return _atom_dim(Symbol(name, index, lo, hi, min(max(int(opt), lo), hi)))


def typical(x) -> int:
    """A size's value with every symbol at its `opt` (what kernels are planned for)."""
    return evaluate(x, {s.name: s.opt for s in symbols_of(x)})


class Dim:
    """A non-constant size expression (operations return a plain int where the result is constant)."""

    __slots__ = ("terms", "_hash")

    def __hash__(self):
        return self._hash

    def __eq__(self, o):
        if isinstance(o, Dim):
            return self._hash == o._hash and _key(self) == _key(o)
        return False if isinstance(o, (int,)) or _is_int(o) else NotImplemented

    def __ne__(self, o):
        r = self.__eq__(o)
        return r if r is NotImplemented else not r

    def __repr__(self):
        return f"Dim({self})"

    def __str__(self):
        parts = []
        for m, c in sorted(self.terms, key=lambda mc: not mc[0]):     # the constant last
            body = "*".join(str(a) for a in m)
            parts.append(str(c) if not m else body if c == 1 else f"-{body}" if c == -1 else f"{c}*{body}")
        return " + ".join(parts).replace("+ -", "- ")

    # --- arithmetic (ints and Dims) ---------------------------------------------------
    def __add__(self, o):
        if not _is_size(o):
            return NotImplemented
        t = _terms(self)
        for m, c in _terms(o).items():
            t[m] = t.get(m, 0) + c
        return _norm(t)

    __radd__ = __add__

    def __neg__(self):
        return _norm({m: -c for m, c in self.terms})

    def __sub__(self, o):
        if not _is_size(o):
            return NotImplemented
        return self + (-o if isinstance(o, Dim) else -int(o))

    def __rsub__(self, o):
        if not _is_size(o):
            return NotImplemented
        return (-self) + o

    def __mul__(self, o):
        if not _is_size(o):
            return NotImplemented
        out: dict = {}
        for m1, c1 in self.terms:
            for m2, c2 in _terms(o).items():
                m = tuple(sorted(m1 + m2, key=lambda a: a.key()))
                out[m] = out.get(m, 0) + c1 * c2
        return _norm(out)

    __rmul__ = __mul__

    def __floordiv__(self, o):
        if not _is_size(o):
            return NotImplemented
        return floordiv(self, o)

    def __rfloordiv__(self, o):
        if not _is_size(o):
            return NotImplemented
        return floordiv(o, self)

    def __mod__(self, o):
        if not _is_size(o):
            return NotImplemented
        if not isinstance(o, Dim) and int(o) > 0 and bounds(self)[0] >= 0:
            c = int(o)
            rest = _norm({m: k % c for m, k in self.terms})   # multiples of c drop out
            if not isinstance(rest, Dim):
                return rest % c
            return _atom_dim(_Atom("mod", rest, c))
        return self - o * floordiv(self, o)

    def __rmod__(self, o):
        if not _is_size(o):
            return NotImplemented
        return o - self * floordiv(o, self)

    # --- orders the bounds decide -----------------------------------------------------
    def _decide(self, o, op, name):
        lo, hi = bounds(self - o)
        if op(lo, 0) and op(hi, 0):
            return True
        if not op(lo, 0) and not op(hi, 0):
            return False
        raise SymbolicDimError(f"cannot decide whether {self} {name} {o} for every size in the declared ranges")

    def __lt__(self, o):
        return self._decide(o, lambda v, z: v < z, "<") if _is_size(o) else NotImplemented

    def __le__(self, o):
        return self._decide(o, lambda v, z: v <= z, "<=") if _is_size(o) else NotImplemented

    def __gt__(self, o):
        return self._decide(o, lambda v, z: v > z, ">") if _is_size(o) else NotImplemented

    def __ge__(self, o):
        return self._decide(o, lambda v, z: v >= z, ">=") if _is_size(o) else NotImplemented

    def __bool__(self):
        return self._decide(0, lambda v, z: v != z, "!=")

    def __int__(self):
        raise SymbolicDimError(f"the symbolic size {self} is used where a fixed size is needed")

    __index__ = __int__

    def __float__(self):
        raise SymbolicDimError(f"the symbolic size {self} is used where a fixed size is needed")

    # --- readers ---------------------------------------------------------------------
    def symbols(self) -> list[Symbol]:
        return symbols_of(self)

    def __kir__(self):
        return to_kir(self)


def _is_int(x) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    return type(x).__module__ == "numpy" and hasattr(x, "dtype") and x.dtype.kind in "iu" and getattr(x, "ndim", 0) == 0


def _is_size(x) -> bool:
    return isinstance(x, Dim) or _is_int(x)


def is_dim(x) -> bool:
    """True for a symbolic (non-constant) size."""
    return isinstance(x, Dim)


def is_static(shape) -> bool:
    return not any(isinstance(d, Dim) for d in shape)


def floordiv(a, b):
    """floor(a / b), simplified: exact divisions cancel, a multiple of b splits off."""
    if not isinstance(a, Dim) and not isinstance(b, Dim):
        return int(a) // int(b)
    if isinstance(b, Dim):
        q = _exact_div(a, b)
        if q is not None:
            return q
        return _atom_dim(_Atom("floordiv", a, b))
    b = int(b)
    if b == 0:
        raise SymbolicDimError(f"division of {a} by zero")
    if b == 1:
        return a
    if b < 0:
        return floordiv(-a, -b)
    whole, rest = {}, {}
    for m, c in _terms(a).items():
        (whole if c % b == 0 else rest)[m] = c
    q = _norm({m: c // b for m, c in whole.items()})
    rest = _norm(rest)
    if not isinstance(rest, Dim):
        return q + rest // b
    if all(c <= 0 for _, c in rest.terms):            # floor(-x / b) = -ceil(x / b)
        return q - _atom_dim(_Atom("ceildiv", -rest, b))
    return q + _atom_dim(_Atom("floordiv", rest, b))


def ceildiv(a, b):
    """ceil(a / b) for a positive int or Dim b."""
    return -floordiv(-a, b)


def _exact_div(a, b: "Dim"):
    """a / b when b is one monomial that divides every term of a exactly, else None."""
    if len(b.terms) != 1:
        if a == b:
            return 1
        return None
    (bm, bc), = b.terms
    out = {}
    for m, c in _terms(a).items():
        rest = list(m)
        for atom in bm:
            if atom not in rest:
                return None
            rest.remove(atom)
        if c % bc:
            return None
        out[tuple(rest)] = c // bc
    return _norm(out)


def dmin(a, b):
    if not isinstance(a, Dim) and not isinstance(b, Dim):
        return min(int(a), int(b))
    if a == b:
        return a
    try:
        return a if a <= b else b
    except SymbolicDimError:
        return _atom_dim(_Atom("min", *sorted((a, b), key=_key)))


def dmax(a, b):
    if not isinstance(a, Dim) and not isinstance(b, Dim):
        return max(int(a), int(b))
    if a == b:
        return a
    try:
        return a if a >= b else b
    except SymbolicDimError:
        return _atom_dim(_Atom("max", *sorted((a, b), key=_key)))


def bounds(x) -> tuple[int, int]:
    """(smallest, largest) value of a size over the declared ranges (interval arithmetic: exact
    for sums and products of symbols with non-negative ranges, a safe over-estimate otherwise)."""
    if not isinstance(x, Dim):
        return int(x), int(x)
    lo = hi = 0
    for m, c in x.terms:
        iv = (1, 1)
        for atom in m:
            iv = _mul_interval(iv, _atom_bounds(atom))
        iv = _mul_interval(iv, (c, c))
        lo, hi = lo + iv[0], hi + iv[1]
    return lo, hi


def upper(x) -> int:
    """The largest value a size takes (what memory is planned for)."""
    return bounds(x)[1]


def lower_bound(x) -> int:
    return bounds(x)[0]


def upper_shape(shape) -> tuple:
    return tuple(upper(d) for d in shape)


def symbols_of(x) -> list[Symbol]:
    out: list[Symbol] = []

    def visit(v):
        if isinstance(v, Dim):
            for m, _ in v.terms:
                for atom in m:
                    if isinstance(atom, Symbol):
                        if atom not in out:
                            out.append(atom)
                    else:
                        visit(atom.a)
                        visit(atom.b)
    visit(x)
    return out


def evaluate(x, env: dict) -> int:
    """The value of a size given each symbol's value (env: symbol name -> int)."""
    if not isinstance(x, Dim):
        return int(x)
    total = 0
    for m, c in x.terms:
        v = c
        for atom in m:
            v *= _eval_atom(atom, env)
        total += v
    return total


def _eval_atom(atom, env):
    if isinstance(atom, Symbol):
        return int(env[atom.name])
    a, b = evaluate(atom.a, env), evaluate(atom.b, env)
    if atom.kind == "mod":
        return a % b
    if atom.kind == "floordiv":
        return a // b
    if atom.kind == "ceildiv":
        return -(-a // b)
    return min(a, b) if atom.kind == "min" else max(a, b)


def to_kir(x):
    """The kernel-IR (i32) expression of a size: symbols read from the dims buffer."""
    from . import kir
    if not isinstance(x, Dim):
        return kir.i32(int(x))
    total = kir.i32(0)
    for m, c in x.terms:
        term = kir.i32(c)
        for atom in m:
            term = term * _atom_kir(atom)
        total = total + term
    return total


def _atom_kir(atom):
    from . import kir
    if isinstance(atom, Symbol):
        return kir.load(DIMS_BUFFER, kir.i32(atom.index), "i32")
    a, b = to_kir(atom.a), to_kir(atom.b)
    if atom.kind == "mod":          # of a non-negative size by a positive int: WGSL's % agrees
        return a % b
    if atom.kind in ("floordiv", "ceildiv"):
        if lower_bound(atom.a) < 0:
            # floor division of a possibly negative value (WGSL's / truncates)
            q = a / b
            inexact = kir.binary("ne", q * b, a)
            q = kir.select(kir.binary("and", inexact, a < 0), q - 1, q) if atom.kind == "floordiv" \
                else kir.select(kir.binary("and", inexact, a > 0), q + 1, q)
            return q
        return a / b if atom.kind == "floordiv" else (a + b - 1) / b
    return kir.minimum(a, b) if atom.kind == "min" else kir.maximum(a, b)


def provably(test) -> bool:
    """test() where the bounds decide it, False where they cannot (a kernel builder's safe
    default: `provably(lambda: last_window_end <= size)` skips a bounds check only when sure)."""
    try:
        return bool(test())
    except SymbolicDimError:
        return False


def fmt(shape) -> str:
    """A shape for messages: (1, seq, 768)."""
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
