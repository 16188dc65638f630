"""Integer products of 8-bit values (`MatMul.int8`: MatMulInteger, QLinearMatMul), exact in i32.

Four values of K travel as one u32 word of signed bytes and meet in `dot4i8` (WGSL's
dot4I8Packed): B arrives as such words ([K/4, N], packed at build time from the constant weight:
compiler/ops/quant.py), A's four values of K are computed (its prologue quantizes them, as
DynamicQuantizeLinear does) and packed where they are loaded. So one word load, one broadcast and
one instruction carry what takes four of each in the f32 kernels, and the sum is exact.

The strategies are the f32 ones' (same grids, same register blocks, same planner), with words
where those move floats: subgroup-broadcast (CPU adapters with subgroups), which unpacks the words
and sums in exact f32 (EXACT_WORDS), register-blocked (CPU), tiled-shared and split-k (GPUs), which
take dot4i8. tiled-shared-vec4 multiplies vec4f lanes and has no integer form.

A' = A - 128 for an unsigned A (so it fits a signed byte); the kernel's result is
sum A'B' - b_zero * sum A' (the row sums taken by the same dot4i8 against 0x01010101 where b_zero
is not 0); the lowering adds the zero point of A times the columns' sums in the epilogue.
"""

from __future__ import annotations

import dataclasses
import math

from ...ir import program as P
from ...ir.program import numel
from ...ir import kir
from ...ir.kir import Assign, Barrier, Decl, For, If, Let, SStore, Store, i32, lvar
from .common import Strategy, Binder, arrays_bytes, grid_for, linear_wid, lid, epilogue, slice_fill, split_k_store
from .quant_range import read_range
from .pool_reduce import min_nan, tree

ONES = kir.const(0x01010101, "u32")      # dot4i8(a, ONES): the sum of a's four bytes


