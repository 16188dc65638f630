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
from ...ir.program import O, numel
from ...ir import kir, packing
from ...ir.kir import For, If, Let, f32, i32, lvar
from ...errors import CompilerBug, LimitsError
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
    DEPTHWISE_SHARED = "depthwise-shared"        # depthwise conv, GPUs: the input window in workgroup memory
    WINDOW = "window"                            # pool: one invocation per output
    WORKGROUP_TREE = "workgroup-tree"            # reduce, softmax, layernorm: a row per workgroup
    ROW_PER_INVOCATION = "row-per-invocation"    # softmax, layernorm, CPU adapters
    RANGE_PACK = "range-pack"                    # DynamicQuantizeLinear's range + words (QuantizeWords)
    CHAIN_SHARED = "chain-shared"                # MatMulChain: rows of the intermediate in workgroup memory
    CHAIN_SUBGROUP = "chain-subgroup"            # MatMulChain, CPU adapters with subgroups: A broadcast
    ATTENTION_ONLINE = "attention-online"        # Attention: a query row per invocation, blocks of keys
    ATTENTION_SUBGROUP = "attention-subgroup"    # Attention, CPU adapters with subgroups: K, V broadcast


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


class DepthwiseTile(NamedTuple):
    rows: int                    # depthwise-shared: output rows and
    width: int                   # consecutive outputs of each row one invocation computes


class ChainTile(NamedTuple):
    rows: int                    # chain-shared, chain-subgroup: rows of A a workgroup owns,
    cols: int                    # vec4 column slots an invocation computes at once,
    slices: int                  # parts of H the second product's invocations split (partial sums),
    unroll: int                  # vec4s of K (of H) a loop iteration takes,
    parts: int = 1               # chain-subgroup: parts of H computed one after the other


class AttentionTile(NamedTuple):
    keys: int                    # keys a block (attention-online: a split's, in workgroup memory),
    splits: int = 1              # attention-online: invocations a row, each a part of every block


class PackTile(NamedTuple):
    words: int                   # range-pack: words one invocation packs


TILES = {Strategy.SUBGROUP_BROADCAST: MatmulTile, Strategy.REGISTER_BLOCKED: MatmulTile,
         Strategy.SPLIT_K: MatmulTile, Strategy.TILED_SHARED_VEC4: MatmulTile, Strategy.TILED_SHARED: MatmulTile,
         Strategy.DIRECT: ConvTile, Strategy.ROW_BLOCK: RowBlockTile, Strategy.DEPTHWISE_SHARED: DepthwiseTile,
         Strategy.RANGE_PACK: PackTile,
         Strategy.CHAIN_SHARED: ChainTile, Strategy.CHAIN_SUBGROUP: ChainTile,
         Strategy.ATTENTION_ONLINE: AttentionTile, Strategy.ATTENTION_SUBGROUP: AttentionTile}


