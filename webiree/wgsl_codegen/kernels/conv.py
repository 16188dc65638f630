"""Convolution: one invocation per output (or per block of output channels / row positions), or,
for depthwise convolutions on GPUs, a workgroup per tile of one channel's outputs with the tile's
input window in workgroup memory."""

from __future__ import annotations

from ...ir import program as P
from ...ir.program import numel
from ...ir import kir
from ...ir.kir import Assign, Barrier, Decl, For, If, Let, SStore, Store, f32, i32, lvar, select
from ...ir.sym import Dim
from .common import Strategy, Binder, grid_for, linear_wid, lid, epilogue, window_loops


def _sizes_2d(op: P.Conv) -> tuple:
    """A 2-D convolution's N, C, H, W, M, C/group, KH, KW, M/group, OH, OW, strides, dilations
    and leading pads, in that order."""
    M = op.w_shape[0]
    return (*op.x_shape, *op.w_shape, M // op.group, *op.out_shape[2:], *op.strides, *op.dilations,
            op.pads[0], op.pads[1])


def _conv_row_block(op: P.Conv, prog, cfg, limits, b: Binder):
    """2-D convolution for CPU adapters: each invocation computes RW consecutive outputs of one
    output row (one output channel), loading each input value of the window's rows once for all
    RW outputs and each weight once (llvmpipe pays per load and lane: a 3x3 depthwise window
    for 4 outputs is 3 x 6 + 9 loads instead of 4 x 18)."""
    wg = cfg.workgroup_size[0]
    rw = cfg.tile.width
    N, C, H, W, M, Cg, KH, KW, Mg, OH, OW, sh, sw, dh, dw, ph, pw = _sizes_2d(op)
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
    weights = [Let(f"w{kh}_{kw}", b.load(op.w, lvar("wbase", "i32") + kh * KW + kw,
                                         [(m * Cg + c, M * Cg), (i32(kh), KH), (i32(kw), KW)]))
               for kh in range(KH) for kw in range(KW)]
    # the window's weights before its rows, what they share read once (a quantized convolution's
    # per-channel scale and zero point: once, not once a weight); no store precedes these reads
    cbody += kir.share_reads(weights, set())
    for kh in range(KH):
        ih = oh * sh - ph + kh * dh
        row = [Let(f"xrow{kh}", lvar("xbase", "i32") + ih * W)]
        for off in offsets:   # each input of the row once, zero outside the image
            iw = iw0 + off
            inside = kir.binary("and", iw >= 0, iw < W)
            v = b.load(op.x, lvar(f"xrow{kh}", "i32") + kir.clamp(iw, 0, W - 1))
            row.append(Let(f"x{kh}_{off}", select(inside, v, f32(0.0))))
        for kw in range(KW):
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


def depthwise_window(op: P.Conv, cfg) -> tuple[int, int]:
    """Rows and columns of the input a depthwise-shared workgroup holds: its outputs' windows."""
    tx, ty, _ = cfg.workgroup_size
    rows, width = cfg.tile
    (sh, sw), (dh, dw) = op.strides, op.dilations
    kh, kw = op.w_shape[2:]
    return (ty * rows - 1) * sh + (kh - 1) * dh + 1, (tx * width - 1) * sw + (kw - 1) * dw + 1


