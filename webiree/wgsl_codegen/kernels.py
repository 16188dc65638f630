"""Kernel builders: one canonical op + its KernelConfig -> a kernel-IR Kernel.

One builder per op kind. Builders only read the configuration chosen in
`config.py`; they never pick sizes themselves. The result is target-neutral
kernel IR (see kir.py), rendered to WGSL by wgsl.py.

Conventions: bindings are named b0, b1, ... in slot order; the output is the
last binding; every index is i32; the 1-D workgroup id is folded over
(x, y) so grids above 65,535 workgroups still launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import program as P
from ..ir.program import O, numel, strides_of
from ..errors import LimitsError
from ..ir import kir
from .config import KernelConfig
from ..ir.kir import Assign, Barrier, Decl, For, If, Let, SStore, Store, f32, i32, lvar, select

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
        return [kir.Binding(i, f"b{i}", "vec4f" if vec else self.prog.tensors[t].dtype, writes=(t == out))
                for i, (t, vec) in enumerate(self.slots)]

    @property
    def tensors(self) -> list[str]:
        return [t for t, _ in self.slots]


def grid_for(n_groups: int, limits: dict) -> tuple[int, int, int]:
    cap = limits["max_compute_workgroups_per_dimension"]
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


# ----------------------------------------------------------------------------
# canonical op class -> builder(op, prog, cfg, limits, binder) -> (body, shared arrays, grid).
# Filled at the end of this module; other kernel modules add their op kinds with `builder_for`.
BUILDERS: dict = {}


def builder_for(op_class):
    def deco(fn):
        BUILDERS[op_class] = fn
        return fn
    return deco


def build(op: P.Op, prog: P.Program, cfg: KernelConfig, limits: dict) -> Dispatch:
    builder = BUILDERS[type(op)]
    b = Binder(prog, getattr(op, "prologues", None))
    body, shared, grid = builder(op, prog, cfg, limits, b)
    kernel = kir.Kernel(op.name, b.bindings(op.out), cfg.workgroup_size, body, shared)
    if len(kernel.bindings) > limits["max_storage_buffers_per_shader_stage"]:
        raise LimitsError(f"dispatch {op.name} needs {len(kernel.bindings)} storage buffers, above the limit of "
                          f"{limits['max_storage_buffers_per_shader_stage']}")
    return Dispatch(op.name, op.kind, list(op.nodes), kernel, cfg, grid, b.tensors)


def build_generic(op: P.Generic, prog, cfg, limits, b: Binder):
    wg = cfg.workgroup_size[0]
    n = numel(prog.tensors[op.out].shape)
    out = b.name(op.out)
    value = b.expr(op.expr)
    body = [Let("o", linear_wid() * wg + lid()),
            If(O < n, [Store(out, O, value)])]
    return body, [], grid_for(-(-n // wg), limits)


def _batch_offsets(op: P.MatMul):
    """(batch index expr, A's element offset, B's element offset) for workgroup z."""
    bz = kir.cast(kir.WID[2], "i32")
    bcoords = P.coords_of(bz, op.batch) if op.batch else []

    def offset(shape):
        if not shape:
            return i32(0)
        k = len(op.batch) - len(shape)
        cs = [i32(0) if shape[i] == 1 else bcoords[k + i] for i in range(len(shape))]
        return P.flat_of(cs, shape)
    return bz, offset(op.a_batch) * (op.m * op.k), offset(op.b_batch) * (op.k * op.n)


def build_matmul(op: P.MatMul, prog, cfg, limits, b: Binder):
    if numel(op.batch) > limits["max_compute_workgroups_per_dimension"]:
        raise LimitsError(f"MatMul batch {numel(op.batch)} exceeds the workgroups per dimension limit")
    if cfg.strategy == "subgroup-broadcast":
        return _matmul_subgroup(op, prog, cfg, limits, b)
    if cfg.strategy == "tiled-shared-vec4":
        return _matmul_shared_vec4(op, prog, cfg, limits, b)
    if cfg.strategy == "split-k":
        return _matmul_split_k(op, prog, cfg, limits, b)
    if cfg.strategy == "register-blocked":
        return _matmul_registers(op, prog, cfg, limits, b)
    return _matmul_shared(op, prog, cfg, limits, b)


def _slots_and_accumulators(body: list, n0, stride: int, slots: int, rm: int, rn: int, acc_t: str) -> list:
    """Append Let nc{j} = column slot n0 + j*stride (clamped to the last slot) and zeroed
    accumulators acc{i}_{j} (f32 or vec4f) to `body`; return the nc{j} variables."""
    for j in range(rn):
        body.append(Let(f"nc{j}", kir.minimum(n0 + j * stride, slots - 1)))
        for i in range(rm):
            body.append(Decl(f"acc{i}_{j}", acc_t, kir.splat(f32(0.0)) if acc_t == "vec4f" else f32(0.0)))
    return [lvar(f"nc{j}", "i32") for j in range(rn)]


def _matmul_registers(op: P.MatMul, prog, cfg, limits, b: Binder):
    """No workgroup memory, no barriers: invocation x owns column slots n0 + x + j*WX (j < RN)
    of RM consecutive rows, a slot being one column or, with cfg.vector == 4, a vec4 of 4
    adjacent columns. Lanes read consecutive B slots; A reads are uniform across the
    workgroup. Suits CPU adapters (lavapipe vectorizes across invocations)."""
    wx = cfg.workgroup_size[0]
    rm, rn, uk = cfg.tile
    vec = cfg.vector
    M, N, K = op.m, op.n, op.k
    slots = N // vec
    acc_t = "vec4f" if vec == 4 else "f32"
    bz, a_off, b_off = _batch_offsets(op)
    body = [Let("a_off", a_off), Let("b_offv", b_off // vec),
            Let("n0", kir.cast(kir.WID[0], "i32") * (wx * rn) + lid()),
            Let("m0", kir.cast(kir.WID[1], "i32") * rm)]
    n0, m0 = lvar("n0", "i32"), lvar("m0", "i32")
    a_off, b_offv = lvar("a_off", "i32"), lvar("b_offv", "i32")
    for i in range(rm):
        body.append(Let(f"mr{i}", kir.minimum(m0 + i, M - 1)))
    nc = _slots_and_accumulators(body, n0, wx, slots, rm, rn, acc_t)
    mr = [lvar(f"mr{i}", "i32") for i in range(rm)]

    def step(k):
        stmts = []
        for i in range(rm):
            a = b.load(op.a, a_off + (k * M + mr[i] if op.trans_a else mr[i] * K + k))
            stmts.append(Let(f"a{i}", kir.splat(a) if vec == 4 else a))
        for j in range(rn):
            if vec == 4:   # matmul_vec4_ok: B row-major, no prologue
                bv = b.load4(op.b, b_offv + k * slots + nc[j])
            else:
                bv = b.load(op.b, b_offv + (nc[j] * K + k if op.trans_b else k * N + nc[j]))
            stmts.append(Let(f"b{j}", bv))
        for i in range(rm):
            for j in range(rn):
                acc = lvar(f"acc{i}_{j}", acc_t)
                stmts.append(Assign(f"acc{i}_{j}", acc + lvar(f"a{i}", acc_t) * lvar(f"b{j}", acc_t)))
        return stmts
    k0 = lvar("k0", "i32")
    main = K - K % uk
    if main:
        inner = [kir.For(f"u{kk}", i32(0), i32(1), step(k0 + kk), unroll=True) for kk in range(uk)]
        body.append(For("k0", i32(0), i32(main), inner, step=uk))
    for k in range(main, K):
        body.append(kir.For(f"r{k}", i32(0), i32(1), step(i32(k)), unroll=True))
    body += _store_blocks(op, prog, b, bz, [(f"acc{i}_{j}", m0 + i, n0 + j * wx)
                                            for i in range(rm) for j in range(rn)], vec)
    return body, [], (-(-slots // (wx * rn)), -(-M // rm), max(numel(op.batch), 1))


def _store_blocks(op: P.MatMul, prog, b: Binder, bz, blocks, vec: int) -> list:
    """Stores of register-block accumulators: `blocks` = [(acc name, row, column slot)], a slot
    being `vec` (1 or 4) adjacent columns. A plain f32 vec4 result is one vec4 store; otherwise
    each column goes through alpha and the fused epilogue."""
    M, N = op.m, op.n
    plain = vec == 4 and op.epilogue is None and op.alpha == 1.0 and prog.tensors[op.out].dtype == "f32"
    out = b.name(op.out, vec=plain)
    acc_t = "vec4f" if vec == 4 else "f32"
    body = []
    for name, r, c in blocks:
        o = bz * (M * N) + r * N + c * vec
        acc = lvar(name, acc_t)
        cond = kir.binary("and", r < M, c < N // vec)
        if plain:
            body.append(If(cond, [Store(out, o // 4, acc)]))
            continue
        stores = [Let(f"o_{name}", o)]
        oo = lvar(f"o_{name}", "i32")
        for q in range(vec):
            v = kir.lane(acc, q) if vec == 4 else acc
            if op.alpha != 1.0:
                v = v * op.alpha
            stores.append(Store(out, oo + q, epilogue(op, b, v, oo + q)))
        body.append(If(cond, stores))
    return body


def matmul_vec4_ok(op: P.MatMul) -> bool:
    """B and C can be read and written as vec4 rows."""
    return op.n % 4 == 0 and not op.trans_b and op.b not in op.prologues


def matmul_subgroup_ok(op: P.MatMul) -> bool:
    """A can be read as vec4 along K (row-major, K a multiple of 4; four computed values where
    a prologue produces A); B is read row by row."""
    return not op.trans_a and op.k % 4 == 0 and not op.trans_b


def _matmul_subgroup(op: P.MatMul, prog, cfg, limits, b: Binder):
    """For CPU adapters whose workgroup of S invocations is one subgroup (lavapipe: S = 8, one SIMD
    register). There every storage load costs a scalar loop over the lanes, so each loaded value
    must be useful: invocation x owns column slots n0 + x + j*S (j < RN; a slot is a vec4 of
    columns when cfg.vector == 4, one column otherwise) of RM rows, and for each row loads
    A[row, k0 + 4x .. 4x + 3]: one vec4 load per invocation brings 4*S values of K, which
    subgroupBroadcast hands to every invocation. Measured on 128x384x1536: 31 GFLOP/s vs 12.5
    for the register-blocked kernel, which loads the same A value in every invocation."""
    S = cfg.workgroup_size[0]
    rm, rn, kb = cfg.tile            # kb = 4 * S: the K values one A load per invocation covers
    vec = cfg.vector
    M, N, K = op.m, op.n, op.k
    slots, K4 = N // vec, K // 4
    acc_t = "vec4f" if vec == 4 else "f32"
    bz, a_off, b_off = _batch_offsets(op)
    body = [Let("a_off4", a_off // 4), Let("b_offv", b_off // vec),
            Let("n0", kir.cast(kir.WID[0], "i32") * (S * rn) + lid()),
            Let("m0", kir.cast(kir.WID[1], "i32") * rm)]
    n0, m0 = lvar("n0", "i32"), lvar("m0", "i32")
    a_off4, b_offv = lvar("a_off4", "i32"), lvar("b_offv", "i32")
    for i in range(rm):
        body.append(Let(f"ar{i}", a_off4 + kir.minimum(m0 + i, M - 1) * K4))
    nc = _slots_and_accumulators(body, n0, S, slots, rm, rn, acc_t)
    ar = [lvar(f"ar{i}", "i32") for i in range(rm)]
    load_b = b.load4 if vec == 4 else b.load

    def block(k0, a_col4, steps):
        """`steps` values of K from k0: one A load per row, then broadcast and multiply."""
        stmts = [Let(f"av{i}", b.load4(op.a, ar[i] + a_col4)) for i in range(rm)]
        for kk in range(steps):
            src, q = kk // 4, kk % 4
            stmts += [Let(f"b{kk}_{j}", load_b(op.b, b_offv + (k0 + kk) * slots + nc[j])) for j in range(rn)]
            for i in range(rm):
                if q == 0:
                    stmts.append(Let(f"s{i}_{src}", kir.subgroup_broadcast(lvar(f"av{i}", "vec4f"), src)))
                a = kir.lane(lvar(f"s{i}_{src}", "vec4f"), q)
                a = kir.splat(a) if vec == 4 else a
                for j in range(rn):
                    acc = lvar(f"acc{i}_{j}", acc_t)
                    stmts.append(Assign(f"acc{i}_{j}", kir.fma(a, lvar(f"b{kk}_{j}", acc_t), acc)))
        return stmts
    k0 = lvar("k0", "i32")
    main = K - K % kb
    if main:
        body.append(For("k0", i32(0), i32(main), block(k0, k0 // 4 + lid(), kb), step=kb))
    if K % kb:   # the tail: invocations past its end re-read its last vec4 (never broadcast)
        tail = K % kb
        body.append(kir.For("tail", i32(0), i32(1),
                            block(i32(main), main // 4 + kir.minimum(lid(), tail // 4 - 1), tail), unroll=True))
    body += _store_blocks(op, prog, b, bz, [(f"acc{i}_{j}", m0 + i, n0 + j * S)
                                            for i in range(rm) for j in range(rn)], vec)
    return body, [], (-(-slots // (S * rn)), -(-M // rm), max(numel(op.batch), 1))


def _matmul_shared_vec4(op: P.MatMul, prog, cfg, limits, b: Binder):
    """GPUs, A and B both readable as vec4 (matmul_vec4_ok and matmul_subgroup_ok): a
    (16*RM) x (16*4*RN) output tile per workgroup of 16x16 invocations, K in steps of 8.
    Each step every invocation copies (about) one vec4 of A and one of B into workgroup
    memory, where A keeps its [row][k] layout (a vec4 holds 4 values of K) and B its
    [k][column] layout; invocation (x, y) then owns rows y*RM .. y*RM+RM-1 and the vec4
    columns x + 16j (j < RN), reading RM + 4*RN vec4s of workgroup memory per 4 values of K
    for 16*RM*RN multiply-adds."""
    wx, wy, _ = cfg.workgroup_size
    rm, rn, bk = cfg.tile
    M, N, K = op.m, op.n, op.k
    N4, K4, BK4 = N // 4, K // 4, bk // 4
    tm, tn4 = wy * rm, wx * rn
    nthreads = wx * wy
    bz, a_off_e, b_off_e = _batch_offsets(op)
    tx, ty, li = lid(0), lid(1), kir.cast(kir.LINDEX, "i32")
    body = [Let("a_off4", a_off_e // 4), Let("b_off4", b_off_e // 4),
            Let("m0", kir.cast(kir.WID[1], "i32") * tm), Let("n04", kir.cast(kir.WID[0], "i32") * tn4)]
    a_off4, b_off4 = lvar("a_off4", "i32"), lvar("b_off4", "i32")
    m0, n04, k0 = lvar("m0", "i32"), lvar("n04", "i32"), lvar("k0", "i32")
    for i in range(rm):
        for j in range(rn):
            body.append(Decl(f"acc{i}_{j}", "vec4f", kir.splat(f32(0.0))))
    zero4 = kir.splat(f32(0.0))

    def copies(shared, total, value_at):
        """[(register, value_at(idx), idx, guard)] spreading shared[idx] = value_at(idx) for
        idx < total over the invocations; guard is None where every invocation takes part."""
        out = []
        for step in range(-(-total // nthreads)):
            idx = li + step * nthreads
            out.append((f"p{shared}{step}", value_at, idx, None if (step + 1) * nthreads <= total else idx < total))
        return out

    def a_at(idx, k0):   # row idx / BK4 of the tile, vec4 idx % BK4 of the K step
        r, c = idx // BK4, idx % BK4
        k4 = k0 // 4 + c
        v = b.load4(op.a, a_off4 + kir.minimum(m0 + r, M - 1) * K4 + kir.minimum(k4, K4 - 1))
        return select(k4 < K4, v, zero4)

    def b_at(idx, k0):   # row (k) idx / tn4 of the step, vec4 column idx % tn4 of the tile
        kk, c = idx // tn4, idx % tn4
        v = b.load4(op.b, b_off4 + kir.minimum(k0 + kk, K - 1) * N4 + kir.minimum(n04 + c, N4 - 1))
        return select(k0 + kk < K, v, zero4)

    # The next K step's values are loaded into registers while this step computes (prefetch),
    # so the global-memory latency hides behind the multiply-adds.
    regs = [("As", *c) for c in copies("As", tm * BK4, a_at)] + [("Bs", *c) for c in copies("Bs", bk * tn4, b_at)]
    for _, reg, value_at, idx, guard in regs:
        body.append(Decl(reg, "vec4f", value_at(idx, i32(0))))
    inner = []
    for shared, reg, _, idx, guard in regs:
        st = SStore(shared, idx, lvar(reg, "vec4f"))
        inner.append(st if guard is None else If(guard, [st]))
    inner.append(Barrier())
    inner += [Assign(reg, value_at(idx, k0 + bk)) for _, reg, value_at, idx, _ in regs]
    for kk4 in range(BK4):
        for i in range(rm):
            inner.append(Let(f"a{kk4}_{i}", kir.sload("As", (ty * rm + i) * BK4 + kk4, "vec4f")))
        for q in range(4):
            for j in range(rn):
                inner.append(Let(f"b{kk4}_{q}_{j}", kir.sload("Bs", (kk4 * 4 + q) * tn4 + tx + j * wx, "vec4f")))
            for i in range(rm):
                a = kir.splat(kir.lane(lvar(f"a{kk4}_{i}", "vec4f"), q))
                for j in range(rn):
                    acc = lvar(f"acc{i}_{j}", "vec4f")
                    inner.append(Assign(f"acc{i}_{j}", kir.fma(a, lvar(f"b{kk4}_{q}_{j}", "vec4f"), acc)))
    inner.append(Barrier())
    body.append(For("k0", i32(0), i32(K), inner, step=bk))
    body += _store_blocks(op, prog, b, bz, [(f"acc{i}_{j}", m0 + ty * rm + i, n04 + tx + j * wx)
                                            for i in range(rm) for j in range(rn)], 4)
    shared = [kir.SharedArray("As", "vec4f", tm * BK4), kir.SharedArray("Bs", "vec4f", bk * tn4)]
    return body, shared, (-(-N4 // tn4), -(-M // tm), max(numel(op.batch), 1))


def _matmul_split_k(op: P.MatMul, prog, cfg, limits, b: Binder):
    """Small products with a long K (BERT's 128 x 512 x 128) on GPUs: a workgroup of WX x WY x
    KS invocations computes a WY x WX output tile, slice z of the invocations taking every
    KS-th step of TK values of K; the KS partial sums meet in workgroup memory. A GPU gets
    more, shorter workgroups than one K loop per output tile gives it."""
    wx, wy, ks = cfg.workgroup_size
    _, _, tk = cfg.tile
    M, N, K = op.m, op.n, op.k
    per = wx * wy
    steps = -(-K // (tk * ks))          # K steps each slice takes (all slices alike: barriers)
    bz, a_off_e, b_off_e = _batch_offsets(op)
    tx, ty, tz = lid(0), lid(1), lid(2)
    li = tx + ty * wx                    # index within the slice
    body = [Let("a_off", a_off_e), Let("b_off", b_off_e),
            Let("m0", kir.cast(kir.WID[1], "i32") * wy), Let("n0", kir.cast(kir.WID[0], "i32") * wx),
            Decl("acc", "f32", f32(0.0))]
    a_off, b_off = lvar("a_off", "i32"), lvar("b_off", "i32")
    m0, n0, s = lvar("m0", "i32"), lvar("n0", "i32"), lvar("s", "i32")
    kb = lvar("kb", "i32")
    a_sh, b_sh = tz * (tk * wy), tz * (tk * wx)     # this slice's part of As / Bs

    def fill(shared, base, rows, elem, bound, k_fastest):
        out = []
        for step in range(-(-(tk * rows) // per)):
            idx = li + step * per
            r, kk = (idx // tk, idx % tk) if k_fastest else (idx % rows, idx // rows)
            inb = kir.binary("and", bound(r), kb + kk < K)
            st = [If(inb, [SStore(shared, base + kk * rows + r, elem(r, kb + kk))],
                     [SStore(shared, base + kk * rows + r, f32(0.0))])]
            out += st if (step + 1) * per <= tk * rows else [If(idx < tk * rows, st)]
        return out

    a_elem = lambda r, k: b.load(op.a, a_off + (k * M + m0 + r if op.trans_a else (m0 + r) * K + k))  # noqa: E731
    b_elem = lambda c, k: b.load(op.b, b_off + ((n0 + c) * K + k if op.trans_b else k * N + n0 + c))  # noqa: E731
    inner = [Let("kb", (s * ks + tz) * tk)]
    inner += fill("As", a_sh, wy, a_elem, lambda r: m0 + r < M, not op.trans_a)
    inner += fill("Bs", b_sh, wx, b_elem, lambda c: n0 + c < N, op.trans_b)
    inner.append(Barrier())
    for kk in range(tk):
        inner.append(Assign("acc", kir.fma(kir.sload("As", a_sh + kk * wy + ty, "f32"),
                                           kir.sload("Bs", b_sh + kk * wx + tx, "f32"), lvar("acc", "f32"))))
    inner.append(Barrier())
    body.append(For("s", i32(0), i32(steps), inner))
    body += [SStore("red", tz * per + li, lvar("acc", "f32")), Barrier()]
    total = kir.sload("red", li, "f32")
    for z in range(1, ks):
        total = total + kir.sload("red", z * per + li, "f32")
    r, c = m0 + ty, n0 + tx
    o = bz * (M * N) + r * N + c
    val = total * op.alpha if op.alpha != 1.0 else total
    out = b.name(op.out)
    body.append(If(kir.binary("and", tz < 1, kir.binary("and", r < M, c < N)),
                   [Let("sum", val), Store(out, o, epilogue(op, b, lvar("sum", "f32"), o))]))
    shared = [kir.SharedArray("As", "f32", ks * tk * wy), kir.SharedArray("Bs", "f32", ks * tk * wx),
              kir.SharedArray("red", "f32", ks * per)]
    return body, shared, (-(-N // wx), -(-M // wy), max(numel(op.batch), 1))


def _matmul_shared(op: P.MatMul, prog, cfg, limits, b: Binder):
    """Workgroup-memory tiles: (WY*RM) x (WX*RN) outputs per workgroup, K in steps of TK."""
    wx, wy, _ = cfg.workgroup_size
    rm, rn, tk = cfg.tile
    tm, tn = wy * rm, wx * rn
    M, N, K = op.m, op.n, op.k
    nthreads = wx * wy
    bz, a_off_e, b_off_e = _batch_offsets(op)
    tx, ty = lid(0), lid(1)
    m0 = kir.cast(kir.WID[1], "i32") * tm
    n0 = kir.cast(kir.WID[0], "i32") * tn
    li = kir.cast(kir.LINDEX, "i32")
    k0 = lvar("k0", "i32")
    body = [Let("a_off", a_off_e), Let("b_off", b_off_e), Let("m0", m0), Let("n0", n0)]
    a_off, b_off = lvar("a_off", "i32"), lvar("b_off", "i32")
    m0, n0 = lvar("m0", "i32"), lvar("n0", "i32")
    for i in range(rm):
        for j in range(rn):
            body.append(Decl(f"acc{i}_{j}", "f32", f32(0.0)))

    def coop_load(shared, rows, elem_index, bound, k_fastest):
        """Fill shared[kk * rows + r] for the k-step, zero outside the matrix. Consecutive
        invocations read consecutive addresses: along k when the matrix is stored k-fastest
        (A as [M, K], B as [N, K]), along rows otherwise."""
        stmts = []
        total = tk * rows
        for step in range(-(-total // nthreads)):
            idx = li + step * nthreads
            if k_fastest:
                r, kk = idx // tk, idx % tk
            else:
                kk, r = idx // rows, idx % rows
            inb = kir.binary("and", bound(r), k0 + kk < K)
            at = kk * rows + r
            fill = [If(inb, [SStore(shared, at, elem_index(r, k0 + kk))], [SStore(shared, at, f32(0.0))])]
            stmts.extend(fill if (step + 1) * nthreads <= total else [If(idx < total, fill)])
        return stmts

    a_elem = (lambda r, k: b.load(op.a, a_off + (k * M + m0 + r if op.trans_a else (m0 + r) * K + k)))
    b_elem = (lambda c, k: b.load(op.b, b_off + ((n0 + c) * K + k if op.trans_b else k * N + n0 + c)))
    inner = []
    inner += coop_load("As", tm, a_elem, lambda r: m0 + r < M, k_fastest=not op.trans_a)
    inner += coop_load("Bs", tn, b_elem, lambda c: n0 + c < N, k_fastest=op.trans_b)
    inner.append(Barrier())
    for kk in range(tk):
        a_vals = [kir.sload("As", kk * tm + ty + i * wy, "f32") for i in range(rm)]
        b_vals = [kir.sload("Bs", kk * tn + tx + j * wx, "f32") for j in range(rn)]
        for i in range(rm):
            for j in range(rn):
                acc = lvar(f"acc{i}_{j}", "f32")
                inner.append(Assign(f"acc{i}_{j}", kir.fma(a_vals[i], b_vals[j], acc)))
    inner.append(Barrier())
    body.append(For("k0", i32(0), i32(K), inner, step=tk))
    out = b.name(op.out)
    for i in range(rm):
        for j in range(rn):
            r, c = m0 + ty + i * wy, n0 + tx + j * wx
            o = bz * (M * N) + r * N + c
            acc = lvar(f"acc{i}_{j}", "f32")
            if op.alpha != 1.0:
                acc = acc * op.alpha
            body.append(If(kir.binary("and", r < M, c < N), [Store(out, o, epilogue(op, b, acc, o))]))
    shared = [kir.SharedArray("As", "f32", tk * tm), kir.SharedArray("Bs", "f32", tk * tn)]
    return body, shared, (-(-N // tn), -(-M // tm), max(numel(op.batch), 1))


def _window_loops(kdims, strides, dilations, pads, in_sp, out_coords, inner_fn, out_sp=None, unroll_max=3):
    """Nested loops over a window; inner_fn(positions, kernel_coords) gives the innermost body.
    Positions outside the input are skipped (no check where a dim's windows always fit)."""
    nd = len(kdims)

    def level(d, pos, kc):
        if d == nd:
            return inner_fn(pos, kc)
        kv = lvar(f"k{d}", "i32")
        p = out_coords[d] * strides[d] - pads[d] + kv * dilations[d]
        always_inside = out_sp is not None and pads[d] == 0 and \
            (out_sp[d] - 1) * strides[d] + (kdims[d] - 1) * dilations[d] <= in_sp[d] - 1
        inner = level(d + 1, pos + [lvar(f"p{d}", "i32")], kc + [kv])
        body = [Let(f"p{d}", p)] + (inner if always_inside else [
            If(kir.binary("and", lvar(f"p{d}", "i32") >= 0, lvar(f"p{d}", "i32") < in_sp[d]), inner)])
        return [For(f"k{d}", i32(0), i32(kdims[d]), body, unroll=kdims[d] <= unroll_max)]
    return level(0, [], [])


def _conv_row_block(op: P.Conv, prog, cfg, limits, b: Binder):
    """2-D convolution for CPU adapters: each invocation computes RW consecutive outputs of one
    output row (one output channel), loading each input value of the window's rows once for all
    RW outputs and each weight once (llvmpipe pays per load and lane: a 3x3 depthwise window
    for 4 outputs is 3 x 6 + 9 loads instead of 4 x 18)."""
    wg = cfg.workgroup_size[0]
    _, rw = cfg.tile
    N, C, H, W = op.x_shape
    M, Cg, KH, KW = op.w_shape
    Mg = M // op.group
    OH, OW = op.out_shape[2:]
    (sh, sw), (dh, dw) = op.strides, op.dilations
    ph, pw = op.pads[0], op.pads[1]
    blocks = -(-OW // rw)
    total = N * M * OH * blocks
    t = lvar("t", "i32")
    body = [Let("t", linear_wid() * wg + lid())]
    work = [Let("ob", t % blocks), Let("oh", (t // blocks) % OH), Let("m", (t // (blocks * OH)) % M),
            Let("n", t // (blocks * OH * M))]
    ob, oh, m, n = (lvar(x, "i32") for x in ("ob", "oh", "m", "n"))
    work += [Let("ow0", ob * rw), Let("g", m // Mg)]
    ow0, g, c = lvar("ow0", "i32"), lvar("g", "i32"), lvar("c", "i32")
    for j in range(rw):
        work.append(Decl(f"acc{j}", "f32", f32(0.0)))
    offsets = sorted({j * sw + kw * dw for j in range(rw) for kw in range(KW)})
    cbody = [Let("xbase", (n * C + g * Cg + c) * (H * W)), Let("wbase", (m * Cg + c) * (KH * KW)),
             Let("iw0", ow0 * sw - pw)]
    iw0 = lvar("iw0", "i32")
    for kh in range(KH):
        ih = oh * sh - ph + kh * dh
        row = [Let(f"xrow{kh}", lvar("xbase", "i32") + ih * W)]
        for off in offsets:   # each input of the row once, zero outside the image
            iw = iw0 + off
            inside = kir.binary("and", iw >= 0, iw < W)
            v = b.load(op.x, lvar(f"xrow{kh}", "i32") + kir.clamp(iw, 0, W - 1))
            row.append(Let(f"x{kh}_{off}", select(inside, v, f32(0.0))))
        for kw in range(KW):
            row.append(Let(f"w{kh}_{kw}", b.load(op.w, lvar("wbase", "i32") + kh * KW + kw)))
            for j in range(rw):
                x = lvar(f"x{kh}_{j * sw + kw * dw}", "f32")
                row.append(Assign(f"acc{j}", kir.fma(x, lvar(f"w{kh}_{kw}", "f32"), lvar(f"acc{j}", "f32"))))
        cbody.append(If(kir.binary("and", ih >= 0, ih < H), row))
    work.append(For("c", i32(0), i32(Cg), cbody))
    out = b.name(op.out)
    for j in range(rw):
        o = ((n * M + m) * OH + oh) * OW + ow0 + j
        store = [Store(out, o, epilogue(op, b, lvar(f"acc{j}", "f32"), o))]
        work += store if OW % rw == 0 else [If(ow0 + j < OW, store)]
    body.append(If(t < total, work))
    return body, [], grid_for(-(-total // wg), limits)


def build_conv(op: P.Conv, prog, cfg, limits, b: Binder):
    if cfg.strategy == "row-block":
        return _conv_row_block(op, prog, cfg, limits, b)
    wg = cfg.workgroup_size[0]
    (cb,) = cfg.tile
    N, C = op.x_shape[:2]
    in_sp = op.x_shape[2:]
    M = op.w_shape[0]
    Cg = op.w_shape[1]
    Mg = M // op.group
    out_sp = op.out_shape[2:]
    S = numel(out_sp)
    nd = len(in_sp)
    total = N * (M // cb) * S
    t = lvar("t", "i32")
    sp = lvar("sp", "i32")
    ocoords = P.coords_of(sp, out_sp)
    body = [Let("t", linear_wid() * wg + lid())]
    work = [Let("sp", t % S if S > 1 else i32(0)), Let("rest", t // S),
            Let("m0", (lvar("rest", "i32") % (M // cb)) * cb), Let("n", lvar("rest", "i32") // (M // cb)),
            Let("g", lvar("m0", "i32") // Mg)]
    for d in range(nd):
        work.append(Let(f"q{d}", ocoords[d]))
    q = [lvar(f"q{d}", "i32") for d in range(nd)]
    m0, n, g = lvar("m0", "i32"), lvar("n", "i32"), lvar("g", "i32")
    for j in range(cb):
        work.append(Decl(f"acc{j}", "f32", f32(0.0)))
    ksize = numel(op.w_shape[2:])
    c = lvar("c", "i32")

    def inner(pos, kc):
        xv = b.load(op.x, lvar("xbase", "i32") + P.flat_of(pos, in_sp))
        stmts = [Let("xv", xv)]
        for j in range(cb):
            wv = b.load(op.w, lvar(f"wbase{j}", "i32") + P.flat_of(kc, op.w_shape[2:]))
            stmts.append(Assign(f"acc{j}", kir.fma(lvar("xv", "f32"), wv, lvar(f"acc{j}", "f32"))))
        return stmts
    cbody = [Let("xbase", (n * C + g * Cg + c) * numel(in_sp))]
    for j in range(cb):
        cbody.append(Let(f"wbase{j}", ((m0 + j) * Cg + c) * ksize))
    cbody += _window_loops(op.w_shape[2:], op.strides, op.dilations, op.pads, in_sp, q, inner, out_sp)
    work.append(For("c", i32(0), i32(Cg), cbody))
    out = b.name(op.out)
    for j in range(cb):
        o = (n * M + m0 + j) * S + sp
        work.append(Store(out, o, epilogue(op, b, lvar(f"acc{j}", "f32"), o)))
    body.append(If(t < total, work))
    return body, [], grid_for(-(-total // wg), limits)


def build_pool(op: P.Pool, prog, cfg, limits, b: Binder):
    wg = cfg.workgroup_size[0]
    N, C = op.x_shape[:2]
    in_sp = op.x_shape[2:]
    out_sp = op.out_shape[2:]
    S = numel(out_sp)
    nd = len(in_sp)
    total = N * C * S
    dt = b.dtype(op.x)
    t = lvar("t", "i32")
    ocoords = P.coords_of(t % S if S > 1 else i32(0), out_sp)
    work = [Let("nc", t // S)]
    for d in range(nd):
        work.append(Let(f"q{d}", ocoords[d]))
    q = [lvar(f"q{d}", "i32") for d in range(nd)]
    init = {"max": kir.const(NEG_INF, "f32") if dt == "f32" else i32(-(1 << 31)), "avg": f32(0.0), "lp": f32(0.0)}
    work.append(Decl("acc", dt, init[op.mode]))
    work.append(Decl("cnt", "i32", i32(0)))
    acc = lvar("acc", dt)

    def inner(pos, kc):
        v = b.load(op.x, lvar("nc", "i32") * numel(in_sp) + P.flat_of(pos, in_sp))
        if op.mode == "max":
            upd = select(kir.binary("or", v > acc, kir.unary("isnan", v)), v, acc) if dt == "f32" else kir.maximum(v, acc)
        elif op.mode == "avg":
            upd = acc + v
        else:
            upd = acc + kir.binary("pow", kir.unary("abs", v), f32(op.p))
        return [Assign("acc", upd), Assign("cnt", lvar("cnt", "i32") + 1)]
    work += _window_loops(op.kernel, op.strides, op.dilations, op.pads, in_sp, q, inner, out_sp)
    result = acc
    if op.mode == "avg":
        if op.count_include_pad:
            # window positions inside the padded input (those past the end pad are not counted)
            div = i32(1)
            for d in range(nd):
                start = q[d] * op.strides[d] - op.pads[d]
                hi = in_sp[d] + op.pads[nd + d]
                cnt_d = i32(0)
                for k in range(op.kernel[d]):
                    p = start + k * op.dilations[d]
                    cnt_d = cnt_d + kir.cast(kir.binary("and", p >= -op.pads[d], p < hi), "i32")
                div = div * cnt_d
            result = acc / kir.cast(div, "f32")
        else:
            result = acc / kir.cast(kir.maximum(lvar("cnt", "i32"), 1), "f32")
    elif op.mode == "lp":
        result = kir.binary("pow", acc, f32(1.0 / op.p))
    work.append(Store(b.name(op.out), t, epilogue(op, b, result, t)))
    body = [Let("t", linear_wid() * wg + lid()), If(t < total, work)]
    return body, [], grid_for(-(-total // wg), limits)


# --- workgroup-tree reductions -------------------------------------------------

def _tree(shared: str, wg: int, combine, value: kir.Expr, dtype: str, extra=None):
    """Reduce one value per invocation across the workgroup; the result ends in shared[0].
    `extra` = (shared2, value2) carries a second lane (argmax's index)."""
    li = lid()
    stmts = [SStore(shared, li, value)]
    if extra:
        stmts.append(SStore(extra[0], li, extra[1]))
    stmts.append(Barrier())
    stride = wg // 2
    while stride >= 1:
        a, c = kir.sload(shared, li, dtype), kir.sload(shared, li + stride, dtype)
        if extra:
            ia, ic = kir.sload(extra[0], li, "i32"), kir.sload(extra[0], li + stride, "i32")
            take = combine(a, c, ia, ic)
            upd = [If(take, [SStore(shared, li, c), SStore(extra[0], li, ic)])]
        else:
            upd = [SStore(shared, li, combine(a, c))]
        stmts.append(If(li < stride, upd))
        stmts.append(Barrier())
        stride //= 2
    return stmts


def _max_nan(a, c):
    return select(kir.binary("or", c > a, kir.unary("isnan", c)), c, a)


def _min_nan(a, c):
    return select(kir.binary("or", c < a, kir.unary("isnan", c)), c, a)


def _row_setup(rows_total, inner, r, wg):
    """Let row / base for a workgroup that reduces one row of [outer, R, inner]."""
    row = lvar("row", "i32")
    return [Let("row", linear_wid()),
            Let("base", (row // inner) * (r * inner) + row % inner if inner > 1 else row * r)]


def _strided_loop(var_name, r, wg, body):
    return For(var_name, lid(), i32(r), body, step=wg)


def build_reduce(op: P.Reduce, prog, cfg, limits, b: Binder):
    wg = cfg.workgroup_size[0]
    rows = op.outer * op.inner
    dt = b.dtype(op.x)
    base, row = lvar("base", "i32"), lvar("row", "i32")
    rv = lvar("r", "i32")
    elem = b.load(op.x, base + rv * op.inner)
    out = b.name(op.out)
    mode = op.mode
    work = _row_setup(rows, op.inner, op.r, wg)
    shared = [kir.SharedArray("red", dt, wg)]
    if mode in ("argmax", "argmin"):
        better = (lambda v, best: v > best) if mode == "argmax" else (lambda v, best: v < best)
        if op.select_last:
            better = (lambda v, best: v >= best) if mode == "argmax" else (lambda v, best: v <= best)
        init = kir.const(NEG_INF if mode == "argmax" else float("inf"), "f32") if dt == "f32" else \
            i32(-(1 << 31) if mode == "argmax" else (1 << 31) - 1)
        work += [Decl("best", dt, init), Decl("bi", "i32", i32(-1))]
        best, bi = lvar("best", dt), lvar("bi", "i32")
        take = kir.binary("or", better(elem, best), bi < 0)
        work.append(_strided_loop("r", op.r, wg, [If(take, [Assign("best", elem), Assign("bi", rv)])]))

        def combine(a, c, ia, ic):
            strictly = (c > a) if mode == "argmax" else (c < a)
            tie = kir.binary("eq", c, a)
            pick_tie = (ic > ia) if op.select_last else (ic < ia)
            valid = ic >= 0
            return kir.binary("and", valid, kir.binary("or", ia < 0, kir.binary("or", strictly,
                                                                                   kir.binary("and", tie, pick_tie))))
        shared.append(kir.SharedArray("redi", "i32", wg))
        work += _tree("red", wg, combine, best, dt, extra=("redi", bi))
        work.append(If(kir.binary("eq", lid(), i32(0)), [Store(out, row, epilogue(op, b, kir.sload("redi", i32(0), "i32"), row))]))
        body = [If(linear_wid() < rows, work)]
        return body, shared, grid_for(rows, limits)

    if mode == "logsumexp":
        work += [Decl("m", dt, kir.const(NEG_INF, "f32"))]
        work.append(_strided_loop("r", op.r, wg, [Assign("m", _max_nan(lvar("m", dt), elem))]))
        work += _tree("red", wg, _max_nan, lvar("m", dt), dt)
        work += [Let("mx", kir.sload("red", i32(0), dt)), Barrier()]
        mx = lvar("mx", dt)
        # an all -inf row keeps -inf (not NaN): shift by 0 then
        work.append(Let("shift", select(kir.unary("isinf", mx), f32(0.0), mx)))
        pre = lambda v: kir.unary("exp", v - lvar("shift", dt))  # noqa: E731
    else:
        pre = {"sum": lambda v: v, "mean": lambda v: v, "max": lambda v: v, "min": lambda v: v,
               "prod": lambda v: v, "l1": lambda v: kir.unary("abs", v), "l2": lambda v: v * v,
               "sumsquare": lambda v: v * v, "logsum": lambda v: v}[mode]
    if mode in ("max", "min"):
        init = kir.const(NEG_INF if mode == "max" else float("inf"), "f32") if dt == "f32" else \
            kir.const(-(1 << 31) if mode == "max" else (1 << 31) - 1, dt)
        combine = (_max_nan if mode == "max" else _min_nan) if dt == "f32" else \
            (kir.maximum if mode == "max" else kir.minimum)
    elif mode == "prod":
        init, combine = kir.const(1, dt), (lambda a, c: a * c)
    else:
        init, combine = kir.const(0, dt), (lambda a, c: a + c)
    work.append(Decl("acc", dt, init))
    work.append(_strided_loop("r", op.r, wg, [Assign("acc", combine(lvar("acc", dt), pre(elem)))]))
    work += _tree("red", wg, combine, lvar("acc", dt), dt)
    res = kir.sload("red", i32(0), dt)
    if mode == "mean":
        res = res / float(op.r) if dt == "f32" else res / op.r
    elif mode == "l2":
        res = kir.unary("sqrt", res)
    elif mode == "logsum":
        res = kir.unary("log", res)
    elif mode == "logsumexp":
        res = lvar("shift", dt) + kir.unary("log", res)
    work.append(If(kir.binary("eq", lid(), i32(0)), [Store(out, row, epilogue(op, b, res, row))]))
    body = [If(linear_wid() < rows, work)]
    return body, shared, grid_for(rows, limits)


class _Rows:
    """How a softmax / layernorm dispatch walks its rows of R elements.

    'workgroup-tree' (GPUs): one row per workgroup; invocations stride over the row and combine
    partial results through workgroup memory. 'row-per-invocation' (CPU adapters, where a
    barrier is a coroutine switch): one row per invocation, serial loops, no barriers."""

    def __init__(self, cfg, rows: int, inner: int, r: int, limits: dict):
        self.lane = cfg.strategy == "row-per-invocation"
        self.wg, self.rows, self.inner, self.r, self.limits = cfg.workgroup_size[0], rows, inner, r, limits

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
        """Let `name` = the row's combination of every invocation's `value`."""
        if self.lane:
            return [Let(name, value)]
        return _tree("red", self.wg, combine, value, "f32") + [Let(name, kir.sload("red", i32(0), "f32")), Barrier()]

    def shared(self) -> list:
        return [] if self.lane else [kir.SharedArray("red", "f32", self.wg)]

    def grid(self):
        return grid_for(-(-self.rows // self.wg) if self.lane else self.rows, self.limits)


def build_softmax(op: P.Softmax, prog, cfg, limits, b: Binder):
    rows = _Rows(cfg, op.outer * op.inner, op.inner, op.r, limits)
    base, rv = lvar("base", "i32"), lvar("r", "i32")
    idx = base + rv * op.inner
    elem = b.load(op.x, idx)
    out = b.name(op.out)
    work = rows.setup() + [Decl("m", "f32", kir.const(NEG_INF, "f32"))]
    work.append(rows.loop("r", [Assign("m", _max_nan(lvar("m", "f32"), elem))]))
    work += rows.combine("mx", _max_nan, lvar("m", "f32"))
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
    work += [Let("mean", lvar("rsum", "f32") / float(op.r))]
    mean = lvar("mean", "f32")
    work += [Decl("v", "f32", f32(0.0))]
    d = elem - mean
    work.append(rows.loop("r", [Assign("v", lvar("v", "f32") + d * d)]))
    work += rows.combine("rvar", lambda a, c: a + c, lvar("v", "f32"))
    work += [Let("inv", kir.unary("rsqrt", lvar("rvar", "f32") / float(op.r) + op.eps))]
    val = (elem - mean) * lvar("inv", "f32") * b.load(op.scale, rv)
    if op.bias:
        val = val + b.load(op.bias, rv)
    oi = lvar("oi", "i32")
    work.append(rows.loop("r", [Let("oi", base + rv), Store(out, oi, epilogue(op, b, val, oi))]))
    return rows.guard(work), rows.shared(), rows.grid()


BUILDERS.update({
    P.Generic: build_generic, P.MatMul: build_matmul, P.Conv: build_conv, P.Pool: build_pool,
    P.Reduce: build_reduce, P.Softmax: build_softmax, P.LayerNorm: build_layernorm,
})

__all__ = ["Dispatch", "build", "builder_for", "grid_for", "strides_of"]
from . import kernels_extra  # noqa: E402,F401  (registers the Loop builder)
