"""What every kernel family shares: the dispatch record, the binding table (`Binder`),
the kernel configuration, grid folding, invocation ids, epilogues and window loops.

Conventions: bindings are named b0, b1, ... in slot order; the output is the
last binding; every index is i32; the 1-D workgroup id is folded over
(x, y) so grids above 65,535 workgroups still launch."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import NamedTuple

from ...ir import program as P
from ...ir.program import O
from ...ir import kir
from ...ir.kir import For, If, Let, f32, i32, lvar
from ...errors import LimitsError
from ...ir.sym import DIMS_BUFFER, Dim, ceildiv, dmin, provably, upper


class Strategy(str, enum.Enum):
    """Every kernel variant, by family (the value is the name recorded in the module)."""
    ELEMENTWISE = "elementwise"                  # Generic, Loop: one invocation per output element
    SUBGROUP_BROADCAST = "subgroup-broadcast"    # matmul, CPU adapters with subgroups
    REGISTER_BLOCKED = "register-blocked"        # matmul, CPU adapters
    SPLIT_K = "split-k"                          # matmul, GPUs: small output, long K
    TILED_SHARED_VEC4 = "tiled-shared-vec4"      # matmul, GPUs: vec4 tiles in workgroup memory
    TILED_SHARED = "tiled-shared"                # matmul, GPUs: scalar tiles in workgroup memory
    DIRECT = "direct"                            # conv: a block of output channels per invocation
    ROW_BLOCK = "row-block"                      # conv, CPU adapters: outputs of a row per invocation
    WINDOW = "window"                            # pool: one invocation per output
    WORKGROUP_TREE = "workgroup-tree"            # reduce, softmax, layernorm: a row per workgroup
    ROW_PER_INVOCATION = "row-per-invocation"    # softmax, layernorm, CPU adapters


class MatmulTile(NamedTuple):
    """An invocation's register block: `rows` rows x `cols` column slots (a slot is one column,
    or a vec4 of 4 with vector 4), and the K step (subgroup-broadcast: 4 x the subgroup size;
    split-k: the K values a slice loads at once)."""
    rows: int
    cols: int
    k_step: int


class ConvTile(NamedTuple):
    out_channels: int            # direct: output channels one invocation computes


class RowBlockTile(NamedTuple):
    rows: int                    # row-block: output rows and
    width: int                   # consecutive outputs of a row one invocation computes


TILES = {Strategy.SUBGROUP_BROADCAST: MatmulTile, Strategy.REGISTER_BLOCKED: MatmulTile,
         Strategy.SPLIT_K: MatmulTile, Strategy.TILED_SHARED_VEC4: MatmulTile, Strategy.TILED_SHARED: MatmulTile,
         Strategy.DIRECT: ConvTile, Strategy.ROW_BLOCK: RowBlockTile}


@dataclass
class KernelConfig:
    """How one dispatch is built: chosen once by config.choose (or a tuning table), only read by
    the builders. The tile is the strategy's own named tuple (TILES); plain tuples and strategy
    names, as a tuning table or a benchmark writes them, are converted."""
    workgroup_size: tuple[int, int, int]
    tile: tuple = ()
    vector: int = 1
    strategy: Strategy = Strategy.ELEMENTWISE

    def __post_init__(self):
        self.strategy = Strategy(self.strategy)
        if self.strategy in TILES:
            self.tile = TILES[self.strategy](*self.tile)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["strategy"] = self.strategy.value
        d["tile"] = tuple(self.tile)
        return d


NEG_INF = float("-inf")


@dataclass
class Dispatch:
    name: str
    kind: str
    nodes: list[str]
    kernel: kir.Kernel
    config: KernelConfig
    grid: tuple[int, int, int]
    tensors: list[str]          # tensor bound at each slot (slot i <-> b{i})


class Binder:
    """Assigns binding slots to tensors and renames loads in expressions.

    A tensor may be bound twice: as its scalar array and as array<vec4<f32>>
    (`vec=True`) for wide loads and stores."""

    def __init__(self, prog: P.Program, prologues: dict | None = None):
        self.prog = prog
        self.prologues = prologues or {}
        self.slots: list[tuple[str, bool]] = []

    def name(self, tensor: str, vec: bool = False) -> str:
        key = (self.prog.root(tensor), vec)
        if key not in self.slots:
            self.slots.append(key)
        return f"b{self.slots.index(key)}"

    def dtype(self, tensor: str) -> str:
        """Element type of an input, also when a fused prologue computes it."""
        if tensor in self.prologues:
            return self.prologues[tensor].dtype
        return self.prog.tensors[self.prog.root(tensor)].dtype

    def load(self, tensor: str, index) -> kir.Expr:
        """Element `index` of an input: from its buffer, or computed by its fused prologue."""
        index = kir.as_expr(index, "i32")
        if tensor in self.prologues:
            return kir.substitute(self.expr(self.prologues[tensor]), {O: index})
        return kir.load(self.name(tensor), index, self.dtype(tensor))

    def load4(self, tensor: str, index4) -> kir.Expr:
        """Elements 4*index4 .. 4*index4+3 of an f32 tensor as one vec4f (four computed
        elements where a fused prologue produces the tensor)."""
        index4 = kir.as_expr(index4, "i32")
        if tensor in self.prologues:
            return kir.vec4(*(self.load(tensor, index4 * 4 + q) for q in range(4)))
        return kir.load(self.name(tensor, vec=True), index4, "vec4f")

    def expr(self, e: kir.Expr) -> kir.Expr:
        """A compiler expression (loads name tensors) with loads of binding slots instead."""
        def fn(node):
            if node.op == "load":
                return kir.load(self.name(node.attr), kir.substitute(node.args[0], {"__fn__": fn}), node.dtype)
            return None
        return kir.substitute(e, {"__fn__": fn})

    def bindings(self, out: str) -> list[kir.Binding]:
        out = self.prog.root(out)
        if not any(t == out for t, _ in self.slots):
            self.name(out)
        return [kir.Binding(i, f"b{i}", "vec4f" if vec else self.prog.tensors[t].dtype, writes=(t == out),
                            readonly=self.prog.tensors[t].kind == "params")
                for i, (t, vec) in enumerate(self.slots)]

    def bind_dims(self, body: list) -> list:
        """`body` with the symbolic sizes' loads of the dims buffer (ir/sym.py) bound to a slot."""
        found = []

        def fn(node):
            if node.op == "load" and node.attr == DIMS_BUFFER:
                found.append(node)
                return kir.load(self.name(DIMS_BUFFER), node.args[0], node.dtype)
            return None
        cache: dict = {}
        out = kir.map_exprs(body, lambda e: kir.substitute(e, {"__fn__": fn}, cache))
        return out if found else body

    @property
    def tensors(self) -> list[str]:
        return [t for t, _ in self.slots]


