"""More canonical op kinds (beside program.py's), each with its builder in
wgsl_codegen/kernels_extra.py.

- `Loop`  a general sequential fold per output element:

      accs = inits(o)
      for k in 0 .. count-1:  accs = updates(o, k, accs)     (all updated at once)
      out[o] = result(o, accs)

  Ops whose every output element is a fold over a known number of steps lower
  to it: cumulative sums and products, scatters (the updates in order, so
  duplicates and reductions are exact), ConvTranspose, Col2Im and DeformConv
  (the input positions that reach an output), RoiAlign's samples, DFT and
  STFT, Einsum, TopK's rank counting, MaxPool's argmax, MaxUnpool (see
  compiler/ops/loops.py). Expressions read tensors with `load(tensor, index)` like
  Generic's and use the vars `LOOP_K` and `acc_vars(...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..wgsl_codegen import kir
from ..wgsl_codegen.kir import Expr
from .program import Anchor, _expr_reads

LOOP_K = kir.var("k", "i32")      # the step index inside a Loop's updates


def acc_vars(dtypes) -> list[Expr]:
    """The accumulators of a Loop with these element types (vars la0, la1, ...)."""
    return [kir.var(f"la{i}", dt) for i, dt in enumerate(dtypes)]


@dataclass
class Loop(Anchor):
    count: int = 0
    dtypes: list = field(default_factory=list)     # accumulator types
    inits: list = field(default_factory=list)      # Expr of o, one per accumulator
    updates: list = field(default_factory=list)    # Expr of o, LOOP_K and the accumulators
    result: Expr | None = None                     # Expr of o and the accumulators

    def inputs(self):
        return []

    def reads(self):
        out = []
        for e in list(self.inits) + list(self.updates) + [self.result, self.epilogue]:
            for r in _expr_reads(e):
                if r not in out:
                    out.append(r)
        return out
