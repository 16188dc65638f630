"""Loop: one invocation per output element, folding its steps sequentially (ir/program.py)."""

from __future__ import annotations

from ...ir.program import O, numel
from ...ir import kir
from ...ir.kir import Assign, Decl, For, If, Let, Store, i32
from .common import grid_for, linear_wid, lid, epilogue
from ...ir.program import LOOP_K, Loop, acc_vars


def build_loop(op: Loop, prog, cfg, limits, b):
    """One invocation per output element, folding `count` steps sequentially."""
    wg = cfg.workgroup_size[0]
    n = numel(prog.tensors[op.out].shape)
    out = b.name(op.out)
    accs = acc_vars(op.dtypes)
    work = [Decl(a.attr, dt, b.expr(init)) for a, dt, init in zip(accs, op.dtypes, op.inits)]
    step = []
    if len(accs) == 1:
        step.append(Assign(accs[0].attr, b.expr(op.updates[0])))
    else:   # every accumulator is updated from the old values
        for a, upd in zip(accs, op.updates):
            step.append(Let(f"n{a.attr}", b.expr(upd)))
        for a in accs:
            step.append(Assign(a.attr, kir.var(f"n{a.attr}", a.dtype)))
    if op.count > 0:
        work.append(For(LOOP_K.attr, i32(0), i32(op.count), step))
    res = b.expr(op.result if op.result is not None else accs[0])
    work.append(Store(out, O, epilogue(op, b, res, O)))
    body = [Let("o", linear_wid() * wg + lid()), If(O < n, work)]
    return body, [], grid_for(-(-n // wg), limits)
