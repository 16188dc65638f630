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
