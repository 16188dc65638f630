"""Scaled dot-product attention in one dispatch (ir/program.py Attention; compiler/passes.py
fuse_attention): out = epilogue(softmax_j(score(alpha * Q Kᵀ)) V), the [M, S] scores and
probabilities of each batch (each head) never stored.

`attention-online` (after FlashAttention's online softmax, and FlashDecoding's split of the keys):
a workgroup of T invocations owns R = T / splits consecutive query rows of one batch (workgroup z),
`splits` invocations a row. Each holds the row's D values in registers (vec4s, lanes past D zero)
beside its own DV output sums, running maximum `m` and running sum of exponentials `l`. The keys
are taken splits x `keys` (Bc) at a time:

1. the workgroup copies the block's rows of K (read through Kt, the first product's B, and its
   prologue: heads' transposes, a bias, a scale) and of V into workgroup memory (`Ws`: K's rows,
   then V's), each invocation some of their vec4s;
2. each invocation takes its split's Bc keys of the block: their scores (vec4 products of its q
   with K's rows, then alpha and the first product's epilogue, the mask), past S as -inf, and
   their maximum; where it is above `m`, the sums so far are scaled by exp(m - m_new); then
   l += exp(s - m_new) and out += exp(s - m_new) * V's row, for each key;
3. with splits > 1, the splits' (m, l, out) meet in `Ws` and the row's first invocation adds them,
   each scaled by exp(m_split - max over the splits).

At the end out / l goes through the second product's epilogue. A row whose every score is -inf
keeps m = -inf, whose exponentials are taken against 0 instead (each 0, never NaN), and ends
with l = 0: 0 / 0, as ONNX's softmax gives NaN there, or 0 where the softmax's epilogue was the
NaN guard (`guard`; also for a NaN score, which the maximum keeps as NaN, as the softmax does).
Every invocation reaches every barrier: rows past M are computed from the last row and not stored.

Where the softmax's epilogue is another (`prob`: a head mask's factor; a float16 model's rounding
of each probability to a half is dropped by the fusion, compiler/passes.py `unrounded`), a
probability is needed whole before it is used, so the keys are walked twice: first the
row's maximum and sum (K only; the splits' meet in `Ws`), then each probability exp(s - m) / l
through the epilogue, times V's row, added to out (the splits' out then simply add).

`attention-subgroup` (CPU adapters whose workgroup of T invocations runs as one subgroup, as
kernels/matmul.py's subgroup-broadcast product): a row an invocation, the same arithmetic without
workgroup memory or barriers. A key's row of K is loaded a vec4 a lane (lane li holds vec4s li, li + T, ...)
and subgroupBroadcast hands each vec4 to every lane; likewise V's row. On llvmpipe a load of
workgroup memory, like one of a storage buffer, is a loop over the 8 lanes even where every lane
reads the same value, so attention-online's 2 * (D + DV) / 4 of them per row and key made it 2.7x
the three dispatches' time there.
"""

from __future__ import annotations

from ...ir import kir
from ...ir import program as P
from ...ir.kir import Assign, Barrier, Decl, For, If, Let, SStore, Store, f32, i32, lvar
from ...ir.sym import is_dim, upper
from .common import NEG_INF, Binder, Strategy, apply_epilogue, batch_indices, lid
from .pool_reduce import max_nan


def shared_bytes(op: P.Attention, cfg) -> int:
    """The workgroup memory the kernel declares for this configuration."""
    if cfg.strategy == Strategy.ATTENTION_SUBGROUP:
        return 0
    return 16 * _ws_size(op, cfg)


