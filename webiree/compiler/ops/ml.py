"""A few ops of the ai.onnx.ml domain that are plain index maps or elementwise
math: Binarizer and ArrayFeatureExtractor (registered as "ai.onnx.ml.<Op>")."""

from __future__ import annotations

from ...ir import kir
from ...ir.kir import select
from .registry import Unsupported, register


@register("ai.onnx.ml.Binarizer")
def binarizer(ctx, node):
    x = node.inputs[0]
    dt = ctx.dtype(x)
    if dt == "bool":
        raise Unsupported("Binarizer on bool tensors")
    t = node.attr("threshold", 0.0)
    ctx.generic(node.outputs[0], ctx.shape(x), dt,
                lambda cs: select(ctx.read(x, cs) > kir.const(t, dt), kir.const(1, dt), kir.const(0, dt)))


@register("ai.onnx.ml.ArrayFeatureExtractor")
def array_feature_extractor(ctx, node):
    x, idx = node.inputs[:2]
    xs = list(ctx.shape(x))
    k = 1
    for d in ctx.shape(idx):
        k *= d
    n = xs[-1]
    out = (xs[:-1] if len(xs) > 1 else [1]) + [k]

    def rule(cs):
        i = kir.clamp(ctx.read_flat(idx, cs[-1]), 0, n - 1)
        return ctx.read(x, (cs[:-1] if len(xs) > 1 else []) + [i])
    ctx.generic(node.outputs[0], out, ctx.dtype(x), rule)


MAX_TREE_NODES = 4096


@register("ai.onnx.ml.TreeEnsemble")
def tree_ensemble(ctx, node):
    """Every tree, a compile-time constant, becomes a nested select on the sample's features
    (small ensembles only: the expression grows with the number of nodes)."""
    import numpy as np

    from ...errors import ShapeError

    x = node.inputs[0]
    if ctx.dtype(x) != "f32":
        raise Unsupported("TreeEnsemble on non-float inputs")
    a = node.attrs
    if int(a.get("post_transform", 0)) != 0:
        raise Unsupported("TreeEnsemble post_transform")
    arr = lambda k, default=None: [] if a.get(k) is None else np.asarray(a[k]).reshape(-1).tolist()  # noqa: E731
    feat, splits, modes = arr("nodes_featureids"), arr("nodes_splits"), arr("nodes_modes")
    t_ids, f_ids = arr("nodes_truenodeids"), arr("nodes_falsenodeids")
    t_leaf, f_leaf = arr("nodes_trueleafs"), arr("nodes_falseleafs")
    missing = arr("nodes_missing_value_tracks_true") or [0] * len(feat)
    targets, weights, roots = arr("leaf_targetids"), arr("leaf_weights"), arr("tree_roots")
    members = iter(arr("membership_values"))
    n_targets = int(a.get("n_targets", 1))
    agg = int(a.get("aggregate_function", 1))
    if len(feat) > MAX_TREE_NODES:
        raise Unsupported(f"an ensemble of {len(feat)} nodes (at most {MAX_TREE_NODES})")
    sets = {}
    for i, m in enumerate(modes):   # the member sets follow node order, each ended by NaN
        if int(m) == 6:
            s = []
            for v in members:
                if v != v:
                    break
                s.append(v)
            sets[i] = s
    N = ctx.shape(x)[0]

    def rule(cs):
        n, t = cs
        row = lambda f: ctx.read(x, [n, kir.i32(int(f))])  # noqa: E731

        def cond(i):
            v, m, sp = row(feat[i]), int(modes[i]), float(splits[i]) if i < len(splits) else 0.0
            if m == 6:
                c = kir.const(False, "bool")
                for s in sets[i]:
                    c = kir.binary("or", c, kir.binary("eq", v, kir.f32(s)))
            else:
                c = {0: lambda: v <= sp, 1: lambda: v < sp, 2: lambda: v >= sp, 3: lambda: v > sp,
                     4: lambda: kir.binary("eq", v, kir.f32(sp)), 5: lambda: kir.binary("ne", v, kir.f32(sp))}[m]()
            return kir.binary("or", c, kir.unary("isnan", v)) if missing[i] else c

        def value(i, leaf, depth=0):
            """(weight contributed to target t, 1.0 if the reached leaf is of target t) below node/leaf i."""
            if depth > len(feat):
                raise ShapeError("TreeEnsemble nodes form a cycle")
            if leaf:
                hit = int(targets[i])
                return (kir.select(kir.binary("eq", t, kir.i32(hit)), kir.f32(float(weights[i])), kir.f32(0.0)),
                        kir.select(kir.binary("eq", t, kir.i32(hit)), kir.f32(1.0), kir.f32(0.0)))
            tv, th = value(int(t_ids[i]), int(t_leaf[i]), depth + 1)
            fv, fh = value(int(f_ids[i]), int(f_leaf[i]), depth + 1)
            c = cond(i)
            return kir.select(c, tv, fv), kir.select(c, th, fh)
        big = 3.4028234663852886e38
        acc = kir.f32(0.0 if agg in (0, 1) else (big if agg == 2 else -big))
        for r in roots:
            r = int(r)
            degenerate = t_leaf[r] and f_leaf[r] and t_ids[r] == f_ids[r]
            v, hit = value(r, 1) if degenerate else value(r, 0)     # (as the reference: a leaf-only tree)
            if agg == 0:
                acc = acc + v * (1.0 / len(roots))
            elif agg == 1:
                acc = acc + v
            elif agg == 2:
                acc = kir.select(hit > 0.0, kir.minimum(acc, v), acc)
            else:
                acc = kir.select(hit > 0.0, kir.maximum(acc, v), acc)
        return acc
    ctx.generic(node.outputs[0], [N, n_targets], "f32", rule)
