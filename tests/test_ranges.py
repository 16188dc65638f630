"""Index arithmetic decided by value ranges (ir/ranges.py): what is rewritten, what must stay, and
that every rewrite keeps each value for every input in the ranges."""

from __future__ import annotations

import itertools

import numpy as np
from onnx import TensorProto, helper

from webiree.ir import kir, ranges
from webiree.ir.kir import LID, WID, For, Let, Store, i32, lvar
from webiree.testing.models import make_model

from .conftest import assert_close, compile_and_run, ort_run


def _value(e: kir.Expr, env: dict) -> int | bool:
    """An integer kir expression evaluated as WGSL does (i32 wraps, division truncates)."""
    op, a = e.op, e.args
    if op == "const":
        return e.attr
    if op == "var":
        return env[e.attr]
    if op == "cast":
        return _value(a[0], env)
    v = [_value(x, env) for x in a]
    if op in ("lt", "le", "gt", "ge", "eq", "ne"):
        return {"lt": v[0] < v[1], "le": v[0] <= v[1], "gt": v[0] > v[1], "ge": v[0] >= v[1],
                "eq": v[0] == v[1], "ne": v[0] != v[1]}[op]
    if op == "select":
        return v[1] if v[0] else v[2]
    if op == "clamp":
        return min(max(v[0], v[1]), v[2])
    out = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
           "div": lambda x, y: int(x / y), "mod": lambda x, y: x - y * int(x / y),
           "min": min, "max": max, "shr": lambda x, y: x >> y, "band": lambda x, y: x & y}[op](*v)
    return (out + (1 << 31)) % (1 << 32) - (1 << 31)


def _simplified(exprs: list, wg=(8, 1, 1), grid=(16, 1, 12), loop=None):
    """The expressions after ranges.simplify, each stored by a kernel (inside loop `j` over
    `loop` = (start, stop, step) when given)."""
    stores = [Store("out", i32(n), e) for n, e in enumerate(exprs)]
    body = [For("j", i32(loop[0]), i32(loop[1]), stores, loop[2])] if loop else stores
    k = ranges.simplify(kir.Kernel("k", [], wg, body), grid)
    return [s.value for s in kir.statements(k.body) if isinstance(s, Store)]


def _check_values(before: list, after: list, domains: dict):
    """Every input in the domains gives each pair the same value; returns how many were tried."""
    names = list(domains)
    n = 0
    for values in itertools.product(*domains.values()):
        env = dict(zip(names, values))
        for b, a in zip(before, after, strict=True):
            assert _value(a, env) == _value(b, env), (b, a, env)
        n += 1
    return n


def _ops(e: kir.Expr) -> list[str]:
    return sorted(n.op for n in kir.walk(e) if n.op in ("div", "mod", "min", "max", "shr", "band"))


LX, WZ = kir.cast(LID[0], "i32"), kir.cast(WID[2], "i32")
J = lvar("j", "i32")


def test_a_transposed_heads_index_loses_its_divisions():
    """The K index of an attention over [seq, heads * 32] read as [heads, seq, 32]: the flat index
    h * 4096 + j * 32 + lane * 4 + 3 taken apart by / 32, % 128, / 4096, % 32 and put together as
    row * 384 + column, then split again by / 384 and % 384 (compiler/passes.py combine and a
    transpose's loads), is j * 384 + h * 32 + lane * 4 + 3 with no division left."""
    flat = WZ * 4096 + kir.minimum(J, i32(127)) * 32 + kir.minimum(LX, i32(7)) * 4 + 3
    pos = ((flat / 32) % 128) * 384 + (flat / 4096) * 32 + flat % 32
    exprs = [pos / 384, pos % 384, flat / 32, (flat / 32) % 128]
    got = _simplified(exprs, loop=(0, 128, 4))
    assert [_ops(e) for e in got] == [[], [], [], []], got
    assert got[0] is J and got[3] is J
    n = _check_values(exprs, got, {"lid.x": range(8), "wid.z": range(12), "j": range(0, 128, 4)})
    assert n == 8 * 12 * 32