def check(strategy: Strategy, op: P.Attention, limits: dict, cfg=None) -> str | None:
    """Why `strategy` (and, given, this configuration of it) cannot build the attention on this
    target (None: it can)."""
    if strategy not in (Strategy.ATTENTION_ONLINE, Strategy.ATTENTION_SUBGROUP):
        return "is not a strategy of fused attention"
    sub = strategy == Strategy.ATTENTION_SUBGROUP
    if sub and limits.get("subgroup_size", 0) not in (4, 8, 16):
        return "needs an adapter that runs a workgroup of 4, 8 or 16 invocations as one subgroup"
    if upper(P.numel(op.batch)) > limits["max_compute_workgroups_per_dimension"]:
        return f"needs {upper(P.numel(op.batch))} workgroups along z, one a batch (a head)"
    if cfg is None:
        return None
    t = cfg.workgroup_size[0]
    if sub and t != limits["subgroup_size"]:
        return f"needs a workgroup of the subgroup's {limits['subgroup_size']} invocations"
    if t > min(limits["max_compute_invocations_per_workgroup"], limits["max_compute_workgroup_size_x"]):
        return f"needs {t} invocations per workgroup"
    need = shared_bytes(op, cfg)
    if need > limits["max_compute_workgroup_storage_size"]:
        return f"needs {need:,} bytes of workgroup memory"
    if cfg.tile.keys < 1 or cfg.tile.splits < 1 or t % cfg.tile.splits:
        return "takes at least one key a block, in splits that divide the invocations"
    if sub and cfg.tile.splits != 1:
        return "does not split the keys"
    return None


def _batch_indices(op: P.Attention):
    """(workgroup z, Q's, Kt's, V's flat batch index): their offsets are these x M*D, D*S, S*DV."""
    return batch_indices(op.batch, op.q_batch, op.k_batch, op.v_batch)


def _load_k(op: P.Attention, b: Binder, kb, d, j):
    """Kᵀ[batch kb][d, j], stored as Kt [D, S] or, `k_rows`, as K [S, D]; a prologue told its
    coordinates."""
    k_off = lvar("k_off", "i32")
    if op.k_rows:
        return b.load(op.kt, k_off + j * op.d + d, [(kb, None), (j, op.s), (d, op.d)])
    return b.load(op.kt, k_off + d * op.s + j, [(kb, None), (d, op.d), (j, op.s)])


def _vec_of(load, width: int, d4):
    """A vec4 of values load(d), d = 4 * d4 + lane, lanes past `width` zero (d4 may be computed)."""
    lanes = []
    for q in range(4):
        d = d4 * 4 + q
        if width % 4 == 0:
            lanes.append(load(d))
        else:
            lanes.append(kir.select(d < width, load(kir.minimum(d, width - 1)), f32(0.0)))
    return kir.vec4(*lanes)


