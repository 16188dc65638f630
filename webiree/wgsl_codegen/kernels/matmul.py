"""The matmul family: every strategy for a batched contraction, and the prerequisite
checks the planner (config.py) asks before choosing one."""

from __future__ import annotations

from ...ir import program as P
from ...ir.program import numel
from ...ir import kir
from ...ir.sym import dmin, is_dim
from ...ir.kir import Assign, Barrier, Decl, For, If, Let, SStore, Store, f32, i32, lvar, select
from ...errors import LimitsError
from .common import Strategy, Binder, batch_indices, lid, epilogue, slice_fill, split_k_store
from .matmul_int8 import build as build_int8, check as check_int8


def _batch_indices(op: P.MatMul):
    """(A's, B's) flat batch index for workgroup z (their offsets are these x M*K, x K*N)."""
    return batch_indices(op.batch, op.a_batch, op.b_batch)[1:]


def _load_a(b: Binder, op: P.MatMul, ab, a_off, row, k):
    """A[batch ab][row, k] (A's element offset a_off), telling a fused prologue its coordinates."""
    M, K = op.m, op.k
    if op.trans_a:
        return b.load(op.a, a_off + k * M + row, [(ab, None), (k, K), (row, M)])
    return b.load(op.a, a_off + row * K + k, [(ab, None), (row, M), (k, K)])


def _load_b(b: Binder, op: P.MatMul, bb, b_off, col, k):
    """B[batch bb][k, col] (B's element offset b_off), telling a fused prologue its coordinates."""
    N, K = op.n, op.k
    if op.trans_b:
        return b.load(op.b, b_off + col * K + k, [(bb, None), (col, N), (k, K)])
    return b.load(op.b, b_off + k * N + col, [(bb, None), (k, K), (col, N)])


def _batch_offsets(op: P.MatMul):
    """(batch index expr, A's element offset, B's element offset) for workgroup z."""
    ab, bb = _batch_indices(op)
    return kir.cast(kir.WID[2], "i32"), ab * (op.m * op.k), bb * (op.k * op.n)