def test_what_the_ranges_do_not_settle_stays():
    """A remainder that can reach the divisor, a value that can be negative, a read of memory and a
    workgroup id of an unknown grid keep their divisions; the values are those of before."""
    exprs = [(LX * 4 + 5) % 32,             # lid.x * 4 + 5 reaches 33 (and nothing comes off)
             (LX - 3) / 2,                  # negative for lid.x < 3
             (kir.load("b0", LX, "i32") * 32 + LX) % 32,
             (WZ * 32 + LX) / 32]
    got = _simplified(exprs, grid=None)
    assert [_ops(e) for e in got] == [["mod"], ["div"], ["mod"], ["div"]], got
    assert _check_values(exprs[:2], got[:2], {"lid.x": range(8)}) == 8
    bounded = _simplified([exprs[3]])           # with the grid known: wid.z
    assert bounded[0] is WZ


def test_clamps_and_tests_that_always_hold_fold():
    """min / max / clamp against a bound the range stays inside, comparisons the ranges decide, and
    the select whose condition became a constant; an undecided comparison stays."""
    row = WID[0] * 8 + LID[0]                   # u32, 0 .. 127 with a grid of 16
    exprs = [kir.minimum(J + 3, i32(127)),      # j <= 124: j + 3
             kir.maximum(LX, i32(0)),
             kir.clamp(LX * 2, 0, 15),
             kir.select(J < 128, J, i32(0)),
             kir.select(kir.cast(row, "i32") < 100, J, i32(0)),
             kir.minimum(row, kir.const(127, "u32"))]
    got = _simplified(exprs, loop=(0, 128, 4))
    assert got[0] is J + 3 and got[1] is LX and got[2] is LX * 2 and got[3] is J
    assert got[4].op == "select" and got[5] is row
    n = _check_values(exprs, got, {"lid.x": range(8), "wid.x": range(16), "j": range(0, 128, 4)})
    assert n == 8 * 16 * 32


def test_multiples_of_the_divisor_come_off_a_remainder_that_can_reach_it():
    """(c Q + R) / c = Q + R / c and (c Q + R) % c = R % c where R >= 0: an unrolled copy's offset
    (lid.x + 32) splits off a lane's part, lid.x % 4."""
    exprs = [(LX + 32) % 4, (LX + 32 + WZ * 8) / 4, (LX * 3 + 9) / 3]
    got = _simplified(exprs, wg=(64, 1, 1))
    assert got[0] is LX % 4 and got[1] is WZ * 2 + 8 + LX / 4 and got[2] is LX + 3, got
    assert _check_values(exprs, got, {"lid.x": range(64), "wid.z": range(12)}) == 64 * 12


def test_shifts_and_masks_are_divisions_and_remainders():
    """A packed read's word (index >> 1) and lane (index & 1) of an index whose low part is known."""
    index = WZ * 32 + LX * 2 + 1
    exprs = [kir.binary("shr", index, i32(1)), kir.binary("band", index, i32(1)),
             kir.binary("band", index, i32(6))]       # not a low mask: stays
    got = _simplified(exprs)
    assert got[0] is WZ * 16 + LX and got[1] is i32(1) and _ops(got[2]) == ["band"]
    assert _check_values(exprs, got, {"lid.x": range(8), "wid.z": range(12)}) == 96