def grid_for(n_groups, limits: dict) -> tuple:
    """(x, y, 1) workgroups covering n_groups (folded over y above the per-dimension cap); for a
    symbolic count the same folding as size expressions (the module computes them per run)."""
    cap = limits["max_compute_workgroups_per_dimension"]
    if isinstance(n_groups, Dim):
        if upper(n_groups) <= cap:
            return (n_groups, 1, 1)
        if upper(ceildiv(n_groups, cap)) > cap:
            raise LimitsError(f"up to {upper(n_groups)} workgroups exceed {cap}x{cap}",
                              hint="declare a smaller range for the input's symbolic dims")
        gx = dmin(n_groups, cap)
        return (gx, ceildiv(n_groups, gx), 1)
    n_groups = max(n_groups, 1)
    gx = min(n_groups, cap)
    gy = -(-n_groups // gx)
    if gy > cap:
        raise LimitsError(f"{n_groups} workgroups exceed {cap}x{cap}", hint="use a smaller input shape")
    return (gx, gy, 1)


def linear_wid() -> kir.Expr:
    return kir.cast(kir.WID[1] * kir.NWG[0] + kir.WID[0], "i32")


def lid(axis: int = 0) -> kir.Expr:
    return kir.cast(kir.LID[axis], "i32")


def epilogue(op: P.Anchor, b: Binder, acc: kir.Expr, o: kir.Expr) -> kir.Expr:
    """The anchor's result for one element after its fused epilogue."""
    if op.epilogue is None:
        return acc
    return kir.substitute(b.expr(op.epilogue), {P.acc_var(acc.dtype): acc, O: o})


def window_loops(kdims, strides, dilations, pads, in_sp, out_coords, inner_fn, out_sp=None, unroll_max=3):
    """Nested loops over a window; inner_fn(positions, kernel_coords) gives the innermost body.
    Positions outside the input are skipped (no check where a dim's windows always fit)."""
    nd = len(kdims)

    def level(d, pos, kc):
        if d == nd:
            return inner_fn(pos, kc)
        kv = lvar(f"k{d}", "i32")
        p = out_coords[d] * strides[d] - pads[d] + kv * dilations[d]
        always_inside = out_sp is not None and pads[d] == 0 and provably(
            lambda: (out_sp[d] - 1) * strides[d] + (kdims[d] - 1) * dilations[d] <= in_sp[d] - 1)
        inner = level(d + 1, pos + [lvar(f"p{d}", "i32")], kc + [kv])
        body = [Let(f"p{d}", p)] + (inner if always_inside else [
            If(kir.binary("and", lvar(f"p{d}", "i32") >= 0, lvar(f"p{d}", "i32") < in_sp[d]), inner)])
        return [For(f"k{d}", i32(0), i32(kdims[d]), body, unroll=kdims[d] <= unroll_max)]
    return level(0, [], [])
