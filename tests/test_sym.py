"""ir/sym.py: the symbolic size expressions every dynamic build is made of."""

import pytest

from webiree.ir import kir, sym

S = sym.symbol("seq", 0, 1, 512)
B = sym.symbol("batch", 1, 1, 8)


def test_normal_form_makes_equal_sizes_equal():
    assert S * 12 * 64 == S * 768 == 768 * S
    assert hash(S * 12 * 64) == hash(S * 768)
    assert B * S * 768 // (B * S) == 768          # exact divisions cancel to a plain int
    assert (B * S * 768) // (B * S * 12) == 64
    assert S - S == 0 and isinstance(S - S, int)
    assert (S + 1) * 2 - 2 == 2 * S
    assert (S * 4) % 4 == 0                       # provably a multiple
    assert isinstance(S % 4, sym.Dim)             # not provably


def test_floor_and_ceil_division():
    for v in (1, 3, 4, 5, 511, 512):
        env = {"seq": v}
        assert sym.evaluate((S + 3) // 4, env) == (v + 3) // 4
        assert sym.evaluate(-(-S // 4), env) == -(-v // 4)
        assert sym.evaluate(sym.ceildiv(S, 16), env) == -(-v // 16)
        assert sym.evaluate((S - 3) // 2 + 1, env) == (v - 3) // 2 + 1
        assert sym.evaluate(S % 4, env) == v % 4
        assert sym.evaluate(sym.dmin(S, 64), env) == min(v, 64)
    assert -(-S // 4) == sym.ceildiv(S, 4)        # the ceiling idiom becomes one atom


def test_bounds_decide_orders_or_refuse():
    assert sym.bounds(S * B) == (1, 4096)
    assert sym.bounds(S - 1) == (0, 511)
    assert sym.upper((S + 3) // 4) == 128
    assert S >= 1 and S <= 512 and not S > 512 and S != 0
    assert sym.dmax(S, 1) == S and sym.dmin(S, 600) == S
    with pytest.raises(sym.SymbolicDimError, match="cannot decide whether seq > 64"):
        _ = S > 64
    with pytest.raises(sym.SymbolicDimError, match="fixed size"):
        int(S)
    with pytest.raises(sym.SymbolicDimError):
        range(S)


def test_kernel_ir_reads_symbols_from_the_dims_buffer():
    e = kir.i32(S * 768)
    loads = kir.loads_of(e)
    assert [(n.attr, n.args[0].attr) for n in loads] == [(sym.DIMS_BUFFER, 0)]
    o = kir.var("o", "i32")
    cond = o < B * S
    assert {n.args[0].attr for n in kir.loads_of(cond)} == {0, 1}


def test_radix_rules_skip_folded_keys():
    """A size of 1 folds o // 1 to o and o % 1 to 0: those are never rewritten (they would replace
    every use of o, or every constant 0, in a fused prologue)."""
    from webiree.ir.program import O
    from webiree.wgsl_codegen.kernels.common import radix_rules
    b, r, k = kir.var("b", "i32"), kir.var("r", "i32"), kir.var("k", "i32")
    rules = radix_rules([(b, None), (r, 1), (k, 64)])
    assert all(key.op in ("div", "mod") for key in rules)
    assert kir.i32(0) not in rules and O not in rules
    assert rules[kir.binary("mod", O, kir.i32(64))] is r * 64 + k     # = k, as r < 1
    rules = radix_rules([(b, None), (r, S), (k, 32)])          # a symbolic row count
    assert rules[kir.binary("mod", kir.binary("div", O, kir.i32(32)), kir.i32(S))] is r
    assert rules[kir.binary("div", O, kir.i32(S * 32))] is b