@dataclass
class KernelConfig:
    """How one dispatch is built: chosen once by config.choose (or a tuning table), only read by
    the builders. The tile is the strategy's own named tuple (TILES); plain tuples and strategy
    names, as a tuning table or a benchmark writes them, are converted."""
    workgroup_size: tuple[int, int, int]
    tile: tuple = ()
    vector: int = 1
    strategy: Strategy = Strategy.ELEMENTWISE
    # a dynamic build's variant for the runs whose symbolic N is a multiple of 4 (vec4 rows): the
    # kernel holds both and branches on the size, uniformly (kernels/matmul.py build_matmul)
    aligned: "KernelConfig | None" = None

    def __post_init__(self):
        self.strategy = Strategy(self.strategy)
        if self.strategy in TILES:
            self.tile = TILES[self.strategy](*self.tile)
        if isinstance(self.aligned, dict):
            self.aligned = KernelConfig(**self.aligned)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["strategy"] = self.strategy.value
        d["tile"] = tuple(self.tile)
        if self.aligned is None:
            d.pop("aligned")
        else:
            d["aligned"] = self.aligned.as_dict()
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

    A tensor is bound as its scalar array or as array<vec4<f32>> (`vec=True`) for wide loads
    and stores, never both (`bound_scalar`). A constant stored in a narrow form
    (`Tensor.pack`, ir/packing.py) is bound as array<u32> and decoded where it is read;
    the small constants share one binding, the constant table (compiler/memory.py)."""

    def __init__(self, prog: P.Program, prologues: dict | None = None):
        self.prog = prog
        self.prologues = prologues or {}
        self.slots: list[tuple[str, bool]] = []
        self.also_written: set[str] = set()     # tensors the kernel stores to besides its output

    def name(self, tensor: str, vec: bool = False) -> str:
        root = self.prog.root(tensor)
        t = self.prog.tensors.get(root)
        if t is not None and t.table_word is not None:
            root = P.CONST_TABLE        # every small constant: one binding of the table
        key = (root, vec)
        if key not in self.slots:
            self.slots.append(key)
        return f"b{self.slots.index(key)}"

    def bound_scalar(self, tensor: str) -> bool:
        """Whether the tensor already has its scalar binding: then it gets no vec4 one (WebGPU
        rejects two writable storage bindings of one byte range in a dispatch, and every tensor
        binding is read_write): a kernel versioned on a symbolic N (matmul.py) reads and writes
        its vec4 body's values through the scalar body's bindings."""
        return (self.prog.root(tensor), False) in self.slots

    def _read(self, tensor: str, index: kir.Expr, dtype: str) -> kir.Expr:
        """A buffer read of one element: a plain load, or the decode of a packed constant or of a
        small constant's words in the constant table (compiler/memory.py)."""
        t = self.prog.tensors[self.prog.root(tensor)]
        if t.table_word is not None:
            return packing.load(self.name(tensor), index, t.pack, dtype, t.table_word)
        if t.pack is not None:
            return packing.load(self.name(tensor), index, t.pack, dtype)
        return kir.load(self.name(tensor), index, dtype)

    def dtype(self, tensor: str) -> str:
        """Element type of an input, also when a fused prologue computes it."""
        if tensor in self.prologues:
            return self.prologues[tensor].dtype
        return self.prog.tensors[self.prog.root(tensor)].dtype

    def load(self, tensor: str, index, radix=None) -> kir.Expr:
        """Element `index` of an input: from its buffer, or computed by its fused prologue.
        radix: what the builder knows of index, [(coordinate, size), ...] outermost first with
        index = (c0 * s1 + c1) * s2 + c2 ...: the prologue's divisions of its index by those
        sizes (its coordinates) become the coordinates themselves, so a transposed or reshaped
        operand costs no division (a symbolic size would make each one real)."""
        index = kir.as_expr(index, "i32")
        if tensor in self.prologues:
            mapping = {O: index}
            if radix:
                mapping.update(radix_rules(radix))
            # the index goes in before the prologue's loads are decoded, so a packed operand's
            # word of four lanes (index x * 4 + q) is one load, not four (packing._split)
            return self.expr(kir.substitute(self.prologues[tensor], mapping))
        return self._read(tensor, index, self.dtype(tensor))

    def load4(self, tensor: str, index4, radix=None) -> kir.Expr:
        """Elements 4*index4 .. 4*index4+3 of an f32 tensor as one vec4f (four computed
        elements where a fused prologue produces the tensor). radix: index4's coordinates, as
        `load` takes them, the last one counting vec4s (a row's per-channel scale of a computed
        operand is then read once for the four, not once per lane)."""
        index4 = kir.as_expr(index4, "i32")
        t = self.prog.tensors[self.prog.root(tensor)] if tensor not in self.prologues else None
        if t is None or t.pack is not None or t.table_word is not None or self.bound_scalar(tensor):
            def lane_radix(q):
                if not radix:
                    return None
                c, s = radix[-1]
                return list(radix[:-1]) + [(c * 4 + q, s * 4)]
            return kir.vec4(*(self.load(tensor, index4 * 4 + q, lane_radix(q)) for q in range(4)))
        return kir.load(self.name(tensor, vec=True), index4, "vec4f")

    def load4u(self, tensor: str, index4) -> kir.Expr:
        """Words 4*index4 .. 4*index4+3 of a stored u32 tensor as one vec4u (its lanes are u32)."""
        t = self.prog.tensors[self.prog.root(tensor)]
        if t.dtype != "u32" or t.pack is not None or t.table_word is not None or tensor in self.prologues:
            raise CompilerBug(f"{tensor!r} is not a stored u32 tensor; it cannot be read as vec4<u32>")
        return kir.load(self.name(tensor, vec=True), kir.as_expr(index4, "i32"), "vec4u")

    def expr(self, e: kir.Expr) -> kir.Expr:
        """A compiler expression (loads name tensors) with loads of binding slots instead (the
        dims buffer's stay by name: bind_dims reads them once per kernel)."""
        def fn(node):
            if node.op == "load" and node.attr != DIMS_BUFFER:
                return self._read(node.attr, kir.substitute(node.args[0], {"__fn__": fn}), node.dtype)
            return None
        return kir.substitute(e, {"__fn__": fn})

    def bindings(self, out: str) -> list[kir.Binding]:
        out = self.prog.root(out)
        if not any(t == out for t, _ in self.slots):
            self.name(out)
        tensors = self.prog.tensors
        def dtype(t, vec):
            if vec:     # a packed constant's vec4 binding holds its words (matmul._half_pairs)
                return "vec4u" if tensors[t].dtype == "u32" or tensors[t].pack else "vec4f"
            return "u32" if tensors[t].pack else tensors[t].dtype
        return [kir.Binding(i, f"b{i}", dtype(t, vec),
                            writes=(t == out or t in self.also_written),
                            uniform=numel(tensors[t].shape) if tensors[t].kind == "params" else 0)
                for i, (t, vec) in enumerate(self.slots)]

    def bind_dims(self, body: list) -> list:
        """`body` with the symbolic sizes (ir/sym.py) read from the dims buffer once, at the top
        (`let dim0 = b<slot>[0];`): values read in a loop would be reloaded there (the compiler
        cannot tell the buffer is not written), and each size's arithmetic with them."""
        sizes: dict = {}        # size expression -> its let (in order of first use)
        memo: dict = {}

        def is_size(node) -> bool:      # only constants and the dims buffer's words, computed
            if node not in memo:
                memo[node] = node.op == "const" or (node.op == "load" and node.attr == DIMS_BUFFER) or (
                    node.op in _SIZE_OPS and node.dtype == "i32" and all(is_size(a) for a in node.args))
            return memo[node]

        def fn(node):   # top-down: the largest size expression is taken whole
            if node.op != "const" and is_size(node):
                if node not in sizes:
                    sizes[node] = f"sz{len(sizes)}"
                return lvar(sizes[node], "i32")
            return None
        cache: dict = {}
        out = kir.map_exprs(body, lambda e: kir.substitute(e, {"__fn__": fn}, cache))
        if not sizes:
            return body
        slot = self.name(DIMS_BUFFER)
        lets = []
        for node, name in sizes.items():   # each size once, at the top, from the buffer's words
            lets.append(Let(name, kir.substitute(node, {"__fn__": lambda n: kir.load(slot, n.args[0], "i32")
                                                         if n.op == "load" and n.attr == DIMS_BUFFER else None})))
        return lets + out

    @property
    def tensors(self) -> list[str]:
        return [t for t, _ in self.slots]