def _copy(b: Binder, name: str, slots: int, width4: int, li, T: int, value_of, base: int = 0) -> list:
    """Workgroup array `name` [base .. base + slots] <- value_of(key in block, vec4 index): each
    invocation some of them, T apart."""
    out = []
    for step in range(-(-slots // T)):
        idx = li + step * T
        st = SStore(name, base + idx, value_of(idx // width4, idx % width4))
        out.append(st if (step + 1) * T <= slots else If(idx < slots, [st]))
    return out


def _rows(op: P.Attention, R: int, r):
    """The statements naming the offsets and this invocation's row (row r of the workgroup's R;
    clamped: rc), and the batch indices."""
    M, D, S, DV = op.m, op.d, op.s, op.dv
    bz, qb, kb, vb = _batch_indices(op)
    body = [Let("q_off", qb * (M * D)), Let("k_off", kb * (D * S)), Let("v_off", vb * (S * DV)),
            Let("row", kir.cast(kir.WID[0], "i32") * R + r)]
    body.append(Let("rc", kir.minimum(lvar("row", "i32"), M - 1)))
    return body, (bz, qb, kb, vb)


def _query_and_sums(op: P.Attention, b: Binder, qb) -> list:
    """The row's query vec4s q{d4}, its running maximum m, sum l and output sums acc{e4}."""
    M, D = op.m, op.d
    q_off, rc = lvar("q_off", "i32"), lvar("rc", "i32")
    body = [Let(f"q{d4}", _vec_of(lambda d: b.load(op.q, q_off + rc * D + d, [(qb, None), (rc, M), (d, D)]),
                                  D, i32(d4))) for d4 in range(-(-D // 4))]
    body += [Decl("m", "f32", kir.const(NEG_INF, "f32")), Decl("l", "f32", f32(0.0))]
    body += [Decl(f"acc{e4}", "vec4f", kir.splat(f32(0.0))) for e4 in range(-(-op.dv // 4))]
    return body


def _score(op: P.Attention, b: Binder, bz, dot, j, tail: bool):
    """A key's score from its dot product: alpha, the first product's epilogue, -inf past S."""
    rc = lvar("rc", "i32")
    s = dot * op.alpha if op.alpha != 1.0 else dot
    s = apply_epilogue(op.score, b, s, (bz * op.m + rc) * op.s + j, radix=[(bz, None), (rc, op.m), (j, op.s)])
    return kir.select(j < op.s, s, kir.const(NEG_INF, "f32")) if tail else s


def _update(block: list, scores: list, value_of, DV4: int) -> None:
    """Append the online-softmax step for a block of scores: the new maximum, the sums rescaled,
    each key's exponential added to l and, times its V row (value_of(key, e4)), to acc."""
    mb = scores[0]
    for s in scores[1:]:
        mb = max_nan(mb, s)
    m, l = lvar("m", "f32"), lvar("l", "f32")
    block.append(Let("mn", max_nan(m, mb)))
    mn = lvar("mn", "f32")
    block += [Let("mr", kir.select(kir.unary("isinf", mn), f32(0.0), mn)),    # -inf: every score so far
              Let("cr", kir.unary("exp", m - lvar("mr", "f32")))]
    mr, cr = lvar("mr", "f32"), lvar("cr", "f32")
    block.append(Assign("l", l * cr))
    block += [Assign(f"acc{e4}", lvar(f"acc{e4}", "vec4f") * kir.splat(cr)) for e4 in range(DV4)]
    for jj, s in enumerate(scores):
        block.append(Let(f"pe{jj}", kir.unary("exp", s - mr)))
        p = lvar(f"pe{jj}", "f32")
        block.append(Assign("l", l + p))
        block += [Assign(f"acc{e4}", kir.fma(kir.splat(p), value_of(jj, e4), lvar(f"acc{e4}", "vec4f")))
                  for e4 in range(DV4)]
    block.append(Assign("m", mn))


def _accumulate(op: P.Attention, b: Binder, bz, block: list, scores: list, js: list, value_of, DV4: int) -> None:
    """The second pass's step (op.prob): each key's probability exp(s - m) / l from the row's
    final maximum and sum, through the softmax's epilogue, times its V row added to acc."""
    rc, mg, l = lvar("rc", "i32"), lvar("mg", "f32"), lvar("l", "f32")
    for jj, (s, j) in enumerate(zip(scores, js)):
        p = kir.unary("exp", s - mg) / l
        p = apply_epilogue(op.prob, b, p, (bz * op.m + rc) * op.s + j, radix=[(bz, None), (rc, op.m), (j, op.s)])
        block.append(Let(f"pe{jj}", p))
        block += [Assign(f"acc{e4}", kir.fma(kir.splat(lvar(f"pe{jj}", "f32")), value_of(jj, e4),
                                             lvar(f"acc{e4}", "vec4f"))) for e4 in range(DV4)]


def _final_max() -> list:
    """After the first pass: mg, the row's maximum against which its exponentials are taken (0
    where every score is -inf: each exponential then 0, l = 0, the probabilities 0 / 0)."""
    return [Let("mg", kir.select(kir.unary("isinf", lvar("m", "f32")), f32(0.0), lvar("m", "f32")))]


def _finish(op: P.Attention, b: Binder, bz) -> list:
    """out / l (out itself after two passes) through the second product's epilogue, for a row
    inside M."""
    M, DV = op.m, op.dv
    out, row, l = b.name(op.out), lvar("row", "i32"), lvar("l", "f32")
    body = []
    if op.guard:
        body.append(Let("zero", kir.binary("or", kir.binary("eq", l, f32(0.0)), kir.unary("isnan", l))))
    if op.prob is None:
        body.append(Let("rl", f32(1.0) / l))
    stores = []
    for e in range(DV):
        v = kir.lane(lvar(f"acc{e // 4}", "vec4f"), e % 4)
        if op.prob is None:     # (two passes: the probabilities were already divided)
            v = v * lvar("rl", "f32")
        if op.guard:
            v = kir.select(lvar("zero", "bool"), f32(0.0), v)
        o = (bz * M + row) * DV + e
        stores.append(Store(out, o, apply_epilogue(op.epilogue, b, v, o, radix=[(bz, None), (row, M), (i32(e), DV)])))
    body.append(If(row < M, kir.share_reads(stores, {out})))
    return body


def _build_subgroup(op: P.Attention, prog, cfg, limits, b: Binder):
    """attention-subgroup (see the module docstring)."""
    T, Bc = cfg.workgroup_size[0], cfg.tile.keys
    M, D, S, DV = op.m, op.d, op.s, op.dv
    D4, DV4 = -(-D // 4), -(-DV // 4)
    li = lid()
    body, (bz, qb, kb, vb) = _rows(op, T, li)
    body += _query_and_sums(op, b, qb)
    v_off = lvar("v_off", "i32")
    j0 = lvar("j0", "i32")
    tail = is_dim(S) or S % Bc != 0

    def scores_of(block: list) -> list:
        """The block's Bc scores (each key's K row broadcast from the lanes' vec4s of it)."""
        out = []
        for jj in range(Bc):
            block.append(Let(f"jc{jj}", kir.minimum(j0 + jj, S - 1)))
            jc = lvar(f"jc{jj}", "i32")
            for t in range(-(-D4 // T)):        # this lane's vec4s of K's row
                mine = kir.minimum(li + t * T, D4 - 1)
                block.append(Let(f"kr{jj}_{t}", _vec_of(lambda d: _load_k(op, b, kb, d, jc), D, mine)))
            dot = None
            for d4 in range(D4):
                kv = kir.subgroup_broadcast(lvar(f"kr{jj}_{d4 // T}", "vec4f"), d4 % T)
                dot = lvar(f"q{d4}", "vec4f") * kv if dot is None else kir.fma(lvar(f"q{d4}", "vec4f"), kv, dot)
            block.append(Let(f"kq{jj}", dot))
            tv = lvar(f"kq{jj}", "vec4f")
            dsum = (kir.lane(tv, 0) + kir.lane(tv, 1)) + (kir.lane(tv, 2) + kir.lane(tv, 3))
            block.append(Let(f"sc{jj}", _score(op, b, bz, dsum, j0 + jj, tail)))
            out.append(lvar(f"sc{jj}", "f32"))
        return out

    def values_of(block: list) -> None:
        for jj in range(Bc):
            jc = lvar(f"jc{jj}", "i32")
            for t in range(-(-DV4 // T)):       # this lane's vec4s of V's row
                mine = kir.minimum(li + t * T, DV4 - 1)
                block.append(Let(f"vr{jj}_{t}", _vec_of(
                    lambda e: b.load(op.v, v_off + jc * DV + e, [(vb, None), (jc, S), (e, DV)]), DV, mine)))

    value = lambda jj, e4: kir.subgroup_broadcast(lvar(f"vr{jj}_{e4 // T}", "vec4f"), e4 % T)  # noqa: E731
    block = []
    scores = scores_of(block)
    if op.prob is None:
        values_of(block)
        _update(block, scores, value, DV4)
    else:       # first the row's maximum and sum, then the probabilities through the softmax's epilogue
        first = list(block)
        _update(first, scores, None, 0)
        body.append(For("j0", i32(0), kir.as_expr(S, "i32"), kir.rename_lets(first, "_p1"), step=Bc))
        body += _final_max()
        values_of(block)
        _accumulate(op, b, bz, block, scores, [j0 + jj for jj in range(Bc)], value, DV4)
    body.append(For("j0", i32(0), kir.as_expr(S, "i32"), block, step=Bc))
    body += _finish(op, b, bz)
    return body, [], (-(-M // T), 1, max(P.numel(op.batch), 1))


def build_attention(op: P.Attention, prog, cfg, limits, b: Binder):
    if cfg.strategy == Strategy.ATTENTION_SUBGROUP:
        return _build_subgroup(op, prog, cfg, limits, b)
    return _build_online(op, prog, cfg, limits, b)


def _build_online(op: P.Attention, prog, cfg, limits, b: Binder):
    """attention-online (see the module docstring): invocation li takes row li % rows of the
    workgroup's and, of each block of splits x Bc keys, part li / rows."""
    T, Bc, Z = cfg.workgroup_size[0], cfg.tile.keys, cfg.tile.splits
    R = T // Z
    M, D, S, DV = op.m, op.d, op.s, op.dv
    D4, DV4 = -(-D // 4), -(-DV // 4)
    li = lid()
    z = li // R if Z > 1 else i32(0)
    body, (bz, qb, kb, vb) = _rows(op, R, li % R if Z > 1 else li)
    body += _query_and_sums(op, b, qb)
    v_off = lvar("v_off", "i32")
    j0 = lvar("j0", "i32")
    keys = Z * Bc                       # a block's keys, all splits'
    kbase = keys * D4                   # Vs's place in Ws, after Ks

    def key(jj):
        """Key j0 + jj clamped to the last (a block past S reads real rows, scored -inf)."""
        return kir.minimum(j0 + jj, S - 1)

    tail = is_dim(S) or S % keys != 0
    first = z * Bc                      # this split's first key in the block
    r = li % R
    slot = lambda zz, k: (zz * R + r) * (DV4 + 1) + k  # noqa: E731   (the splits' sums in Ws, step 3)

    def scores_of(values: bool) -> tuple[list, list]:
        """1. the block's keys (and values) into workgroup memory (K's rows at Ws[0..], V's after
        them); 2. this row's scores for its split of the block."""
        block = _copy(b, "Ws", keys * D4, D4, li, T, lambda jj, d4: _vec_of(
            lambda d: _load_k(op, b, kb, d, key(jj)), D, d4))
        if values:
            block += _copy(b, "Ws", keys * DV4, DV4, li, T, lambda jj, e4: _vec_of(
                lambda e: b.load(op.v, v_off + key(jj) * DV + e, [(vb, None), (key(jj), S), (e, DV)]), DV, e4),
                base=kbase)
        block.append(Barrier())
        scores = []
        for jj in range(Bc):
            t = None
            for d4 in range(D4):
                kv = kir.sload("Ws", (first + jj) * D4 + d4, "vec4f")
                t = lvar("q0", "vec4f") * kv if t is None else kir.fma(lvar(f"q{d4}", "vec4f"), kv, t)
            block.append(Let(f"kq{jj}", t))
            tv = lvar(f"kq{jj}", "vec4f")
            dsum = (kir.lane(tv, 0) + kir.lane(tv, 1)) + (kir.lane(tv, 2) + kir.lane(tv, 3))
            block.append(Let(f"sc{jj}", _score(op, b, bz, dsum, j0 + first + jj, tail)))
            scores.append(lvar(f"sc{jj}", "f32"))
        return block, scores

    value = lambda jj, e4: kir.sload("Ws", kbase + (first + jj) * DV4 + e4, "vec4f")  # noqa: E731
    m, l = lvar("m", "f32"), lvar("l", "f32")
    if op.prob is not None:     # a first pass: the row's maximum and sum
        block, scores = scores_of(False)
        _update(block, scores, None, 0)
        block.append(Barrier())
        body.append(For("j0", i32(0), kir.as_expr(S, "i32"), kir.rename_lets(block, "_p1"), step=keys))
        if Z > 1:   # the splits' maxima and sums meet: every invocation of the row takes the row's
            body += [SStore("Ws", slot(z, i32(0)), kir.vec4(m, l, f32(0.0), f32(0.0))), Barrier()]
            body += [Assign("m", kir.const(NEG_INF, "f32"))]
            body += [Assign("m", max_nan(m, kir.lane(kir.sload("Ws", slot(i32(zz), i32(0)), "vec4f"), 0)))
                     for zz in range(Z)]
            body += [Let("mtr", kir.select(kir.unary("isinf", m), f32(0.0), m)), Assign("l", f32(0.0))]
            for zz in range(Z):
                mz = kir.sload("Ws", slot(i32(zz), i32(0)), "vec4f")
                body.append(Assign("l", kir.fma(kir.lane(mz, 1), kir.unary("exp", kir.lane(mz, 0) - lvar("mtr", "f32")), l)))
            body.append(Barrier())
        body += _final_max()
        block, scores = scores_of(True)
        _accumulate(op, b, bz, block, scores, [j0 + first + jj for jj in range(Bc)], value, DV4)
    else:
        block, scores = scores_of(True)
        _update(block, scores, value, DV4)
    block.append(Barrier())    # Ws is rewritten by the next block
    body.append(For("j0", i32(0), kir.as_expr(S, "i32"), block, step=keys))

    # 3. the splits' maxima, sums and output sums meet in workgroup memory (Ws again)
    if Z > 1:
        body.append(SStore("Ws", slot(z, i32(0)), kir.vec4(m, l, f32(0.0), f32(0.0))))
        body += [SStore("Ws", slot(z, i32(1 + e4)), lvar(f"acc{e4}", "vec4f")) for e4 in range(DV4)]
        body.append(Barrier())
        comb = [Assign(f"acc{e4}", kir.splat(f32(0.0))) for e4 in range(DV4)]
        if op.prob is None:     # each split's sums scaled to the row's maximum
            comb += [Decl("mt", "f32", kir.const(NEG_INF, "f32"))]
            for zz in range(Z):
                comb.append(Assign("mt", max_nan(lvar("mt", "f32"), kir.lane(kir.sload("Ws", slot(i32(zz), i32(0)), "vec4f"), 0))))
            comb.append(Let("mtr", kir.select(kir.unary("isinf", lvar("mt", "f32")), f32(0.0), lvar("mt", "f32"))))
            comb.append(Assign("l", f32(0.0)))
        for zz in range(Z):
            if op.prob is None:
                mz = kir.sload("Ws", slot(i32(zz), i32(0)), "vec4f")
                comb.append(Let(f"fz{zz}", kir.unary("exp", kir.lane(mz, 0) - lvar("mtr", "f32"))))
                f = lvar(f"fz{zz}", "f32")
                comb.append(Assign("l", kir.fma(kir.lane(mz, 1), f, l)))
                comb += [Assign(f"acc{e4}", kir.fma(kir.splat(f), kir.sload("Ws", slot(i32(zz), i32(1 + e4)), "vec4f"),
                                                    lvar(f"acc{e4}", "vec4f"))) for e4 in range(DV4)]
            else:               # the probabilities were final: the splits' sums add
                comb += [Assign(f"acc{e4}", lvar(f"acc{e4}", "vec4f") + kir.sload("Ws", slot(i32(zz), i32(1 + e4)), "vec4f"))
                         for e4 in range(DV4)]
        body.append(If(li < R, comb + _finish(op, b, bz)))
    else:
        body += _finish(op, b, bz)
    shared = [kir.SharedArray("Ws", "vec4f", _ws_size(op, cfg))]
    return body, shared, (-(-M // R), 1, max(P.numel(op.batch), 1))


def _ws_size(op: P.Attention, cfg) -> int:
    """attention-online's vec4s of workgroup memory: a block's K and V rows, or the splits' sums."""
    t, keys, z = cfg.workgroup_size[0], cfg.tile.keys, cfg.tile.splits
    d4, dv4 = -(-op.d // 4), -(-op.dv // 4)
    return max(z * keys * (d4 + dv4), t * (dv4 + 1) if z > 1 else 0)