def test_lets_and_nested_divisions():
    """A Let's range is its value's (its form is not looked into: x % 1000 stays, though x's value
    is wid.z * 1000 + lid.x); (x / a) / b is one division, (x % 96) % 32 is x % 32."""
    x = lvar("x", "i32")
    body = [Let("x", WZ * 1000 + LX), Store("out", i32(0), (x / 10) / 10), Store("out", i32(1), (x % 96) % 32),
            Store("out", i32(2), (x % 1000) / 8)]
    k = ranges.simplify(kir.Kernel("k", [], (8, 1, 1), body), (16, 1, 12))
    got = [s.value for s in k.body if isinstance(s, Store)]
    assert _ops(got[0]) == ["div"] and got[0].args[1] is i32(100)
    assert _ops(got[1]) == ["mod"] and got[1].args[1] is i32(32)
    assert _ops(got[2]) == ["div", "mod"]
    before = [(WZ * 1000 + LX) / 10 / 10, ((WZ * 1000 + LX) % 96) % 32, ((WZ * 1000 + LX) % 1000) / 8]
    after = [kir.substitute(g, {x: WZ * 1000 + LX}) for g in got]
    assert _check_values(before, after, {"lid.x": range(8), "wid.z": range(12)}) == 96


def _bert_attention(seq=16, heads=4, d=16, seed=0):
    """Q, K and V projections of one hidden state with biases, split into heads (Reshape +
    Transpose), scaled dot-product attention and the heads put back: what fuse_attention and
    combine_parallel_matmuls turn into one product and one attention dispatch."""
    rng = np.random.default_rng(seed)
    F, hid = TensorProto.FLOAT, heads * d
    nodes, inits = [], {"shape": np.array([1, seq, heads, d], np.int64), "back": np.array([1, seq, hid], np.int64),
                        "scale": np.array(d ** -0.5, np.float32)}
    for p in "qkv":
        inits[f"w{p}"] = rng.standard_normal((hid, hid)).astype(np.float32) * 0.2
        inits[f"b{p}"] = rng.standard_normal(hid).astype(np.float32) * 0.2
        nodes += [helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}0"]),
                  helper.make_node("Add", [f"{p}0", f"b{p}"], [f"{p}1"]),
                  helper.make_node("Reshape", [f"{p}1", "shape"], [f"{p}2"]),
                  helper.make_node("Transpose", [f"{p}2"], [p], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["q", "k"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["s"]),
              helper.make_node("Softmax", ["s"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "back"], ["y"])]
    return make_model(nodes, [helper.make_tensor_value_info("x", F, [1, seq, hid])],
                      [helper.make_tensor_value_info("y", F, [1, seq, hid])], inits)


def _dividends_in_loops(kernel) -> set:
    """The variables that the dividends of the integer divisions and remainders inside the
    kernel's loops depend on."""
    out = set()
    for loop in (s for s in kir.statements(kernel.body) if isinstance(s, For)):
        for st in kir.statements(loop.body):
            for e in kir.stmt_exprs(st):
                for n in kir.walk(e):
                    if n.op in ("div", "mod") and n.dtype == "i32":
                        out |= {v.attr for v in kir.walk(n.args[0]) if v.op == "var"}
    return out


def test_an_attention_over_projected_heads_keeps_only_lane_splits(tmp_path, monkeypatch):
    """End to end: the attention dispatch of a BERT block reads its combined Q / K / V columns
    through transposes. Built for a GPU (shared tiles) and for a CPU renderer (subgroup lanes), the
    divisions left in its loops split the lane id into a tile's row and column, and none depends on
    the key position or the head, as all of them did without the pass; the results are
    onnxruntime's."""
    model = _bert_attention()
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32)}
    ref = ort_run(model, feeds)[0]
    for limits in ("default", "adapter"):     # adapter: lavapipe, a CPU with subgroups of 8
        (got,), res, _ = compile_and_run(model, feeds, tmp_path, limits=limits)
        (attn,) = [d for d in res.dispatches if d.kind == "attention"]
        assert _dividends_in_loops(attn.kernel) <= {"lid.x"}, limits
        assert_close(got, ref, name=f"y ({limits})")
    monkeypatch.setattr(ranges, "simplify", lambda kernel, grid=None: kernel)
    _, res, _ = compile_and_run(model, feeds, tmp_path)
    (attn,) = [d for d in res.dispatches if d.kind == "attention"]
    assert {"wid.z"} <= _dividends_in_loops(attn.kernel)