_SIZE_OPS = {"add", "sub", "mul", "div", "mod", "min", "max", "neg"}


def radix_rules(radix) -> dict:
    """Substitutions for an index o = (c0 * s1 + c1) * s2 + ... (radix = [(c_j, s_j)], 0 <= c_j <
    s_j for j > 0): o // P -> the prefix, o % P -> the suffix, (o // P') % s_j -> c_j, for the
    suffix products P (kir nodes are hash-consed, so these match the expressions coords_of wrote)."""
    rules = {}
    n = len(radix)
    for j in range(1, n):
        p = 1
        for _, s in radix[j:]:
            p = p * s
        prefix, suffix = radix[0][0], i32(0)
        for c, s in radix[1:j]:
            prefix = prefix * s + c
        for c, s in radix[j:]:
            suffix = suffix * s + c
        pk = kir.as_expr(p, "i32")
        _rule(rules, kir.binary("div", O, pk), prefix)
        _rule(rules, kir.binary("mod", O, pk), suffix)
        inner = 1
        for _, s in radix[j + 1:]:
            inner = inner * s
        c, s = radix[j]
        below = O if inner == 1 else kir.binary("div", O, kir.as_expr(inner, "i32"))
        _rule(rules, kir.binary("mod", below, kir.as_expr(s, "i32")), c)
    return rules


def _rule(rules: dict, key: kir.Expr, value: kir.Expr) -> None:
    """Add key -> value unless construction folded the key (o // 1 is o itself and o % 1 the
    constant 0: replacing those would rewrite every use of o or of 0)."""
    if key.op in ("div", "mod") and key not in rules:
        rules[key] = value


def arrays_bytes(shared) -> int:
    """Workgroup memory of kir.SharedArrays (every element is 4 bytes; vectors count their lanes)."""
    return sum(4 * (4 if str(a.dtype).startswith("vec4") else 1) * int(a.size) for a in shared)


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


