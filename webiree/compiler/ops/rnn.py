"""Recurrent layers, unrolled over their (static) sequence: RNN, GRU, LSTM.

Per direction, X @ W^T for every time step is one MatMul; each step then is
one MatMul H_{t-1} @ R^T (two for GRU's default linear_before_reset=0) and
Generic ops computing the gates and the new hidden (and cell) state, which
fusion merges. sequence_lens (forward direction) masks finished sequences:
their state is held and their outputs are zero. The gate activations are
elementwise.py's, so a recurrent Softplus or HardSigmoid is the Softplus or
HardSigmoid op's.
"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...ir import kir
from ...ir.kir import f32, select
from ...ir.program import MatMul
from .registry import Unsupported, register
from .elementwise import (affine, elu, hard_sigmoid, leaky_relu, relu, scaled_tanh, sigmoid, softplus, softsign,
                          tanh, thresholded_relu)

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


# the activations a recurrent op may name (case-insensitive), as elementwise.py defines them,
# and the parameters each takes from activation_alpha / activation_beta (in that order)
ACTIVATIONS = {
    "relu": (relu, ()), "tanh": (tanh, ()), "sigmoid": (sigmoid, ()), "softsign": (softsign, ()),
    "softplus": (softplus, ()), "affine": (affine, ("alpha", "beta")), "leakyrelu": (leaky_relu, ("alpha",)),
    "thresholdedrelu": (thresholded_relu, ("alpha",)), "scaledtanh": (scaled_tanh, ("alpha", "beta")),
    "hardsigmoid": (hard_sigmoid, ("alpha", "beta")), "elu": (elu, ("alpha",)),
}


def _activations(names, alphas, betas):
    """One function of an expression per named activation. activation_alpha and activation_beta
    list the parameters of the activations that take one, in order; one not listed is defaulted."""
    fns, ai, bi = [], 0, 0
    for name in names:
        if name.lower() not in ACTIVATIONS:
            raise Unsupported(f"activation {name.lower()!r}")
        fn, params = ACTIVATIONS[name.lower()]
        given = {}
        if "alpha" in params and ai < len(alphas):
            given["alpha"], ai = alphas[ai], ai + 1
        if "beta" in params and bi < len(betas):
            given["beta"], bi = betas[bi], bi + 1
        fns.append(lambda x, fn=fn, given=given: fn(x, **given))
    return fns


def _slice_rows(ctx, w, d, lo, hi):
    """w[d, lo:hi, :] as a 2-D tensor."""
    s = ctx.shape(w)
    c = ctx.const(w)
    out = ctx.temp(f"w{d}_{lo}")
    if c is not None:
        ctx.set_const(out, np.ascontiguousarray(np.asarray(c, np.float32)[d, lo:hi, :]))
        return out
    ctx.generic(out, [hi - lo, s[2]], "f32", lambda cs: ctx.read(w, [kir.i32(d), cs[0] + lo, cs[1]]))
    return out


def _mm_t(ctx, a, b, m, n, k):
    """a [m, k] @ b[n, k]^T."""
    out = ctx.temp("mm")
    op = MatMul(name=ctx.node.name, out=out, nodes=[ctx.node.name], a=ctx.buffer(a), b=ctx.buffer(b),
                m=m, n=n, k=k, trans_b=True)
    ctx.anchor(op, [m, n])
    return out


@register("RNN", "GRU", "LSTM")
def recurrent(ctx, node):
    kind = node.op
    X, W, R = node.inputs[:3]
    B, lens, h0 = node.input(3), node.input(4), node.input(5)
    c0, P = (node.input(6), node.input(7)) if kind == "LSTM" else ("", "")
    if ctx.dtype(X) != "f32":
        raise Unsupported(f"{kind} on non-float tensors")
    layout = int(node.attr("layout", 0))
    xs = ctx.shape(X)
    seq, batch, inp = (xs[1], xs[0], xs[2]) if layout else xs
    nd = ctx.shape(W)[0]
    G = GATES[kind]
    hid = int(node.attr("hidden_size", ctx.shape(R)[-1]))
    direction = node.attr("direction", "forward")
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[direction]
    if len(dirs) != nd:
        raise ShapeError(f"{kind} direction {direction!r} does not match W with {nd} direction(s)")
    if kind == "LSTM" and node.attr("input_forget", 0):
        raise Unsupported("LSTM input_forget=1")
    clip = node.attr("clip")
    lbr = bool(node.attr("linear_before_reset", 0))
    n_act = len(DEFAULT_ACTS[kind])
    acts = node.attr("activations") or DEFAULT_ACTS[kind] * nd
    fns = _activations(acts, list(node.attr("activation_alpha") or []), list(node.attr("activation_beta") or []))

    # X as [seq * batch, input], time-major
    if layout:
        xt = ctx.temp("x_tm")
        ctx.generic(xt, [seq, batch, inp], "f32", lambda cs: ctx.read(X, [cs[1], cs[0], cs[2]]))
    else:
        xt = X
    xf = ctx.temp("x2d")
    ctx.view(xf, xt, [seq * batch, inp])
    if lens and any(dirs):
        raise Unsupported(f"{kind} reverse direction with sequence_lens")

    finals_h, finals_c, ys = [], [], []
    for d, rev in enumerate(dirs):
        f_act = fns[d * n_act: (d + 1) * n_act]
        wd = _slice_rows(ctx, W, d, 0, G * hid)
        rd = _slice_rows(ctx, R, d, 0, G * hid)
        xw = _mm_t(ctx, xf, wd, seq * batch, G * hid, inp)

        def bias(which, g, j, d=d):
            """Wb (which=0) or Rb (which=1) of gate g, unit j."""
            if not B:
                return f32(0.0)
            return ctx.read(B, [kir.i32(d), (which * G + g) * hid + j])

        def pre(t, g, b, j, hr, xw=xw):
            """Xt W_g^T + H R_g^T + Wb_g + Rb_g for gate g."""
            return ctx.read(xw, [t * batch + b, g * hid + j]) + ctx.read(hr, [b, g * hid + j]) + \
                bias(0, g, j) + bias(1, g, j)

        def clipped(v):
            return kir.clamp(v, -clip, clip) if clip is not None else v

        h = ctx.temp(f"h{d}_init")
        if h0:
            ctx.generic(h, [batch, hid], "f32", lambda cs, d=d: ctx.read(h0, [kir.i32(d), cs[0], cs[1]]))
        else:
            ctx.set_const(h, np.zeros([batch, hid], np.float32))
        c = None
        if kind == "LSTM":
            c = ctx.temp(f"c{d}_init")
            if c0:
                ctx.generic(c, [batch, hid], "f32", lambda cs, d=d: ctx.read(c0, [kir.i32(d), cs[0], cs[1]]))
            else:
                ctx.set_const(c, np.zeros([batch, hid], np.float32))
        rh = _slice_rows(ctx, R, d, 2 * hid, 3 * hid) if kind == "GRU" and not lbr else None
        outs = [None] * seq
        for step in range(seq):
            t = seq - 1 - step if rev else step
            hr = _mm_t(ctx, h, rd, batch, G * hid, hid)

            def active(b, t=t):
                return kir.i32(t) < kir.cast(ctx.read(lens, [b]), "i32") if lens else None

            def hold(new_fn, old, t=t):
                """The new state, or the old one where the sequence has ended."""
                def rule(cs):
                    v = new_fn(cs)
                    a = active(cs[0])
                    return v if a is None else select(a, v, ctx.read(old, cs))
                return rule

            if kind == "RNN":
                new_h = ctx.temp(f"h{d}_{t}")
                ctx.generic(new_h, [batch, hid], "f32",
                            hold(lambda cs, t=t, hr=hr: f_act[0](clipped(pre(t, 0, cs[0], cs[1], hr))), h))
            elif kind == "GRU":
                z = lambda cs, t=t, hr=hr: f_act[0](clipped(pre(t, 0, cs[0], cs[1], hr)))  # noqa: E731
                r = lambda cs, t=t, hr=hr: f_act[0](clipped(pre(t, 1, cs[0], cs[1], hr)))  # noqa: E731
                if lbr:
                    def hh(cs, t=t, hr=hr, r=r):
                        b, j = cs
                        v = ctx.read(xw, [t * batch + b, 2 * hid + j]) + bias(0, 2, j) + \
                            r(cs) * (ctx.read(hr, [b, 2 * hid + j]) + bias(1, 2, j))
                        return f_act[1](clipped(v))
                else:
                    rhp = ctx.temp(f"rh{d}_{t}")
                    ctx.generic(rhp, [batch, hid], "f32", lambda cs, r=r, h=h: r(cs) * ctx.read(h, cs))
                    hrh = _mm_t(ctx, rhp, rh, batch, hid, hid)

                    def hh(cs, t=t, hrh=hrh):
                        b, j = cs
                        v = ctx.read(xw, [t * batch + b, 2 * hid + j]) + ctx.read(hrh, [b, j]) + \
                            bias(0, 2, j) + bias(1, 2, j)
                        return f_act[1](clipped(v))
                new_h = ctx.temp(f"h{d}_{t}")
                ctx.generic(new_h, [batch, hid], "f32",
                            hold(lambda cs, z=z, hh=hh, h=h: (1.0 - z(cs)) * hh(cs) + z(cs) * ctx.read(h, cs), h))
            else:   # LSTM: gates i, o, f, c
                def peep(k, j, cv, d=d):
                    return ctx.read(P, [kir.i32(d), k * hid + j]) * cv if P else f32(0.0)

                def new_c_rule(cs, t=t, hr=hr, c=c):
                    b, j = cs
                    cp = ctx.read(c, cs)
                    i_g = f_act[0](clipped(pre(t, 0, b, j, hr) + peep(0, j, cp)))
                    f_g = f_act[0](clipped(pre(t, 2, b, j, hr) + peep(2, j, cp)))
                    c_g = f_act[1](clipped(pre(t, 3, b, j, hr)))
                    return f_g * cp + i_g * c_g
                new_c = ctx.temp(f"c{d}_{t}")
                ctx.generic(new_c, [batch, hid], "f32", hold(new_c_rule, c))

                def new_h_rule(cs, t=t, hr=hr, new_c=new_c):
                    b, j = cs
                    cn = ctx.read(new_c, cs)
                    o_g = f_act[0](clipped(pre(t, 1, b, j, hr) + peep(1, j, cn)))
                    return o_g * f_act[2](cn)
                new_h = ctx.temp(f"h{d}_{t}")
                ctx.generic(new_h, [batch, hid], "f32", hold(new_h_rule, h))
                c = new_c
            if lens:   # the output of a finished sequence is 0
                y = ctx.temp(f"y{d}_{t}")
                ctx.generic(y, [batch, hid], "f32", lambda cs, t=t, new_h=new_h: select(
                    kir.i32(t) < kir.cast(ctx.read(lens, [cs[0]]), "i32"), ctx.read(new_h, cs), f32(0.0)))
                outs[t] = y
            else:
                outs[t] = new_h
            h = new_h
        finals_h.append(h)
        finals_c.append(c)
        ys.append(outs)

    y_out, yh_out, yc_out = (list(node.outputs) + ["", "", ""])[:3]

    def pick(per_dir, dcoord, rest):
        value = None
        for d in reversed(range(nd)):
            v = ctx.read(per_dir[d], rest)
            value = v if value is None else select(kir.binary("eq", dcoord, kir.i32(d)), v, value)
        return value
    if y_out:
        shape = [batch, seq, nd, hid] if layout else [seq, nd, batch, hid]

        def y_rule(cs):
            t, dd, b, j = (cs[1], cs[2], cs[0], cs[3]) if layout else cs
            value = None
            for tt in reversed(range(seq)):
                v = pick([ys[d][tt] for d in range(nd)], dd, [b, j])
                value = v if value is None else select(kir.binary("eq", t, kir.i32(tt)), v, value)
            return value
        ctx.generic(y_out, shape, "f32", y_rule)
    for out, finals in ((yh_out, finals_h), (yc_out, finals_c)):
        if out:
            shape = [batch, nd, hid] if layout else [nd, batch, hid]
            ctx.generic(out, shape, "f32", lambda cs, finals=finals: pick(
                finals, cs[1] if layout else cs[0], [cs[0], cs[2]] if layout else [cs[1], cs[2]]))
