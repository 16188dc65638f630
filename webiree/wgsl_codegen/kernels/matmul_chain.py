"""Two chained products in one dispatch (ir/program.py MatMulChain; compiler/passes.py
fuse_matmul_chains): out = epilogue(mid(A @ B1) @ B2), MobileBERT's feed-forward pairs.

A workgroup of T invocations owns R consecutive rows of A (`ChainTile`). In `chain-shared`:

1. it copies A's R rows into workgroup memory (`As`, vec4s along K);
2. each invocation computes vec4 column slots of the intermediate, RN at a time (slots
   li + j*T of a chunk of T*RN), over all of K, applies the first product's epilogue (`mid`:
   bias, activation) and writes them to workgroup memory (`Hs`, R rows of H);
3. each invocation computes RN vec4 column slots of the result from `Hs` and B2; with
   `slices` > 1 the invocations split H into that many parts, whose partial sums meet in
   workgroup memory (`red`) before slice 0 applies the second epilogue and stores.

`chain-subgroup` (CPU adapters whose workgroup is one subgroup, as kernels/matmul.py's
subgroup-broadcast product) keeps no copy of A: each invocation loads one vec4 of a row's next 4 x S
values of K (of the intermediate's row from `Hs` in step 3) and subgroupBroadcast hands it to all,
so workgroup memory holds only the intermediate, and more rows fit (8 of MobileBERT's in
WebGPU's default 16 KiB, each vec4 of B then serving 8 rows). With `parts` > 1 it computes the
intermediate a part of H at a time, the result's partial sums kept in workgroup memory (`Ys`)
between parts (slower on lavapipe than fewer rows in one part: config.py chooses parts only where
not one row fits).

The intermediate never reaches a buffer: one dispatch instead of two, B1 and B2 read once per
workgroup (from the cache on every adapter we run on), every load a vec4 (K, H and N are
multiples of 4: the pass checks). chain-shared's K and H loops step `unroll` vec4s at a time.
A residual of A in the second epilogue is read from a vec4 of A (`_residual`).
"""

from __future__ import annotations

import dataclasses

from ...ir import kir
from ...ir import program as P
from ...ir.kir import Assign, Barrier, Decl, For, If, Let, SStore, Store, f32, i32, lvar
from .common import Binder, Strategy, apply_epilogue, grid_for, lid, linear_wid