def _a_word(b: Binder, op: P.MatMul, a_off, row, k4):
    """A[row, 4*k4 .. 4*k4+3] (A' for an unsigned A) packed into one word."""
    K = op.k
    if isinstance(op.packer, P.QuantizeWords):    # quantized here from the range-pack's x (_quantizing)
        xv = b.load4(op.packer.x, a_off // 4 + row * (K // 4) + k4, [(row, op.m), (k4, K // 4)])
        scale, zp = lvar(QA + "scale", "f32"), lvar(QA + "zp", "i32")
        return kir.pack4i8(*(P.dynamic_quant_value(kir.lane(xv, q), scale, zp) - 128 for q in range(4)))
    if op.a_words:
        return b.load(op.a, a_off // 4 + row * (K // 4) + k4, [(row, op.m), (k4, K // 4)])
    vals = []
    for q in range(4):
        k = k4 * 4 + q
        v = b.load(op.a, a_off + row * K + k, [(row, op.m), (k, K)])
        vals.append(v - 128 if op.a_unsigned else v)
    return kir.pack4i8(*vals)


def _b_word(b: Binder, op: P.MatMul, k4, col):
    """B's word of K values 4*k4 .. 4*k4+3 for column col."""
    return b.load(op.b, k4 * op.n + col, [(k4, op.k // 4), (col, op.n)])


def _result(op: P.MatMul, acc: str, row_sum: str | None):
    """An accumulator's value: sum A'B' - b_zero * sum A'."""
    v = lvar(acc, "i32")
    return v if row_sum is None or not op.b_zero else v - lvar(row_sum, "i32") * op.b_zero


def _store(op: P.MatMul, b: Binder, bz, values) -> list:
    """Stores through the epilogue: values = [(i32 expression, row, column)]."""
    M, N = op.m, op.n
    out = b.name(op.out)
    body = []
    for v, r, c in values:
        o = bz * (M * N) + r * N + c
        body.append(If(kir.binary("and", r < M, c < N),
                       [Store(out, o, epilogue(op, b, v, o, [(bz * M + r, c, N)]))]))
    return kir.share_reads(body, {out})     # a column's sum, scale and bias read once per column


def _sums(op: P.MatMul, rm: int) -> list:
    return [Decl(f"sa{i}", "i32", i32(0)) for i in range(rm)] if op.b_zero else []


def _add_row_sum(op: P.MatMul, i: int, word) -> list:
    return [Assign(f"sa{i}", lvar(f"sa{i}", "i32") + kir.dot4i8(word, ONES))] if op.b_zero else []


QA = "qa_"      # the names of a product's own quantization of A (_quantizing)


def packed_here(op: P.Op, d) -> list:
    """The packers of `op` (an integer product's `packer` and `b_packer`) whose words its dispatch
    `d` computes itself, so that they run no dispatch: a range-pack's work is in it where it has
    the tree of `_quantizing`, an elementwise packer's where it binds no words."""
    out = []
    for packer in (getattr(op, "packer", None), getattr(op, "b_packer", None)):
        if isinstance(packer, P.QuantizeWords) and any(a.name == QA + "lo_s" for a in d.kernel.shared) \
                or isinstance(packer, P.Generic) and packer.out not in d.tensors:
            out.append(packer)
    return out


def build(op: P.MatMul, prog, cfg, limits, b: Binder):
    builder = {Strategy.SUBGROUP_BROADCAST: _subgroup, Strategy.REGISTER_BLOCKED: _registers,
               Strategy.SPLIT_K: _split_k, Strategy.TILED_SHARED: _shared}[cfg.strategy]
    if limits.get("device_class") == "cpu":
        return builder(dataclasses.replace(op, packer=None, b_packer=None), prog, cfg, limits, b)
    for side, packer in (("a", op.packer), ("b", op.b_packer)):
        if isinstance(packer, P.Generic):       # its expression is the words' prologue
            b.prologues = {**b.prologues, getattr(op, side): packer.expr}
    op = dataclasses.replace(op, b_packer=None, packer=op.packer if isinstance(op.packer, P.QuantizeWords) else None)
    if op.packer is not None:
        got = _quantizing(builder, op, prog, cfg, limits, b)
        if got is not None:
            return got
    return builder(dataclasses.replace(op, packer=None), prog, cfg, limits, b)


def _quantizing(builder, op: P.MatMul, prog, cfg, limits, b: Binder):
    """A GPU's integer product that quantizes A itself, as its range-pack (op.packer) would: every
    workgroup first reads the minima x's producer stored per workgroup (kernels/quant_range.py;
    where it stored none, it scans x), reduces them in one tree and computes the scale and zero
    point; A's words are then packed from x where they are loaded, and the epilogue's reads of the
    scale and zero point after the words take those values. The same arithmetic as the range-pack's,
    so the same bits; the range-pack's dispatch is dropped (compiler/driver.py _back). On a GPU
    quantizing A again in each column block costs less than a dispatch; a CPU renderer's register
    blocks would pay it many times over, so CPU variants keep the range-pack. None where the
    workgroup is not a power of 2 or its memory has no room for the tree."""
    q = op.packer
    wg = math.prod(cfg.workgroup_size)
    _, shared, _ = builder(dataclasses.replace(op, packer=None), prog, cfg, limits, Binder(prog, dict(b.prologues)))
    if wg & (wg - 1) or arrays_bytes(shared) + 8 * wg > limits["max_compute_workgroup_storage_size"]:
        return None
    b.prologues = {**q.prologues, **b.prologues}
    n4, li = q.n // 4, kir.cast(kir.LINDEX, "i32")
    inf = kir.const(float("inf"), "f32")
    lo, nh = lvar(QA + "lo", "f32"), lvar(QA + "nh", "f32")
    pre = [Decl(QA + "lo", "f32", inf), Decl(QA + "nh", "f32", inf)]
    reads, scan_end = read_range(b, q.partials, q.partials == q.x and q.x not in b.prologues, n4, wg,
                                 QA + "lo", QA + "nh", li=li)
    v = lvar(QA + "v", "vec4f")
    scan = [Let(QA + "v", b.load4(q.x, lvar(QA + "i", "i32")))]
    for k in range(4):
        scan += [Assign(QA + "lo", min_nan(lo, kir.lane(v, k))), Assign(QA + "nh", min_nan(nh, -kir.lane(v, k)))]
    pre += reads + [For(QA + "i", li, scan_end, scan, step=wg)]
    pre += scale_and_zero_point(lo, nh, wg, (QA + "lo_s", QA + "nh_s"), (QA + "min", QA + "negmax", QA + "scale", QA + "zp"), li)
    words = prog.root(q.out)
    after = {n4: kir.bitcast(lvar(QA + "scale", "f32"), "u32"), n4 + 1: kir.cast(lvar(QA + "zp", "i32"), "u32")}
    wid = (kir.WID[2] * kir.NWG[1] + kir.WID[1]) * kir.NWG[0] + kir.WID[0]
    first = kir.binary("and", kir.binary("eq", kir.cast(wid, "i32"), i32(0)), kir.binary("eq", li, i32(0)))
    pre.append(If(first, [Store(b.name(words), i32(w), v) for w, v in after.items()]))   # the range-pack's tail
    b.also_written.add(words)

    def tail(node):     # the epilogue's reads of the scale and zero point (passes.pack_in_products)
        if node.op == "load" and prog.root(node.attr) == words:
            return after[node.args[0].attr]
        return None
    fused = dataclasses.replace(op, epilogue=op.epilogue and kir.substitute(op.epilogue, {"__fn__": tail}))
    body, shared, grid = builder(fused, prog, cfg, limits, b)
    return pre + body, shared + [kir.SharedArray(QA + "lo_s", "f32", wg), kir.SharedArray(QA + "nh_s", "f32", wg)], grid


def _columns(body: list, n0, stride: int, slots: int, rm: int, rn: int, vec: int) -> list:
    """Let nc{j} = column slot n0 + j*stride (clamped to the last slot); zeroed accumulators
    acc{i}_{j}_{q} (one per column of a slot); returns the nc{j} variables."""
    for j in range(rn):
        body.append(Let(f"nc{j}", kir.minimum(n0 + j * stride, slots - 1)))
        for i in range(rm):
            body += [Decl(f"acc{i}_{j}_{q}", "i32", i32(0)) for q in range(vec)]
    return [lvar(f"nc{j}", "i32") for j in range(rn)]


def _b_slot(b: Binder, op: P.MatMul, k4, slot, vec: int, name: str) -> list:
    """Statements binding the words of K values 4*k4.. of the `vec` columns of a slot (one vec4u
    load for 4) to name_0 .. name_{vec-1}."""
    if vec == 1:
        return [Let(f"{name}_0", _b_word(b, op, k4, slot))]
    t = b.prog.tensors[b.prog.root(op.b)]
    if t.pack is not None or t.table_word is not None or op.b in b.prologues:   # a small B (tests) stored narrower; a packed image
        return [Let(f"{name}_{q}", _b_word(b, op, k4, slot * 4 + q)) for q in range(4)]
    w = Let(f"{name}_v", b.load4u(op.b, k4 * (op.n // 4) + slot))
    return [w] + [Let(f"{name}_{q}", kir.lane(lvar(f"{name}_v", "vec4u"), q)) for q in range(4)]


def _multiply(rm: int, rn: int, vec: int, a_words, b_words) -> list:
    return [Assign(f"acc{i}_{j}_{q}", kir.dot4i8(a_words[i], b_words[j][q]) + lvar(f"acc{i}_{j}_{q}", "i32"))
            for i in range(rm) for j in range(rn) for q in range(vec)]


def _block_values(op, rm, rn, vec, m0, n0, stride):
    return [(_result(op, f"acc{i}_{j}_{q}", f"sa{i}"), m0 + i, (n0 + j * stride) * vec + q)
            for i in range(rm) for j in range(rn) for q in range(vec)]


def _column_slots(op: P.MatMul, cfg, width: int):
    """The start both column-slot kernels share: invocation x of `width` owns column slots
    n0 + x + j*width (j < RN) of RM rows m0 ..; their clamped rows mr{i}, slots nc{j} and the row
    sums. Returns (body, bz, a_off, n0, m0, nc, slots, K4)."""
    rm, rn, vec = cfg.tile.rows, cfg.tile.cols, cfg.vector
    M, K = op.m, op.k
    slots, K4 = op.n // vec, K // 4
    bz = kir.cast(kir.WID[2], "i32")
    body = [Let("a_off", bz * (M * K) if op.batch else i32(0)),
            Let("n0", kir.cast(kir.WID[0], "i32") * (width * rn) + lid()),
            Let("m0", kir.cast(kir.WID[1], "i32") * rm)]
    a_off, n0, m0 = lvar("a_off", "i32"), lvar("n0", "i32"), lvar("m0", "i32")
    for i in range(rm):
        body.append(Let(f"mr{i}", kir.minimum(m0 + i, M - 1)))
    nc = _columns(body, n0, width, slots, rm, rn, vec)
    body += _sums(op, rm)
    return body, bz, a_off, n0, m0, nc, slots, K4


# The subgroup-broadcast kernel (CPU adapters) sums in f32, exactly: every product of a
# signed byte A' and a signed byte B' is an integer of magnitude at most 128 * 128 = 2^14, so any
# sum of EXACT_WORDS * 4 = 1,024 of them is an integer of magnitude at most 2^24, which f32 holds
# exactly (and an fma rounds nothing); after each such chunk of K the f32 partial sums are added to
# the i32 ones. dot4I8Packed works on a pair of words, so each word is taken apart again for every
# row or column it meets; in f32 each word is unpacked once, for all the rows or columns it meets,
# and each product is one fma: on lavapipe quantize_dynamic MiniLM took 81.6 ms this way against
# 147.6 with dot4I8Packed, the same bits (docs/performance.md,
# "Integer products: combined, and in f32 on a CPU renderer"). The register-blocked kernel keeps
# dot4i8: in f32 it took longer (lavapipe, --limits cpu, quantize_dynamic MiniLM: 136 ms against 118).
EXACT_WORDS = 256


def _signed_byte(word, q: int):
    """Byte q (0: the lowest) of the u32 `word` as a signed value, in f32 (exact)."""
    w = kir.bitcast(word, "i32")
    w = kir.binary("shl", w, i32(24 - 8 * q)) if q < 3 else w
    return kir.cast(kir.binary("shr", w, i32(24)), "f32")


class _F32Sums:
    """The exact f32 sums of the subgroup kernel's RM x RN block of slots: f{i}_{j} (a vec4f of a slot's
    columns, or an f32), and fs{i} (row sums of A', where b_zero is not 0)."""

    def __init__(self, op: P.MatMul, rm: int, rn: int, vec: int):
        self.op, self.rm, self.rn, self.vec = op, rm, rn, vec
        self.t = "vec4f" if vec == 4 else "f32"
        self.zero = kir.splat(kir.f32(0.0)) if vec == 4 else kir.f32(0.0)

    def decls(self) -> list:
        out = []
        for i in range(self.rm):
            out += [Decl(f"f{i}_{j}", self.t, self.zero) for j in range(self.rn)]
            out += [Decl(f"fs{i}", "f32", kir.f32(0.0))] if self.op.b_zero else []
        return out

    def b_values(self, b: Binder, k4, nc, name: str) -> list:
        """Each slot's words of K values 4*k4.. loaded and unpacked: {name}_{j}_{kk} holds the
        slot's columns' values at K = 4*k4 + kk."""
        stmts = []
        for j in range(self.rn):
            stmts += _b_slot(b, self.op, k4, nc[j], self.vec, f"w{name}_{j}")
            for kk in range(4):
                vals = [_signed_byte(lvar(f"w{name}_{j}_{q}", "u32"), kk) for q in range(self.vec)]
                stmts.append(Let(f"{name}_{j}_{kk}", kir.vec4(*vals) if self.vec == 4 else vals[0]))
        return stmts

    def fmas(self, i: int, av, name: str) -> list:
        """Row i's 4 values of A (the vec4f `av`) times the slots' unpacked B values `name`."""
        stmts = []
        if self.op.b_zero:
            row = kir.lane(av, 0) + kir.lane(av, 1) + kir.lane(av, 2) + kir.lane(av, 3)
            stmts.append(Assign(f"fs{i}", lvar(f"fs{i}", "f32") + row))
        for kk in range(4):
            a = kir.splat(kir.lane(av, kk)) if self.vec == 4 else kir.lane(av, kk)
            for j in range(self.rn):
                f = lvar(f"f{i}_{j}", self.t)
                stmts.append(Assign(f"f{i}_{j}", kir.fma(a, lvar(f"{name}_{j}_{kk}", self.t), f)))
        return stmts

    def flush(self) -> list:
        """The chunk's exact f32 sums added to the i32 accumulators (and row sums), and zeroed."""
        stmts = []
        for i in range(self.rm):
            for j in range(self.rn):
                f = lvar(f"f{i}_{j}", self.t)
                for q in range(self.vec):
                    v = kir.lane(f, q) if self.vec == 4 else f
                    stmts.append(Assign(f"acc{i}_{j}_{q}", lvar(f"acc{i}_{j}_{q}", "i32") + kir.cast(v, "i32")))
                stmts.append(Assign(f"f{i}_{j}", self.zero))
            if self.op.b_zero:
                stmts += [Assign(f"sa{i}", lvar(f"sa{i}", "i32") + kir.cast(lvar(f"fs{i}", "f32"), "i32")),
                          Assign(f"fs{i}", kir.f32(0.0))]
        return stmts

    def loop(self, var: str, stop: int, step: int, block) -> list:
        """for var in 0..stop (words of K) by `step`, flushed every EXACT_WORDS words (a multiple
        of step); block(var) is the loop's body."""
        assert EXACT_WORDS % step == 0, step
        v, kc = lvar(var, "i32"), lvar("kc", "i32")
        if stop <= EXACT_WORDS:
            return [For(var, i32(0), i32(stop), block(v), step=step)] + self.flush()
        inner = For(var, kc, kir.minimum(kc + EXACT_WORDS, i32(stop)), block(v), step=step)
        return [For("kc", i32(0), i32(stop), [inner] + self.flush(), step=EXACT_WORDS)]


def _unpacked(word):
    """A word's four signed bytes as a vec4f."""
    return kir.vec4(*(_signed_byte(word, q) for q in range(4)))


def _subgroup(op: P.MatMul, prog, cfg, limits, b: Binder):
    """CPU adapters with subgroups (lavapipe). Invocation x of the one-subgroup workgroup (S
    invocations) owns column slots n0 + x + j*S of RM rows; per block of 4*S values of K it loads
    one word of A per row (A's 4 values at 4x..), unpacks it into a vec4f, and subgroupBroadcast
    hands each to all; each B word (vec4u: a slot's 4 columns) is unpacked once for all RM rows,
    and the sums are exact f32 (EXACT_WORDS)."""
    S = cfg.workgroup_size[0]
    rm, rn, vec = cfg.tile.rows, cfg.tile.cols, cfg.vector
    M = op.m
    body, bz, a_off, n0, m0, nc, slots, K4 = _column_slots(op, cfg, S)
    sums = _F32Sums(op, rm, rn, vec)
    body += sums.decls()

    def block(k40, a_k4, words):
        """`words` words of K from word k40: each lane unpacks its word of every row, then broadcasts."""
        stmts = []
        for i in range(rm):
            stmts.append(Let(f"av{i}", _unpacked(_a_word(b, op, a_off, lvar(f"mr{i}", "i32"), a_k4))))
        for src in range(words):
            stmts += sums.b_values(b, k40 + src, nc, f"bv{src}")
            for i in range(rm):
                stmts.append(Let(f"s{i}_{src}", kir.subgroup_broadcast(lvar(f"av{i}", "vec4f"), src)))
                stmts += sums.fmas(i, lvar(f"s{i}_{src}", "vec4f"), f"bv{src}")
        return stmts
    main = K4 - K4 % S
    if main:
        body += sums.loop("k40", main, S, lambda k40: block(k40, k40 + lid(), S))
    if K4 % S:   # the tail (a chunk of its own): lanes past its end re-read its last word (never broadcast)
        tail = K4 % S
        body.append(kir.For("tail", i32(0), i32(1),
                            block(i32(main), main + kir.minimum(lid(), tail - 1), tail), unroll=True))
        body += sums.flush()
    body += _store(op, b, bz, _block_values(op, rm, rn, vec, m0, n0, S))
    return body, [], (-(-slots // (S * rn)), -(-M // rm), max(numel(op.batch), 1))


def _registers(op: P.MatMul, prog, cfg, limits, b: Binder):
    """Invocation x owns column slots n0 + x + j*WX of RM rows; per word of K it packs each row's
    word of A (alike in every invocation) and loads each slot's words of B."""
    wx = cfg.workgroup_size[0]
    rm, rn, vec = cfg.tile.rows, cfg.tile.cols, cfg.vector
    M = op.m
    body, bz, a_off, n0, m0, nc, slots, K4 = _column_slots(op, cfg, wx)
    k4 = lvar("k4", "i32")
    step = []
    a = []
    for i in range(rm):
        step.append(Let(f"aw{i}", _a_word(b, op, a_off, lvar(f"mr{i}", "i32"), k4)))
        a.append(lvar(f"aw{i}", "u32"))
        step += _add_row_sum(op, i, a[i])
    bw = []
    for j in range(rn):
        step += _b_slot(b, op, k4, nc[j], vec, f"bw{j}")
        bw.append([lvar(f"bw{j}_{q}", "u32") for q in range(vec)])
    step += _multiply(rm, rn, vec, a, bw)
    body.append(For("k4", i32(0), i32(K4), step))
    body += _store(op, b, bz, _block_values(op, rm, rn, vec, m0, n0, wx))
    return body, [], (-(-slots // (wx * rn)), -(-M // rm), max(numel(op.batch), 1))


def _shared(op: P.MatMul, prog, cfg, limits, b: Binder):
    """GPUs: (WY*RM) x (WX*RN) outputs per workgroup, K in steps of TK values (TK/4 words): the
    words of A (packed as they are copied) and of B go through workgroup memory."""
    wx, wy, _ = cfg.workgroup_size
    rm, rn, tk = cfg.tile.rows, cfg.tile.cols, cfg.tile.k_step
    tk4 = max(1, tk // 4)
    tm, tn = wy * rm, wx * rn
    M, N, K = op.m, op.n, op.k
    K4 = K // 4
    nthreads = wx * wy
    bz = kir.cast(kir.WID[2], "i32")
    tx, ty, li = lid(0), lid(1), kir.cast(kir.LINDEX, "i32")
    body = [Let("a_off", bz * (M * K) if op.batch else i32(0)),
            Let("m0", kir.cast(kir.WID[1], "i32") * tm), Let("n0", kir.cast(kir.WID[0], "i32") * tn)]
    a_off, m0, n0, k40 = lvar("a_off", "i32"), lvar("m0", "i32"), lvar("n0", "i32"), lvar("k40", "i32")
    for i in range(rm):
        for j in range(rn):
            body.append(Decl(f"acc{i}_{j}", "i32", i32(0)))
    body += _sums(op, rm)
    zero = kir.const(0, "u32")

    def copy(shared, rows, word, bound, k_fastest):
        """shared[kk4 * rows + r] = word(r, k4) for this step's words, 0 outside the matrix."""
        stmts = []
        total = tk4 * rows
        for s in range(-(-total // nthreads)):
            idx = li + s * nthreads
            r, kk4 = (idx // tk4, idx % tk4) if k_fastest else (idx % rows, idx // rows)
            inb = kir.binary("and", bound(r), k40 + kk4 < K4)
            st = [If(inb, [SStore(shared, kk4 * rows + r, word(r, k40 + kk4))], [SStore(shared, kk4 * rows + r, zero)])]
            stmts += st if (s + 1) * nthreads <= total else [If(idx < total, st)]
        return stmts
    inner = copy("As", tm, lambda r, k4: _a_word(b, op, a_off, m0 + r, k4), lambda r: m0 + r < M, True)
    inner += copy("Bs", tn, lambda c, k4: _b_word(b, op, k4, n0 + c), lambda c: n0 + c < N, False)
    inner.append(Barrier())
    for kk4 in range(tk4):
        a = [kir.sload("As", kk4 * tm + ty + i * wy, "u32") for i in range(rm)]
        bw = [kir.sload("Bs", kk4 * tn + tx + j * wx, "u32") for j in range(rn)]
        for i in range(rm):
            inner += _add_row_sum(op, i, a[i])
            for j in range(rn):
                inner.append(Assign(f"acc{i}_{j}", kir.dot4i8(a[i], bw[j]) + lvar(f"acc{i}_{j}", "i32")))
    inner.append(Barrier())
    body.append(For("k40", i32(0), i32(K4), inner, step=tk4))
    body += _store(op, b, bz, [(_result(op, f"acc{i}_{j}", f"sa{i}"), m0 + ty + i * wy, n0 + tx + j * wx)
                               for i in range(rm) for j in range(rn)])
    shared = [kir.SharedArray("As", "u32", tk4 * tm), kir.SharedArray("Bs", "u32", tk4 * tn)]
    return body, shared, (-(-N // tn), -(-M // tm), max(numel(op.batch), 1))


def _split_k(op: P.MatMul, prog, cfg, limits, b: Binder):
    """GPUs, small outputs with a long K: WX x WY x KS invocations a WY x WX output tile, slice z
    taking every KS-th step of TK values (TK/4 words); the KS partial sums (and row sums) meet in
    workgroup memory."""
    wx, wy, ks = cfg.workgroup_size
    tk4 = max(1, cfg.tile.k_step // 4)
    M, N, K = op.m, op.n, op.k
    K4 = K // 4
    per = wx * wy
    steps = -(-K4 // (tk4 * ks))
    bz = kir.cast(kir.WID[2], "i32")
    tx, ty, tz = lid(0), lid(1), lid(2)
    li = tx + ty * wx
    body = [Let("a_off", bz * (M * K) if op.batch else i32(0)),
            Let("m0", kir.cast(kir.WID[1], "i32") * wy), Let("n0", kir.cast(kir.WID[0], "i32") * wx),
            Decl("acc", "i32", i32(0))] + _sums(op, 1)
    a_off, m0, n0, kb = lvar("a_off", "i32"), lvar("m0", "i32"), lvar("n0", "i32"), lvar("kb", "i32")
    a_sh, b_sh = tz * (tk4 * wy), tz * (tk4 * wx)
    zero = kir.const(0, "u32")

    def fill(shared, base, rows, word, bound, k_fastest):
        return slice_fill(shared, base, rows, tk4, per, li, kb, K4, word, bound, k_fastest, zero)
    inner = [Let("kb", (lvar("s", "i32") * ks + tz) * tk4)]
    inner += fill("As", a_sh, wy, lambda r, k4: _a_word(b, op, a_off, m0 + r, k4), lambda r: m0 + r < M, True)
    inner += fill("Bs", b_sh, wx, lambda c, k4: _b_word(b, op, k4, n0 + c), lambda c: n0 + c < N, False)
    inner.append(Barrier())
    for kk4 in range(tk4):
        a = kir.sload("As", a_sh + kk4 * wy + ty, "u32")
        inner += _add_row_sum(op, 0, a)
        inner.append(Assign("acc", kir.dot4i8(a, kir.sload("Bs", b_sh + kk4 * wx + tx, "u32")) + lvar("acc", "i32")))
    inner.append(Barrier())
    body.append(For("s", i32(0), i32(steps), inner))
    body += split_k_store(op, b, _result(op, "acc", "sa0"), "i32", ks, per, li, tz, m0 + ty, n0 + tx, bz)
    shared = [kir.SharedArray("As", "u32", ks * tk4 * wy), kir.SharedArray("Bs", "u32", ks * tk4 * wx),
              kir.SharedArray("red", "i32", ks * per)]
    return body, shared, (-(-N // wx), -(-M // wy), max(numel(op.batch), 1))


def check(strategy: Strategy, op: P.MatMul) -> str | None:
    """Why `strategy` cannot build this integer product (None: it can)."""
    if strategy == Strategy.TILED_SHARED_VEC4:
        return "multiplies f32 lanes; an integer product takes tiled-shared or split-k"
    if op.k % 4 or op.trans_a or op.trans_b or op.b_batch or op.alpha != 1.0:
        return "needs K a multiple of 4, A row-major and B as one matrix of words"
    return None


PACK_UNROLL = 16       # up to this many words an invocation packs: on GPUs their loads issued together


def range_unroll(limits: dict) -> int:
    """vec4 loads in flight per invocation in the range-pack's scan."""
    return 4 if limits.get("device_class") == "cpu" else 8


def scale_and_zero_point(lo, nh, wg: int, shared: tuple, names: tuple, li=None) -> list:
    """Statements reducing each invocation's minima `lo` of x and `nh` of -x across the workgroup
    (one tree, into the two workgroup arrays `shared`), then binding DynamicQuantizeLinear's
    x_min, neg_max, scale and zero point to `names` (ir/program.py's arithmetic): the range-pack's
    and the product that quantizes its own A (_quantizing) compute them alike, so their words
    are the same bits."""
    lo_s, nh_s = shared
    x_min, neg_max, scale, zp = names
    body = tree(lo_s, wg, min_nan, lo, "f32", twin=(nh_s, nh), li=li)     # both minima in one tree's steps
    body += [Let(x_min, kir.minimum(kir.sload(lo_s, i32(0), "f32"), kir.f32(0.0))),
             Let(neg_max, kir.minimum(kir.sload(nh_s, i32(0), "f32"), kir.f32(0.0)))]
    body += [Let(scale, P.dynamic_quant_scale(lvar(x_min, "f32"), lvar(neg_max, "f32")))]
    return body + [Let(zp, P.dynamic_quant_zero_point(lvar(x_min, "f32"), lvar(scale, "f32")))]


def build_quantize_words(op: P.QuantizeWords, prog, cfg, limits, b: Binder):
    """DynamicQuantizeLinear's range, parameters and packed words (P.QuantizeWords) in one
    dispatch, 'range-pack': every workgroup reduces the whole of x (the minima of x and of -x, as
    the two-dispatch form's Reduce does, NaN kept), so each knows the scale without a second
    dispatch, then packs its own `per` words per invocation; workgroup 0 stores the scale and the
    zero point after the words. A GPU runs a few workgroups, each re-reading x from its cache; a
    CPU renderer one per core or so (config.py _range_pack).

    On a GPU each workgroup streams all of x through one compute unit, so the scan is written for
    loads in flight: range_unroll vec4 loads an iteration with no branch between them, and the
    words' loads likewise before their stores (a load inside an `if` waits for the branch).

    Where x's producer reduced the range (op.partials: kernels/quant_range.py), each workgroup
    reads the producer's workgroups' minima instead, and scans x only where none were stored."""
    wg, per = cfg.workgroup_size[0], cfg.tile.words
    n4 = op.n // 4
    out = b.name(op.out)
    inf = kir.const(float("inf"), "f32")
    # a GPU's loads go out together, with no branch between them (an index past the end reads the
    # last vec4 again, which changes neither minimum); a CPU renderer's stay guarded (SwiftShader
    # in Chromium did not finish compiling the branch-free form of a BERT's range-packs in 30 s)
    gpu, unroll = limits.get("device_class") != "cpu", range_unroll(limits)
    body, loads, mins = [], [], []
    for u in range(unroll):
        lo, nh, v = lvar(f"lo{u}", "f32"), lvar(f"nh{u}", "f32"), lvar(f"v{u}", "vec4f")
        body += [Decl(f"lo{u}", "f32", inf), Decl(f"nh{u}", "f32", inf)]
        at = lvar("i", "i32") + u * wg
        step = [a for q in range(4) for a in (Assign(f"lo{u}", min_nan(lo, kir.lane(v, q))),
                                              Assign(f"nh{u}", min_nan(nh, -kir.lane(v, q))))]
        if gpu:
            loads.append(Let(f"v{u}", b.load4(op.x, at if u == 0 else kir.minimum(at, i32(n4 - 1)))))
            mins += step
        else:
            step = [Let(f"v{u}", b.load4(op.x, at))] + step
            mins += step if u == 0 else [If(at < n4, step)]
    scan_end = i32(n4)
    if op.partials:     # the minima x's producer stored per workgroup; none stored: the scan below
        reads, scan_end = read_range(b, op.partials, op.partials == op.x, n4, wg, "lo0", "nh0")
        body += reads
    body.append(For("i", lid(), scan_end, loads + mins, step=wg * unroll))
    lo, nh = lvar("lo0", "f32"), lvar("nh0", "f32")
    for u in range(1, unroll):
        lo, nh = min_nan(lo, lvar(f"lo{u}", "f32")), min_nan(nh, lvar(f"nh{u}", "f32"))
    body += scale_and_zero_point(lo, nh, wg, ("red", "red1"), ("x_min", "neg_max", "scale", "zp"))
    scale, zp = lvar("scale", "f32"), lvar("zp", "i32")

    def q(val):     # q - 128: the signed byte a word holds
        return P.dynamic_quant_value(val, scale, zp) - 128

    word = lambda xw: kir.pack4i8(*(q(kir.lane(xw, k)) for k in range(4)))
    base = linear_wid() * (wg * per) + lid()
    if gpu and per <= PACK_UNROLL:      # every load, then every store (the stores' guard after the loads)
        ragged = n4 % (wg * per) != 0
        for j in range(per):
            body += [Let(f"w{j}", base + j * wg),
                     Let(f"xw{j}", b.load4(op.x, kir.minimum(lvar(f"w{j}", "i32"), i32(n4 - 1)) if ragged else lvar(f"w{j}", "i32")))]
        for j in range(per):
            w = lvar(f"w{j}", "i32")
            st = Store(out, w, epilogue(op, b, word(lvar(f"xw{j}", "vec4f")), w))
            body.append(If(w < n4, [st]) if ragged else st)
    else:       # a CPU renderer's form (and a GPU's beyond PACK_UNROLL words), byte for byte as before
        w = lvar("w", "i32")
        body.append(For("j", i32(0), i32(per), [
            Let("w", linear_wid() * (wg * per) + lvar("j", "i32") * wg + lid()),
            If(w < n4, [Let("xw", b.load4(op.x, w)), Store(out, w, epilogue(op, b, word(lvar("xw", "vec4f")), w))])]))
    first = kir.binary("and", kir.binary("eq", linear_wid(), i32(0)), kir.binary("eq", lid(), i32(0)))
    body.append(If(first, [Store(out, i32(n4), epilogue(op, b, kir.bitcast(scale, "u32"), i32(n4))),
                           Store(out, i32(n4 + 1), epilogue(op, b, kir.cast(zp, "u32"), i32(n4 + 1)))]))
    shared = [kir.SharedArray("red", "f32", wg), kir.SharedArray("red1", "f32", wg)]
    return body, shared, grid_for(-(-n4 // (wg * per)), limits)
