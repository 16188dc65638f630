"""Convolution: one invocation per output (or per block of output channels / row positions)."""

from __future__ import annotations

from ...ir import program as P
from ...ir.program import numel
from ...ir import kir
from ...ir.kir import Assign, Decl, For, If, Let, Store, f32, i32, lvar, select
from .common import Strategy, Binder, grid_for, linear_wid, lid, epilogue, window_loops


def _conv_row_block(op: P.Conv, prog, cfg, limits, b: Binder):
    """2-D convolution for CPU adapters: each invocation computes RW consecutive outputs of one
    output row (one output channel), loading each input value of the window's rows once for all
    RW outputs and each weight once (llvmpipe pays per load and lane: a 3x3 depthwise window
    for 4 outputs is 3 x 6 + 9 loads instead of 4 x 18)."""
    wg = cfg.workgroup_size[0]
    rw = cfg.tile.width
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
        splits = [(n * M + m, oh * OW + ow0 + j, OH * OW), ((n * M + m) * OH + oh, ow0 + j, OW)]
        store = [Store(out, o, epilogue(op, b, lvar(f"acc{j}", "f32"), o, splits))]
        work += store if OW % rw == 0 else [If(ow0 + j < OW, store)]
    body.append(If(t < total, work))
    return body, [], grid_for(-(-total // wg), limits)


def check(strategy: Strategy, op: P.Conv, limits: dict) -> str | None:
    """Why `strategy` cannot build this convolution (None: it can)."""
    if strategy == Strategy.ROW_BLOCK and len(op.x_shape) != 4:
        return "handles 2-D convolutions only"
    if strategy not in (Strategy.ROW_BLOCK, Strategy.DIRECT):
        return "is not a convolution strategy"
    return None


def build_conv(op: P.Conv, prog, cfg, limits, b: Binder):
    if cfg.strategy == Strategy.ROW_BLOCK:
        return _conv_row_block(op, prog, cfg, limits, b)
    wg = cfg.workgroup_size[0]
    cb = cfg.tile.out_channels
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
    cbody += window_loops(op.w_shape[2:], op.strides, op.dilations, op.pads, in_sp, q, inner, out_sp)
    work.append(For("c", i32(0), i32(Cg), cbody))
    out = b.name(op.out)
    for j in range(cb):
        o = (n * M + m0 + j) * S + sp
        work.append(Store(out, o, epilogue(op, b, lvar(f"acc{j}", "f32"), o, [(n * M + m0 + j, sp, S)])))
    body.append(If(t < total, work))
    return body, [], grid_for(-(-total // wg), limits)