def _depthwise_grid(op: P.Conv, cfg) -> tuple[int, int, int]:
    tx, ty, _ = cfg.workgroup_size
    rows, width = cfg.tile
    oh, ow = op.out_shape[2:]
    return -(-ow // (tx * width)), -(-oh // (ty * rows)), op.x_shape[0] * op.w_shape[0]


def _conv_depthwise_shared(op: P.Conv, prog, cfg, limits, b: Binder):
    """2-D depthwise convolution (one input channel an output channel) for GPUs. A workgroup of
    tx x ty invocations owns a tile of one output channel, ty * rows rows of tx * width outputs:
    it copies the tile's input window into workgroup memory once (zeros outside the image, each
    input read from the buffer once a tile instead of once a window it falls in), then each
    invocation computes `rows` x `width` adjacent outputs from it, reading each value of the
    window's rows that its outputs share once, with the channel's weights in registers."""
    tx_n, ty_n, _ = cfg.workgroup_size
    rh, rw = cfg.tile
    N, C, H, W, M, _, KH, KW, Mg, OH, OW, sh, sw, dh, dw, ph, pw = _sizes_2d(op)
    ith, itw = depthwise_window(op, cfg)
    per = tx_n * ty_n
    size = ith * itw
    wz, wy, wx = (kir.cast(kir.WID[a], "i32") for a in (2, 1, 0))
    li = kir.cast(kir.LINDEX, "i32")
    body = [Let("nm", wz), Let("m", wz % M), Let("oh0", wy * (ty_n * rh)), Let("ow0", wx * (tx_n * rw))]
    nm, m, oh0, ow0 = (lvar(v, "i32") for v in ("nm", "m", "oh0", "ow0"))
    body += [Let("nc", (nm // M) * C + m // Mg), Let("ih0", oh0 * sh - ph), Let("iw0", ow0 * sw - pw)]
    nc, ih0, iw0 = (lvar(v, "i32") for v in ("nc", "ih0", "iw0"))
    for step in range(-(-size // per)):       # the window, spread over the workgroup
        idx = li + step * per
        r, c = idx // itw, idx % itw
        ih, iw = ih0 + r, iw0 + c
        ihc, iwc = kir.clamp(ih, 0, H - 1), kir.clamp(iw, 0, W - 1)
        inside = kir.binary("and", kir.binary("and", ih >= 0, ih < H), kir.binary("and", iw >= 0, iw < W))
        v = b.load(op.x, (nc * H + ihc) * W + iwc, radix=[(nc, N * C), (ihc, H), (iwc, W)])
        st = [SStore("xs", idx, select(inside, v, f32(0.0)))]
        body += st if (step + 1) * per <= size else [If(idx < size, st)]
    body.append(Barrier())
    body += kir.share_reads([Let(f"w{kh}_{kw}", b.load(op.w, m * (KH * KW) + kh * KW + kw,
                                                       [(m, M), (i32(kh), KH), (i32(kw), KW)]))
                             for kh in range(KH) for kw in range(KW)], set())    # as _conv_row_block's
    ty, tx = lid(1), lid(0)
    body += [Let("rb", ty * (rh * sh)), Let("cb", tx * (rw * sw))]
    rb, cb = lvar("rb", "i32"), lvar("cb", "i32")
    for a in range(rh):
        for j in range(rw):
            body.append(Decl(f"acc{a}_{j}", "f32", f32(0.0)))
    cols = sorted({j * sw + kw * dw for j in range(rw) for kw in range(KW)})
    for roff in sorted({a * sh + kh * dh for a in range(rh) for kh in range(KH)}):
        for coff in cols:        # each value of the row the outputs read, once
            body.append(Let(f"x{roff}_{coff}", kir.sload("xs", (rb + roff) * itw + cb + coff, "f32")))
        for a in range(rh):
            for kh in range(KH):
                if a * sh + kh * dh != roff:
                    continue
                for kw in range(KW):
                    for j in range(rw):
                        x = lvar(f"x{roff}_{j * sw + kw * dw}", "f32")
                        body.append(Assign(f"acc{a}_{j}", kir.fma(x, lvar(f"w{kh}_{kw}", "f32"),
                                                                  lvar(f"acc{a}_{j}", "f32"))))
    out = b.name(op.out)
    for a in range(rh):
        oh = oh0 + ty * rh + a
        for j in range(rw):
            ow = ow0 + tx * rw + j
            o = (nm * OH + oh) * OW + ow
            splits = [(nm, oh * OW + ow, OH * OW), (nm * OH + oh, ow, OW)]
            store = [Store(out, o, epilogue(op, b, lvar(f"acc{a}_{j}", "f32"), o, splits))]
            conds = ([oh < OH] if OH % (ty_n * rh) else []) + ([ow < OW] if OW % (tx_n * rw) else [])
            if len(conds) == 2:
                store = [If(kir.binary("and", *conds), store)]
            elif conds:
                store = [If(conds[0], store)]
            body += store
    return body, [kir.SharedArray("xs", "f32", size)], _depthwise_grid(op, cfg)


def check(strategy: Strategy, op: P.Conv, limits: dict, cfg=None) -> str | None:
    """Why `strategy` cannot build this convolution (None: it can); with `cfg`, also why that
    configuration cannot (its window past workgroup memory, its grid past the limits)."""
    if strategy in (Strategy.ROW_BLOCK, Strategy.DEPTHWISE_SHARED) and len(op.x_shape) != 4:
        return "handles 2-D convolutions only"
    if strategy == Strategy.DEPTHWISE_SHARED:
        if op.w_shape[1] != 1:
            return "handles depthwise convolutions only (one input channel an output channel)"
        if getattr(op, "symbolic", None) or any(isinstance(d, Dim) for d in op.x_shape + op.out_shape):
            return "needs static sizes"
        if cfg is not None:
            ith, itw = depthwise_window(op, cfg)
            if 4 * ith * itw > limits["max_compute_workgroup_storage_size"]:
                return f"holds a {ith} x {itw} window, past the adapter's workgroup memory"
            if max(_depthwise_grid(op, cfg)) > limits["max_compute_workgroups_per_dimension"]:
                return "needs more workgroups along a grid dimension than the adapter allows"
        return None
    if strategy not in (Strategy.ROW_BLOCK, Strategy.DIRECT):
        return "is not a convolution strategy"
    return None


def build_conv(op: P.Conv, prog, cfg, limits, b: Binder):
    if cfg.strategy == Strategy.ROW_BLOCK:
        return _conv_row_block(op, prog, cfg, limits, b)
    if cfg.strategy == Strategy.DEPTHWISE_SHARED:
        return _conv_depthwise_shared(op, prog, cfg, limits, b)
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
    work = [Let("sp", i32(0) if isinstance(S, int) and S == 1 else t % S), Let("rest", t // S),
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
            wv = b.load(op.w, lvar(f"wbase{j}", "i32") + P.flat_of(kc, op.w_shape[2:]),
                        [((m0 + j) * Cg + c, M * Cg)] + list(zip(kc, op.w_shape[2:])))
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