def batch_indices(batch: tuple, *shapes) -> tuple:
    """(workgroup z as i32, then for each operand's batch dims in `shapes` its flat batch index):
    workgroup z walks the output's `batch` dims, and an operand broadcasts along its dims of 1 and
    the dims it lacks (numpy's rule, as MatMul's)."""
    bz = kir.cast(kir.WID[2], "i32")
    coords = P.coords_of(bz, batch) if batch else []

    def index(shape):
        if not shape:
            return kir.i32(0)
        k = len(batch) - len(shape)
        return P.flat_of([kir.i32(0) if shape[i] == 1 else coords[k + i] for i in range(len(shape))], shape)
    return (bz, *(index(s) for s in shapes))


def linear_wid() -> kir.Expr:
    return kir.cast(kir.WID[1] * kir.NWG[0] + kir.WID[0], "i32")


def lid(axis: int = 0) -> kir.Expr:
    return kir.cast(kir.LID[axis], "i32")


def epilogue(op: P.Anchor, b: Binder, acc: kir.Expr, o: kir.Expr, splits=()) -> kir.Expr:
    """The anchor's result for one element after its fused epilogue. splits: what the builder
    knows of o, as (quotient, remainder, divisor) with o = quotient * divisor + remainder and
    0 <= remainder < divisor (a matmul's row and column): the epilogue's o // divisor and
    o % divisor become those, so a bias read costs no division (a symbolic divisor would make it
    a real one, per element)."""
    return apply_epilogue(op.epilogue, b, acc, o, splits)


def apply_epilogue(expr: kir.Expr | None, b: Binder, acc: kir.Expr, o: kir.Expr, splits=(), radix=None) -> kir.Expr:
    """`epilogue` for an epilogue expression of its own (a chain's first product's, `mid`; an
    attention's score and probability epilogues). radix: o's coordinates as Binder.load takes
    them, whose divisions of o become the coordinates (radix_rules)."""
    if expr is None:
        return acc
    mapping = {P.acc_var(acc.dtype): acc, O: o}
    if radix:
        mapping.update(radix_rules(radix))
    for quotient, remainder, divisor in splits:
        d = kir.as_expr(divisor, "i32")
        _rule(mapping, kir.binary("div", O, d), quotient)
        _rule(mapping, kir.binary("mod", O, d), remainder)
    return kir.substitute(b.expr(expr), mapping)


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


def slice_fill(shared: str, base, rows: int, tk: int, per: int, li, kb, K, value, bound, k_fastest: bool, zero) -> list:
    """A split-k slice's copy of `tk` values of K x `rows` rows (or columns) into workgroup memory
    at shared[base + kk * rows + r], spread over `per` invocations (li: this one's index):
    value(r, kb + kk) where bound(r) and kb + kk < K, else `zero`; k_fastest: consecutive
    invocations take consecutive kk (A row-major), else consecutive r."""
    out = []
    for step in range(-(-(tk * rows) // per)):
        idx = li + step * per
        r, kk = (idx // tk, idx % tk) if k_fastest else (idx % rows, idx // rows)
        inb = kir.binary("and", bound(r), kb + kk < K)
        st = [If(inb, [kir.SStore(shared, base + kk * rows + r, value(r, kb + kk))],
                 [kir.SStore(shared, base + kk * rows + r, zero)])]
        out += st if (step + 1) * per <= tk * rows else [If(idx < tk * rows, st)]
    return out


def split_k_store(op: P.MatMul, b: "Binder", value, dtype: str, ks: int, per: int, li, tz, r, c, bz) -> list:
    """The end of a split-k kernel: each of the ks slices writes its partial sum `value` (of
    dtype) to workgroup memory; slice 0 adds them (times alpha) and stores row r, column c of
    batch bz through the fused epilogue."""
    M, N = op.m, op.n
    stmts = [kir.SStore("red", tz * per + li, value), kir.Barrier()]
    total = kir.sload("red", li, dtype)
    for z in range(1, ks):
        total = total + kir.sload("red", z * per + li, dtype)
    if op.alpha != 1.0:
        total = total * op.alpha
    o = bz * (M * N) + r * N + c
    store = kir.Store(b.name(op.out), o, epilogue(op, b, lvar("sum", dtype), o, [(bz * M + r, c, N)]))
    stmts.append(If(kir.binary("and", tz < 1, kir.binary("and", r < M, c < N)), [Let("sum", total), store]))
    return stmts