def build_matmul(op: P.MatMul, prog, cfg, limits, b: Binder):
    if numel(op.batch) > limits["max_compute_workgroups_per_dimension"]:
        raise LimitsError(f"MatMul batch {numel(op.batch)} exceeds the workgroups per dimension limit")
    if op.int8:
        return build_int8(op, prog, cfg, limits, b)
    builder = {Strategy.SUBGROUP_BROADCAST: _matmul_subgroup, Strategy.TILED_SHARED_VEC4: _matmul_shared_vec4,
               Strategy.SPLIT_K: _matmul_split_k, Strategy.REGISTER_BLOCKED: _matmul_registers,
               Strategy.TILED_SHARED: _matmul_shared}[cfg.strategy]
    if cfg.aligned is None:
        return builder(op, prog, cfg, limits, b)
    # versioned on a symbolic N: the vec4 kernel where N % 4 == 0 in this run, the scalar one
    # otherwise (one uniform branch); the grid is each variant's, chosen by register arithmetic
    body1, shared1, grid1 = builder(op, prog, cfg, limits, b)
    body4, shared4, grid4 = builder(op, prog, cfg.aligned, limits, b)
    aligned = 1 - dmin(op.n % 4, 1)          # 1 where N % 4 == 0, else 0
    grid = tuple(g1 + aligned * (g4 - g1) for g1, g4 in zip(grid1, grid4))
    return [If(kir.binary("eq", kir.i32(op.n % 4), kir.i32(0)), body4, body1)], shared1 + shared4, grid


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
    rm, rn, uk = cfg.tile.rows, cfg.tile.cols, cfg.tile.k_step
    vec = cfg.vector
    M, N, K = op.m, op.n, op.k
    slots = N // vec
    acc_t = "vec4f" if vec == 4 else "f32"
    bz, a_off, b_off = _batch_offsets(op)
    ab, bb = _batch_indices(op)
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
            a = _load_a(b, op, ab, a_off, mr[i], k)
            stmts.append(Let(f"a{i}", kir.splat(a) if vec == 4 else a))
        for j in range(rn):
            if vec == 4:   # matmul_vec4_ok: B row-major, no prologue
                bv = b.load4(op.b, b_offv + k * slots + nc[j])
            else:
                bv = _load_b(b, op, bb, b_offv, nc[j], k)
            stmts.append(Let(f"b{j}", bv))
        for i in range(rm):
            for j in range(rn):
                acc = lvar(f"acc{i}_{j}", acc_t)
                stmts.append(Assign(f"acc{i}_{j}", acc + lvar(f"a{i}", acc_t) * lvar(f"b{j}", acc_t)))
        return stmts
    k0 = lvar("k0", "i32")
    main = K - K % uk
    if is_dim(K) or main:
        inner = [kir.For(f"u{kk}", i32(0), i32(1), step(k0 + kk), unroll=True) for kk in range(uk)]
        body.append(For("k0", i32(0), i32(main), inner, step=uk))
    if is_dim(K):       # a symbolic K: the remainder in a loop of its own
        body.append(For("kt", i32(main), i32(K), kir.rename_lets(step(lvar("kt", "i32")), "_kt")))
    else:
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
    tail = vec == 4 and not is_dim(N) and N % 4 != 0     # the last slot's lanes past N are not stored
    plain = vec == 4 and not tail and op.epilogue is None and op.alpha == 1.0 \
        and prog.tensors[op.out].dtype == "f32" and not b.bound_scalar(op.out)
    out = b.name(op.out, vec=plain)
    acc_t = "vec4f" if vec == 4 else "f32"
    body = []
    for name, r, c in blocks:
        o = bz * (M * N) + r * N + c * vec
        acc = lvar(name, acc_t)
        cond = kir.binary("and", r < M, c < (-(-N // 4) if tail else N // vec))
        if plain:
            body.append(If(cond, [Store(out, o // 4, acc)]))
            continue
        stores = [Let(f"o_{name}", o)]
        oo = lvar(f"o_{name}", "i32")
        for q in range(vec):
            v = kir.lane(acc, q) if vec == 4 else acc
            if op.alpha != 1.0:
                v = v * op.alpha
            row, col = bz * M + r, c * vec + q
            st = Store(out, oo + q, epilogue(op, b, v, oo + q, [(row, col, N)]))
            stores.append(If(col < N, [st]) if tail and q else st)
        body.append(If(cond, stores))
    return kir.share_reads(body, {out})     # a column's bias (or scale) read once per column


def check(strategy: Strategy, op: P.MatMul, limits: dict) -> str | None:
    """Why `strategy` cannot build this product on this target (None: it can). The planner asks
    before it chooses; `build` asks again, so a forced choice (a tuning table, a benchmark)
    that breaks a prerequisite is an error naming the strategy, never a wrong kernel."""
    wg_x, wg_y = limits["max_compute_workgroup_size_x"], limits["max_compute_workgroup_size_y"]
    inv = limits["max_compute_invocations_per_workgroup"]
    if op.int8 and check_int8(strategy, op):
        return check_int8(strategy, op)
    if strategy == Strategy.SUBGROUP_BROADCAST:
        if limits.get("subgroup_size", 0) not in (4, 8, 16):
            return "needs an adapter that runs a workgroup of 4, 8 or 16 invocations as one subgroup"
        if not matmul_subgroup_ok(op):
            return "needs A row-major with K a multiple of 4, and B not transposed"
    elif strategy == Strategy.TILED_SHARED_VEC4:
        if not matmul_subgroup_ok(op) or op.a in op.prologues:
            return "needs vec4 rows of A (K % 4 == 0, stored, not transposed) and B not transposed"
        if not matmul_vec4_ok(op) and (is_dim(op.n) or "n" in getattr(op, "symbolic", ())):
            return "needs vec4 rows of B (N % 4 == 0, stored) where N varies"
        if inv < 256 or wg_x < 16 or wg_y < 16:
            return "needs 16 x 16 invocations per workgroup"
    elif strategy == Strategy.SPLIT_K:
        if limits["max_compute_workgroup_size_z"] < 4 or inv < 256:
            return "needs 8 x 8 x 4 invocations per workgroup"
    elif strategy not in (Strategy.REGISTER_BLOCKED, Strategy.TILED_SHARED):
        return "is not a matmul strategy"
    return None


def matmul_vec4_ok(op: P.MatMul) -> bool:
    """B and C can be read and written as vec4 rows (a planning view marks the symbolic sizes that
    may not be multiples of 4 as `unaligned`: config.planning_view)."""
    return op.n % 4 == 0 and "n" not in getattr(op, "unaligned", ()) and not op.trans_b and op.b not in op.prologues


def matmul_nibbles_ok(op: P.MatMul) -> bool:
    """B is a 4-bit weight whose words the subgroup kernel reads in vec4 slots (`_nibbles`)."""
    return op.nibbles is not None and op.n % 4 == 0 and "n" not in getattr(op, "unaligned", ()) and not op.trans_b


def matmul_subgroup_ok(op: P.MatMul) -> bool:
    """A can be read as vec4 along K (row-major, K a multiple of 4; four computed values where
    a prologue produces A); B is read row by row."""
    return not op.trans_a and op.k % 4 == 0 and "k" not in getattr(op, "unaligned", ()) and not op.trans_b


def _matmul_subgroup(op: P.MatMul, prog, cfg, limits, b: Binder):
    """For CPU adapters whose workgroup of S invocations is one subgroup (lavapipe: S = 8, one SIMD
    register). There every storage load costs a scalar loop over the lanes, so each loaded value
    must be useful: invocation x owns column slots n0 + x + j*S (j < RN; a slot is a vec4 of
    columns when cfg.vector == 4, one column otherwise) of RM rows, and for each row loads
    A[row, k0 + 4x .. 4x + 3]: one vec4 load per invocation brings 4*S values of K, which
    subgroupBroadcast hands to every invocation. Measured on 128x384x1536: 31 GFLOP/s vs 12.5
    for the register-blocked kernel, which loads the same A value in every invocation."""
    S = cfg.workgroup_size[0]
    rm, rn, kb = cfg.tile.rows, cfg.tile.cols, cfg.tile.k_step   # kb = 4 * S: the K one A load covers
    vec = cfg.vector
    M, N, K = op.m, op.n, op.k
    slots, K4 = N // vec, K // 4
    acc_t = "vec4f" if vec == 4 else "f32"
    bz, a_off, b_off = _batch_offsets(op)
    ab = _batch_indices(op)[0]
    paired = _half_pairs(op, prog, b, vec, rn, slots)
    nib = _nibbles(op, prog, b, vec)
    width = S * rn // 2 if paired else S * rn      # n0 counts pairs of slots where paired
    body = [Let("a_off4", a_off // 4), Let("b_offv", b_off // (8 if paired else vec)),
            Let("n0", kir.cast(kir.WID[0], "i32") * width + lid()),
            Let("m0", kir.cast(kir.WID[1], "i32") * rm)]
    n0, m0 = lvar("n0", "i32"), lvar("m0", "i32")
    a_off4, b_offv = lvar("a_off4", "i32"), lvar("b_offv", "i32")
    mr = [kir.minimum(m0 + i, M - 1) for i in range(rm)]
    for i in range(rm):
        body.append(Let(f"ar{i}", a_off4 + mr[i] * K4))
    half = rn // 2
    if paired:      # invocation x owns the slot pairs n0 + p*S (p < RN/2): slots 2 (n0 + p*S), in
        # accumulators and B values j = p, and the slot after it, in j = p + RN/2
        pc = _slots_and_accumulators(body, n0, S, slots // 2, rm, half, acc_t)
        body += [Decl(f"acc{i}_{j}", acc_t, kir.splat(f32(0.0))) for j in range(half, rn) for i in range(rm)]
        slot_of = [2 * (n0 + (j % half) * S) + j // half for j in range(rn)]
    else:
        nc = _slots_and_accumulators(body, n0, S, slots, rm, rn, acc_t)
        slot_of = [n0 + j * S for j in range(rn)]
    ar = [lvar(f"ar{i}", "i32") for i in range(rm)]
    load_b = b.load4 if vec == 4 else b.load

    def block(k0, a_col4, steps):
        """`steps` values of K from k0: one A load per row, then broadcast and multiply."""
        stmts = [Let(f"av{i}", b.load4(op.a, ar[i] + a_col4, [(ab, None), (mr[i], M), (a_col4, K4)]))
                 for i in range(rm)]
        for kk in range(steps):
            src, q = kk // 4, kk % 4
            if paired:      # one vec4u load: 8 halves, the pair's two slots at row k0 + kk
                words = b.name(op.b, vec=True)
                for p in range(half):
                    w = f"bw{kk}_{p}"
                    stmts.append(Let(w, kir.load(words, b_offv + (k0 + kk) * (slots // 2) + pc[p], "vec4u")))
                    for h in range(2):      # words 2h and 2h + 1: the four halves of slot 2 (n0 + p*S) + h
                        lanes = [kir.lane(lvar(w, "vec4u"), 2 * h + q2 // 2) for q2 in range(4)]
                        halves = [kir.unpack_f16(x if q2 % 2 == 0 else kir.binary("shr", x, kir.const(16, "u32")))
                                  for q2, x in enumerate(lanes)]
                        stmts.append(Let(f"b{kk}_{p + h * half}", kir.vec4(*halves)))
            elif nib:
                stmts += _nibble_values(nib, b, k0, kk, kb, slots, nc)
            else:
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
    body += _store_blocks(op, prog, b, bz, [(f"acc{i}_{j}", m0 + i, slot_of[j])
                                            for i in range(rm) for j in range(rn)], vec)
    return body, [], (-(-slots // (S * rn)), -(-M // rm), max(numel(op.batch), 1))


def _half_pairs(op: P.MatMul, prog, b: Binder, vec: int, rn: int, slots) -> bool:
    """Whether the subgroup kernel reads B as vec4<u32> words, 8 halves (two slots) a load: a
    constant B stored as f16 pairs (ir/packing.py), an even number of slots a row (N % 8 == 0)
    and of slots an invocation. On lavapipe a load costs a loop over the lanes whatever its width,
    and B's halves otherwise take two u32 loads a slot where f32's take one vec4 load."""
    t = prog.tensors[prog.root(op.b)]
    return vec == 4 and rn % 2 == 0 and isinstance(slots, int) and slots % 2 == 0 and t.pack == "f16" \
        and t.table_word is None and op.b not in b.prologues and not op.trans_b


def _nibbles(op: P.MatMul, prog, b: Binder, vec: int) -> P.Nibbles | None:
    """The 4-bit weight (P.Nibbles) the subgroup kernel reads as words, eight values of K for
    four columns a vec4<u32> load, where B is its fused dequantization, read in vec4 slots, and
    the words are stored as they were laid out (None: B through its prologue, the same values)."""
    nib = op.nibbles
    if nib is None or vec != 4 or op.b not in b.prologues or op.trans_b or op.b_batch:
        return None
    t = prog.tensors[prog.root(nib.words)]
    if t.dtype != "u32" or t.pack is not None or t.table_word is not None:
        return None
    reads = {ld.attr for ld in kir.loads_of(b.prologues[op.b])}
    return nib if {nib.words, nib.scales, nib.zero_points} - {""} <= reads else None


def _nibble_values(nib: P.Nibbles, b: Binder, k0, kk: int, kb: int, slots: int, nc) -> list:
    """The subgroup kernel's B values b{kk}_{j} (vec4f) at row k0 + kk of a 4-bit weight: a word
    of eight rows and four columns loaded every eighth row, a block's scales and zero points
    every `block` rows (k0 is a multiple of kb, and kb and block are powers of 2), each value
    dequantized as B's prologue dequantizes it (P.nibble_value)."""
    stmts = []
    row, span = k0 + kk, min(nib.block, kb)
    g, floats = kk // span, nib.zero_points and b.dtype(nib.zero_points) == "f32"
    for j, n in enumerate(nc):
        if kk % 8 == 0:
            stmts.append(Let(f"bw{kk // 8}_{j}", b.load4u(nib.words, kir.binary("shr", row, i32(3)) * slots + n)))
        if kk % span == 0:
            blk = kir.binary("shr", row, i32(nib.block.bit_length() - 1))
            stmts.append(Let(f"bs{g}_{j}", b.load4(nib.scales, blk * slots + n)))
            if floats:
                stmts.append(Let(f"bz{g}_{j}", b.load4(nib.zero_points, blk * slots + n)))
            elif nib.zero_points:
                stmts += [Let(f"bz{g}_{j}_{q}", b.load(nib.zero_points, (blk * slots + n) * 4 + q)) for q in range(4)]
        lanes = []
        for q in range(4):
            v = P.nibble_of(kir.lane(lvar(f"bw{kk // 8}_{j}", "vec4u"), q), kir.const(4 * (kk % 8), "u32"))
            if not nib.zero_points:
                zero = i32(nib.zero)
            elif floats:
                zero = kir.lane(lvar(f"bz{g}_{j}", "vec4f"), q)
            else:
                zero = lvar(f"bz{g}_{j}_{q}", "i32")
            lanes.append(P.nibble_value(v, zero, kir.lane(lvar(f"bs{g}_{j}", "vec4f"), q)))
        stmts.append(Let(f"b{kk}_{j}", kir.vec4(*lanes)))
    return stmts


def _matmul_shared_vec4(op: P.MatMul, prog, cfg, limits, b: Binder):
    """GPUs, A readable as vec4 (matmul_subgroup_ok): a (16*RM) x (16*4*RN) output tile per
    workgroup of 16x16 invocations, K in steps of 8 or 16.
    Each step every invocation copies (about) one vec4 of A and one of B into workgroup
    memory, where A keeps its [row][k] layout (a vec4 holds 4 values of K) and B its
    [k][column] layout; invocation (x, y) then owns rows y*RM .. y*RM+RM-1 and the vec4
    columns x + 16j (j < RN), reading RM + 4*RN vec4s of workgroup memory per 4 values of K
    for 16*RM*RN multiply-adds. Where B's rows are not vec4 rows (not matmul_vec4_ok: N not a
    multiple of 4, as a 65 x 65 pointwise convolution's 4,225 columns, or a fused prologue on B)
    its copy gathers four values, the last slot's columns past N clamped (never stored)."""
    wx, wy, _ = cfg.workgroup_size
    rm, rn, bk = cfg.tile.rows, cfg.tile.cols, cfg.tile.k_step
    M, N, K = op.m, op.n, op.k
    N4, K4, BK4 = -(-N // 4), K // 4, bk // 4
    by_values = not matmul_vec4_ok(op)
    ab, bb = _batch_indices(op)
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
        row, col4 = kir.minimum(m0 + r, M - 1), kir.minimum(k4, K4 - 1)
        v = b.load4(op.a, a_off4 + row * K4 + col4, [(ab, None), (row, M), (col4, K4)])
        return select(k4 < K4, v, zero4)

    def b_at(idx, k0):   # row (k) idx / tn4 of the step, vec4 column idx % tn4 of the tile
        kk, c = idx // tn4, idx % tn4
        k = kir.minimum(k0 + kk, K - 1)
        if by_values:
            col = kir.minimum(n04 + c, N4 - 1) * 4
            v = kir.vec4(*(_load_b(b, op, bb, b_off_e, kir.minimum(col + q, N - 1), k) for q in range(4)))
        else:
            v = b.load4(op.b, b_off4 + k * N4 + kir.minimum(n04 + c, N4 - 1))
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
    tk = cfg.tile.k_step
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
        return slice_fill(shared, base, rows, tk, per, li, kb, K, elem, bound, k_fastest, f32(0.0))

    ab, bb = _batch_indices(op)
    a_elem = lambda r, k: _load_a(b, op, ab, a_off, m0 + r, k)  # noqa: E731
    b_elem = lambda c, k: _load_b(b, op, bb, b_off, n0 + c, k)  # noqa: E731
    inner = [Let("kb", (s * ks + tz) * tk)]
    inner += fill("As", a_sh, wy, a_elem, lambda r: m0 + r < M, not op.trans_a)
    inner += fill("Bs", b_sh, wx, b_elem, lambda c: n0 + c < N, op.trans_b)
    inner.append(Barrier())
    for kk in range(tk):
        inner.append(Assign("acc", kir.fma(kir.sload("As", a_sh + kk * wy + ty, "f32"),
                                           kir.sload("Bs", b_sh + kk * wx + tx, "f32"), lvar("acc", "f32"))))
    inner.append(Barrier())
    body.append(For("s", i32(0), i32(steps), inner))
    body += split_k_store(op, b, lvar("acc", "f32"), "f32", ks, per, li, tz, m0 + ty, n0 + tx, bz)
    shared = [kir.SharedArray("As", "f32", ks * tk * wy), kir.SharedArray("Bs", "f32", ks * tk * wx),
              kir.SharedArray("red", "f32", ks * per)]
    return body, shared, (-(-N // wx), -(-M // wy), max(numel(op.batch), 1))


def _matmul_shared(op: P.MatMul, prog, cfg, limits, b: Binder):
    """Workgroup-memory tiles: (WY*RM) x (WX*RN) outputs per workgroup, K in steps of TK."""
    wx, wy, _ = cfg.workgroup_size
    rm, rn, tk = cfg.tile.rows, cfg.tile.cols, cfg.tile.k_step
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

    ab, bb = _batch_indices(op)
    a_elem = (lambda r, k: _load_a(b, op, ab, a_off, m0 + r, k))
    b_elem = (lambda c, k: _load_b(b, op, bb, b_off, n0 + c, k))
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
            body.append(If(kir.binary("and", r < M, c < N),
                           [Store(out, o, epilogue(op, b, acc, o, [(bz * M + r, c, N)]))]))
    shared = [kir.SharedArray("As", "f32", tk * tm), kir.SharedArray("Bs", "f32", tk * tn)]
    return body, shared, (-(-N // tn), -(-M // tm), max(numel(op.batch), 1))
