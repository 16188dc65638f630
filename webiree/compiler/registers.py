"""The schedule module's register arithmetic, written from symbolic sizes (ir/sym.py).

A dynamic module starts with one LOAD_DIM per symbol (symbol k is register k,
read from the first input dim that declares it); every size a runtime needs
per run — a dispatch's workgroup counts, an output's dims — is then a
register computed by SET_REG / ARITH from those, each sub-expression once.
"""

from __future__ import annotations

from ..ir.sym import Dim, Symbol
from ..module import format as F


class Registers:
    def __init__(self, symbols: list[Symbol], inputs: list):
        """inputs: [(input index, shape)] with the symbols' Dims in their shapes."""
        self.commands: list[tuple] = []
        self.count = len(symbols)
        self._of: dict = {}
        for s in symbols:
            where = next(((i, axis) for i, shape in inputs for axis, d in enumerate(shape)
                          if isinstance(d, Dim) and d.terms == (((s,), 1),)), None)
            if where is None:
                raise ValueError(f"symbol {s.name} is the size of no input dim")
            self.commands.append((F.OP_LOAD_DIM, s.index, *where))
            self._of[("sym", s.name)] = s.index

    def _new(self) -> int:
        self.count += 1
        return self.count - 1

    def const(self, v: int) -> int:
        key = ("const", int(v))
        if key not in self._of:
            if v < 0:
                r = self._new()
                self.commands.append((F.OP_ARITH, F.ARITH_OPS.index("sub"), r, self.const(0), self.const(-v)))
            else:
                r = self._new()
                self.commands.append((F.OP_SET_REG, r, int(v)))
            self._of[key] = r
        return self._of[key]

    def _arith(self, op: str, a: int, b: int) -> int:
        key = (op, a, b)
        if key not in self._of:
            r = self._new()
            self.commands.append((F.OP_ARITH, F.ARITH_OPS.index(op), r, a, b))
            self._of[key] = r
        return self._of[key]

    def of(self, x) -> int:
        """The register holding size `x` (an int or a Dim) in every run."""
        if not isinstance(x, Dim):
            return self.const(int(x))
        total = None
        for m, c in x.terms:
            term = None
            for atom in m:
                r = self._atom(atom)
                term = r if term is None else self._arith("mul", term, r)
            if term is None:
                term = self.const(abs(c))
            elif abs(c) != 1:
                term = self._arith("mul", term, self.const(abs(c)))
            if total is None:
                total = term if c > 0 else self._arith("sub", self.const(0), term)
            else:
                total = self._arith("add" if c > 0 else "sub", total, term)
        return total

    def _atom(self, atom) -> int:
        if isinstance(atom, Symbol):
            return self._of[("sym", atom.name)]
        if atom.kind == "mod":      # a - b * floor(a / b)
            a, b = self.of(atom.a), self.of(atom.b)
            return self._arith("sub", a, self._arith("mul", b, self._arith("div_floor", a, b)))
        op = {"floordiv": "div_floor", "ceildiv": "div_ceil", "min": "min", "max": "max"}[atom.kind]
        return self._arith(op, self.of(atom.a), self.of(atom.b))
