"""Elementwise math and data movement (Generic): one invocation per output element."""

from __future__ import annotations

from ...ir import program as P
from ...ir.program import O, numel
from ...ir.kir import If, Let, Store
from .common import Binder, grid_for, linear_wid, lid


def build_generic(op: P.Generic, prog, cfg, limits, b: Binder):
    wg = cfg.workgroup_size[0]
    n = numel(prog.tensors[op.out].shape)
    out = b.name(op.out)
    value = b.expr(op.expr)
    body = [Let("o", linear_wid() * wg + lid()),
            If(O < n, [Store(out, O, value)])]
    return body, [], grid_for(-(-n // wg), limits)
