"""Pooling windows and reductions (one row per workgroup, a tree in workgroup memory)."""

from __future__ import annotations

from ...ir import program as P
from ...ir.program import numel
from ...ir import kir
from ...ir.kir import Assign, Barrier, Decl, For, If, Let, SStore, Store, f32, i32, lvar, select
from .common import Binder, grid_for, linear_wid, lid, epilogue, window_loops, NEG_INF


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
    work += window_loops(op.kernel, op.strides, op.dilations, op.pads, in_sp, q, inner, out_sp)
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


def tree(shared: str, wg: int, combine, value: kir.Expr, dtype: str, extra=None, twin=None, li=None):
    """Reduce one value per invocation across the workgroup (wg a power of 2); the result ends
    in shared[0]. `extra` = (shared2, value2) carries a second lane (argmax's index); `twin` =
    (shared2, value2) is a second value reduced alike, in the same steps (one barrier a step for
    both). li: the invocation's index in the workgroup (default its x: a 1-D workgroup)."""
    li = lid() if li is None else li
    stmts = [SStore(shared, li, value)]
    if extra:
        stmts.append(SStore(extra[0], li, extra[1]))
    if twin:
        stmts.append(SStore(twin[0], li, twin[1]))
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
        if twin:
            upd.append(SStore(twin[0], li, combine(kir.sload(twin[0], li, dtype), kir.sload(twin[0], li + stride, dtype))))
        stmts.append(If(li < stride, upd))
        stmts.append(Barrier())
        stride //= 2
    return stmts


def max_nan(a, c):
    return select(kir.binary("or", c > a, kir.unary("isnan", c)), c, a)


def min_nan(a, c):
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
        work += tree("red", wg, combine, best, dt, extra=("redi", bi))
        work.append(If(kir.binary("eq", lid(), i32(0)), [Store(out, row, epilogue(op, b, kir.sload("redi", i32(0), "i32"), row))]))
        body = [If(linear_wid() < rows, work)]
        return body, shared, grid_for(rows, limits)

    if mode == "logsumexp":
        work += [Decl("m", dt, kir.const(NEG_INF, "f32"))]
        work.append(_strided_loop("r", op.r, wg, [Assign("m", max_nan(lvar("m", dt), elem))]))
        work += tree("red", wg, max_nan, lvar("m", dt), dt)
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
        combine = (max_nan if mode == "max" else min_nan) if dt == "f32" else \
            (kir.maximum if mode == "max" else kir.minimum)
    elif mode == "prod":
        init, combine = kir.const(1, dt), (lambda a, c: a * c)
    else:
        init, combine = kir.const(0, dt), (lambda a, c: a + c)
    work.append(Decl("acc", dt, init))
    work.append(_strided_loop("r", op.r, wg, [Assign("acc", combine(lvar("acc", dt), pre(elem)))]))
    work += tree("red", wg, combine, lvar("acc", dt), dt)
    res = kir.sload("red", i32(0), dt)
    if mode == "mean":
        res = res / kir.size_f32(op.r) if dt == "f32" else res / op.r
    elif mode == "l2":
        res = kir.unary("sqrt", res)
    elif mode == "logsum":
        res = kir.unary("log", res)
    elif mode == "logsumexp":
        res = lvar("shift", dt) + kir.unary("log", res)
    work.append(If(kir.binary("eq", lid(), i32(0)), [Store(out, row, epilogue(op, b, res, row))]))
    body = [If(linear_wid() < rows, work)]
    return body, shared, grid_for(rows, limits)