def shared_bytes(op: P.MatMulChain, cfg) -> int:
    """The workgroup memory the kernel declares for this configuration."""
    t, (rows, cols, slices, _, parts) = cfg.workgroup_size[0], cfg.tile
    if cfg.strategy == Strategy.CHAIN_SUBGROUP:
        return 4 * rows * (op.h // parts + (op.n if parts > 1 else 0))
    red = slices * rows * (t // slices) * cols * 16 if slices > 1 else 0
    return 4 * rows * (op.k + op.h) + red


def check(strategy: Strategy, op: P.MatMulChain, limits: dict, cfg=None) -> str | None:
    """Why `strategy` (and, given, this configuration of it) cannot build the chain on this target
    (None: it can)."""
    sub = strategy == Strategy.CHAIN_SUBGROUP
    if strategy not in (Strategy.CHAIN_SHARED, Strategy.CHAIN_SUBGROUP):
        return "is not a strategy of chained products"
    if sub and limits.get("subgroup_size", 0) not in (4, 8, 16):
        return "needs an adapter that runs a workgroup of 4, 8 or 16 invocations as one subgroup"
    if cfg is None:
        return None
    t = cfg.workgroup_size[0]
    rows, cols, slices, unroll, parts = cfg.tile
    if sub and limits["subgroup_size"] != t:
        return f"needs a workgroup of the subgroup's {limits['subgroup_size']} invocations"
    if sub and (slices != 1 or unroll != 1):
        return "neither splits H nor unrolls (its K steps are 4 x the subgroup size)"
    if (op.h // 4) % parts or (parts > 1 and not sub):
        return "computes the intermediate in parts only in the subgroup kernel, each a whole number of vec4s"
    if t > min(limits["max_compute_invocations_per_workgroup"], limits["max_compute_workgroup_size_x"]):
        return f"needs {t} invocations per workgroup"
    need = shared_bytes(op, cfg)
    if need > limits["max_compute_workgroup_storage_size"]:
        return f"needs {need:,} bytes of workgroup memory"
    if slices > 1 and (t % slices or (op.h // 4) % slices or (t // slices) * cols < op.n // 4):
        return "splits H only where every slice's invocations cover N's vec4s in one pass"
    if (op.k // 4) % unroll or (op.h // 4 // slices) % unroll:
        return "unrolls by a divisor of K's and of a slice's H vec4s"
    return None


RESIDUAL = kir.var("residual", "f32")     # the epilogue's read of A at its own element (see _residual)


def _residual(op: P.MatMulChain, prog) -> P.MatMulChain:
    """The chain with its epilogue's reads of A at the element it computes (the feed-forward block's
    residual: x has the result's shape) written as RESIDUAL, which _result_stores takes from a vec4
    of A: A then keeps its one vec4 binding (a scalar one beside it would be a second writable
    binding of one buffer, which WebGPU rejects), so the kernel's loads of A stay vec4 loads. Any
    other read of A keeps one scalar binding, its vec4 loads then four scalar ones."""
    if op.epilogue is None:
        return op
    reads = [ld for ld in kir.loads_of(op.epilogue) if prog.root(ld.attr) == prog.root(op.a)]
    if reads and op.n == op.k and all(ld.args[0] is P.O and ld.dtype == "f32" for ld in reads):
        return dataclasses.replace(op, epilogue=kir.substitute(op.epilogue, {ld: RESIDUAL for ld in reads}))
    return op


def build_matmul_chain(op: P.MatMulChain, prog, cfg, limits, b: Binder):
    op = _residual(op, prog)
    if op.epilogue is not None and any(prog.root(ld.attr) == prog.root(op.a) for ld in kir.loads_of(op.epilogue)):
        b.name(op.a)    # A read elsewhere by the epilogue: its one binding is the scalar one
    if cfg.strategy == Strategy.CHAIN_SUBGROUP:
        return _build_subgroup(op, prog, cfg, limits, b)
    return _build_shared(op, prog, cfg, limits, b)


def _rows(op: P.MatMulChain, R: int) -> tuple[list, list]:
    """The statements naming the workgroup's first row m0 and its R rows (clamped to the last: rows
    past M are computed, never stored), and the row variables."""
    body = [Let("m0", linear_wid() * R)]
    m0 = lvar("m0", "i32")
    body += [Let(f"row{i}", kir.minimum(m0 + i, op.m - 1)) for i in range(R)]
    return body, [lvar(f"row{i}", "i32") for i in range(R)]


def _fma_block(acc: str, R: int, x_of, w_names: list) -> list:
    """acc{i}_{j} += splat(x_of(i)) * w_j for every row i and slot j."""
    out = []
    for i in range(R):
        a = kir.splat(x_of(i))
        for j, w in enumerate(w_names):
            name = f"{acc}{i}_{j}"
            out.append(Assign(name, kir.fma(a, lvar(w, "vec4f"), lvar(name, "vec4f"))))
    return out


def _slots(prefix: str, acc: str, base, li, T: int, RN: int, R: int, count: int, init=None) -> tuple[list, list, list]:
    """An invocation's RN vec4 slots base + li + j*T of `count` (the raw index, and clamped to the
    last for loads) and their zeroed (or `init(i, j)`) accumulators acc{i}_{j}."""
    body, raw, clamped = [], [], []
    for j in range(RN):
        body.append(Let(f"{prefix}s{j}", base + li + j * T))
        body.append(Let(f"{prefix}c{j}", kir.minimum(lvar(f"{prefix}s{j}", "i32"), count - 1)))
        raw.append(lvar(f"{prefix}s{j}", "i32"))
        clamped.append(lvar(f"{prefix}c{j}", "i32"))
        for i in range(R):
            body.append(Decl(f"{acc}{i}_{j}", "vec4f", kir.splat(f32(0.0)) if init is None else init(i, j)))
    return body, raw, clamped


def _mid_values(op: P.MatMulChain, b: Binder, acc, row, slot):
    """The intermediate's vec4 at (row, vec4 column `slot`) after the first product's epilogue."""
    lanes = []
    for q in range(4):
        col = slot * 4 + q
        lanes.append(apply_epilogue(op.mid, b, kir.lane(acc, q), row * op.h + col, [(row, col, op.h)]))
    return kir.vec4(*lanes)


def _result_stores(op: P.MatMulChain, b: Binder, m0, R: int, raw_slots: list, value_of) -> list:
    """Each (row, slot) of the block through the second epilogue, where inside the result."""
    out, st = b.name(op.out), []
    residual = op.epilogue is not None and any(n is RESIDUAL for n in kir.walk(op.epilogue))
    for j, ns in enumerate(raw_slots):
        for i in range(R):
            v = value_of(i, j)
            lanes = [Let(f"ra{i}_{j}", b.load4(op.a, (m0 + i) * (op.n // 4) + ns))] if residual else []
            for q in range(4):
                col = ns * 4 + q
                o = (m0 + i) * op.n + col
                e = apply_epilogue(op.epilogue, b, kir.lane(v, q), o, [(m0 + i, col, op.n)])
                if residual:
                    e = kir.substitute(e, {RESIDUAL: kir.lane(lvar(f"ra{i}_{j}", "vec4f"), q)})
                lanes.append(Store(out, o, e))
            st.append(If(kir.binary("and", m0 + i < op.m, ns < op.n // 4), lanes))
    return kir.share_reads(st, {out})


def _build_shared(op: P.MatMulChain, prog, cfg, limits, b: Binder):
    """chain-shared (see the module docstring)."""
    T = cfg.workgroup_size[0]
    R, RN, Z, U = cfg.tile[:4]
    M, K, H, N = op.m, op.k, op.h, op.n
    K4, H4, N4 = K // 4, H // 4, N // 4
    li = lid()
    body, rows = _rows(op, R)
    m0 = lvar("m0", "i32")

    # 1. A's rows into workgroup memory
    for step in range(-(-(R * K4) // T)):
        idx = li + step * T
        r, k4 = idx // K4, idx % K4
        st = SStore("As", idx, b.load4(op.a, kir.minimum(m0 + r, M - 1) * K4 + k4))
        body.append(st if (step + 1) * T <= R * K4 else If(idx < R * K4, [st]))
    body.append(Barrier())

    def product(acc, src, n_src, b_name, slots, k_var, slot_vars):
        """U vec4s of the contraction index from k_var: acc{i}_{j} += src[i][4 values] x rows of
        B (vec4 slots `slot_vars` of a row of `slots`)."""
        stmts = []
        for u in range(U):
            kk = k_var + u
            stmts += [Let(f"x{u}_{i}", kir.sload(src, i * n_src + kk, "vec4f")) for i in range(R)]
            for q in range(4):
                w = [f"w{u}_{q}_{j}" for j in range(len(slot_vars))]
                stmts += [Let(w[j], b.load4(b_name, (kk * 4 + q) * slots + s)) for j, s in enumerate(slot_vars)]
                stmts += _fma_block(acc, R, lambda i: kir.lane(lvar(f"x{u}_{i}", "vec4f"), q), w)
        return stmts

    # 2. the intermediate: chunks of T * RN slots of H
    c = lvar("c", "i32")
    chunk, raw, slots = _slots("h", "h", c * (T * RN), li, T, RN, R, H4)
    chunk.append(For("k4", i32(0), i32(K4), product("h", "As", K4, op.b1, H4, lvar("k4", "i32"), slots), step=U))
    for j, hs in enumerate(raw):
        writes = [SStore("Hs", i * H4 + hs, _mid_values(op, b, lvar(f"h{i}_{j}", "vec4f"), rows[i], hs))
                  for i in range(R)]
        chunk += [If(hs < H4, writes)] if H4 % (T * RN) else writes
    chunks = -(-H4 // (T * RN))
    body.append(For("c", i32(0), i32(chunks), chunk, unroll=chunks == 1))
    body.append(Barrier())

    # 3. the result: slice z of the invocations takes H's vec4s [z * H4 / Z, (z + 1) * H4 / Z)
    P2 = T // Z
    z, p = (li // P2, li % P2) if Z > 1 else (i32(0), li)
    d = lvar("d", "i32")
    result, oraw, oslots = _slots("n", "y", d * (P2 * RN), p, P2, RN, R, N4)
    hz = H4 // Z
    result.append(For("h4", z * hz, z * hz + hz, product("y", "Hs", H4, op.b2, N4, lvar("h4", "i32"), oslots), step=U))
    if Z == 1:
        result += _result_stores(op, b, m0, R, oraw, lambda i, j: lvar(f"y{i}_{j}", "vec4f"))
        chunks2 = -(-N4 // (P2 * RN))
        body.append(For("d", i32(0), i32(chunks2), result, unroll=chunks2 == 1))
        shared = []
    else:   # one pass over N (check): the slices' partial sums meet in workgroup memory
        width = P2 * RN
        red = lambda zz, i, j: (zz * R + i) * width + p + j * P2  # noqa: E731
        result += [SStore("red", red(z, i, j), lvar(f"y{i}_{j}", "vec4f")) for j in range(RN) for i in range(R)]
        result.append(Barrier())

        def total(i, j):
            s = kir.sload("red", red(i32(0), i, j), "vec4f")
            for zz in range(1, Z):
                s = s + kir.sload("red", red(i32(zz), i, j), "vec4f")
            return s
        result.append(If(li < P2, _result_stores(op, b, m0, R, oraw, total)))
        body.append(For("d", i32(0), i32(1), result, unroll=True))
        shared = [kir.SharedArray("red", "vec4f", Z * R * width)]
    shared = [kir.SharedArray("As", "vec4f", R * K4), kir.SharedArray("Hs", "vec4f", R * H4)] + shared
    return body, shared, grid_for(-(-M // R), limits)


def _build_subgroup(op: P.MatMulChain, prog, cfg, limits, b: Binder):
    """chain-subgroup (see the module docstring): with `parts` > 1 the intermediate is computed a
    part of H at a time (its R x H/parts values in `Hs`), the second product's partial sums kept
    in workgroup memory (`Ys`, each invocation its own slots) between parts, so more rows fit."""
    T = cfg.workgroup_size[0]
    R, RN, parts = cfg.tile.rows, cfg.tile.cols, cfg.tile.parts
    M, K, H, N = op.m, op.k, op.h, op.n
    K4, H4, N4 = K // 4, H // 4, N // 4
    P4 = H4 // parts                        # a part's vec4s of H
    li = lid()
    body, rows = _rows(op, R)
    m0 = lvar("m0", "i32")
    part = lvar("part", "i32") if parts > 1 else i32(0)

    def broadcast_product(acc, load_x, n4, b_name, b_row0, slots, slot_vars):
        """The contraction over n4 vec4s in steps of 4 x T values: invocation li loads vec4 k0/4 +
        li of each row (load_x(i, k4)), subgroupBroadcast hands it to all; B's rows from b_row0. A
        tail shorter than a step re-reads its last vec4 past its end (never broadcast)."""
        def block(k4_0, mine, steps):
            stmts = [Let(f"xv{i}", load_x(i, mine)) for i in range(R)]
            for kk in range(steps):
                src, q = kk // 4, kk % 4
                w = [f"w{kk}_{j}" for j in range(len(slot_vars))]
                stmts += [Let(w[j], b.load4(b_name, (b_row0 + k4_0 * 4 + kk) * slots + s)) for j, s in enumerate(slot_vars)]
                if q == 0:
                    stmts += [Let(f"s{i}_{src}", kir.subgroup_broadcast(lvar(f"xv{i}", "vec4f"), src)) for i in range(R)]
                stmts += _fma_block(acc, R, lambda i: kir.lane(lvar(f"s{i}_{src}", "vec4f"), q), w)
            return stmts
        kb = lvar(f"{acc}k", "i32")
        main, out = n4 - n4 % T, []
        if main:
            out.append(For(f"{acc}k", i32(0), i32(main), block(kb, kb + li, 4 * T), step=T))
        if n4 % T:
            tail = n4 % T
            out.append(For(f"{acc}t", i32(0), i32(1), block(i32(main), main + kir.minimum(li, tail - 1), 4 * tail),
                           unroll=True))
        return out

    # 1. this part of the intermediate: chunks of T * RN of its slots, over all of K
    c = lvar("c", "i32")
    chunk, raw, slots = _slots("h", "h", c * (T * RN), li, T, RN, R, P4)
    chunk += broadcast_product("h", lambda i, k4: b.load4(op.a, rows[i] * K4 + k4), K4, op.b1, i32(0), H4,
                               [part * P4 + s for s in slots])
    for j, hs in enumerate(raw):
        writes = [SStore("Hs", i * P4 + hs, _mid_values(op, b, lvar(f"h{i}_{j}", "vec4f"), rows[i], part * P4 + hs))
                  for i in range(R)]
        chunk += [If(hs < P4, writes)] if P4 % (T * RN) else writes
    chunks = -(-P4 // (T * RN))
    step = [For("c", i32(0), i32(chunks), chunk, unroll=chunks == 1), Barrier()]

    # 2. the result's partial sums over this part, from Hs and B2's rows of the part
    d = lvar("d", "i32")
    ys = lambda i, s: i * N4 + s  # noqa: E731
    init = None if parts == 1 else (lambda i, j: kir.select(part > 0, kir.sload("Ys", ys(i, lvar(f"nc{j}", "i32")), "vec4f"),
                                                            kir.splat(f32(0.0))))
    result, oraw, oslots = _slots("n", "y", d * (T * RN), li, T, RN, R, N4, init)
    result += broadcast_product("y", lambda i, h4: kir.sload("Hs", i * P4 + h4, "vec4f"), P4, op.b2, part * (4 * P4), N4,
                                oslots)
    final = _result_stores(op, b, m0, R, oraw, lambda i, j: lvar(f"y{i}_{j}", "vec4f"))
    if parts == 1:
        result += final
    else:
        keep = [If(ns < N4, [SStore("Ys", ys(i, ns), lvar(f"y{i}_{j}", "vec4f")) for i in range(R)])
                for j, ns in enumerate(oraw)]
        result.append(If(part < parts - 1, keep, final))
    chunks2 = -(-N4 // (T * RN))
    step.append(For("d", i32(0), i32(chunks2), result, unroll=chunks2 == 1))
    if parts == 1:
        body += step
    else:   # Hs is rewritten by the next part once every invocation has read it
        body.append(For("part", i32(0), i32(parts), step + [Barrier()]))
    shared = [kir.SharedArray("Hs", "vec4f", R * P4)] + ([kir.SharedArray("Ys", "vec4f", R * N4)] if parts > 1 else [])
    return body, shared, grid_for(-(-M // R), limits)
