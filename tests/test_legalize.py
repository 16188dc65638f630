"""One legalization for every renderer (webiree/wgsl_codegen/legalize.py):

- what a renderer declares it lacks (erf, tanh, NaN/inf tests, bool storage, and for SPIR-V
  WGSL's integer division, shift and conversion rules) is rewritten into primitive kernel-IR
  ops, and the renderers print no such op themselves;
- what a renderer declares it has is left alone;
- each formula is written once, in legalize.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from webiree.ir import kir
from webiree.ir.kir import Binding, Kernel, Let, Store, f32, lvar
from webiree.wgsl_codegen import spirv, wgsl
from webiree.wgsl_codegen.legalize import FEATURES, legalize

ROOT = Path(__file__).resolve().parents[1]
RENDERERS = {"wgsl": wgsl.SUPPORTS, "spirv": spirv.SUPPORTS}


def _kernel(*values):
    """Store each value (f32 input x, i32 inputs a, b; bool input c) to its own output."""
    o = lvar("o", "i32")
    body = [Let("o", kir.cast(kir.LINDEX, "i32"))]
    body += [Store(f"r{j}", o, v) for j, v in enumerate(values)]
    ins = [Binding(0, "x", "f32"), Binding(1, "a", "i32"), Binding(2, "b", "i32"), Binding(3, "c", "bool")]
    outs = [Binding(4 + j, f"r{j}", v.dtype, writes=True) for j, v in enumerate(values)]
    return Kernel("k", ins + outs, (64, 1, 1), body)


O = lvar("o", "i32")
X, A, B, C = kir.load("x", O, "f32"), kir.load("a", O, "i32"), kir.load("b", O, "i32"), kir.load("c", O, "bool")


def _ops(kernel) -> set[str]:
    return {n.op for s in kir.statements(kernel.body) for e in kir.stmt_exprs(s) for n in kir.walk(e)}


@pytest.mark.parametrize("renderer", RENDERERS)
def test_math_and_nan_tests_become_primitive_ops(renderer):
    k = legalize(_kernel(kir.unary("erf", X), kir.unary("tanh", X), kir.unary("isnan", X),
                         kir.unary("isinf", X)), RENDERERS[renderer])
    assert not _ops(k) & {"erf", "tanh", "isnan", "isinf"}
    assert {"exp", "abs", "clamp", "bitcast", "band", "select"} <= _ops(k)


@pytest.mark.parametrize("renderer", RENDERERS)
def test_bool_storage_is_u32(renderer):
    k = legalize(_kernel(kir.unary("not", C)), RENDERERS[renderer])
    assert [b.dtype for b in k.bindings] == ["f32", "i32", "i32", "u32", "u32"]
    store = k.body[-1]
    assert store.value.op == "select" and store.value.args[1:] == (kir.const(1, "u32"), kir.const(0, "u32"))
    assert kir.load("c", O, "u32") in set(kir.walk(store.value))


def test_wgsl_keeps_what_it_guarantees_and_spirv_gets_it_written_out():
    values = (A // B, A % B, kir.binary("shl", A, B), kir.cast(X, "i32"), kir.cast(C, "f32"))
    wgsl_ops = _ops(legalize(_kernel(*values), wgsl.SUPPORTS))
    spirv_k = legalize(_kernel(*values), spirv.SUPPORTS)
    assert "select" not in wgsl_ops and "clamp" not in wgsl_ops      # printed as they are
    div, mod, shl, to_int, from_bool = (s.value for s in spirv_k.body[1:])
    assert div.args[1].op == "select" and mod.args[1].op == "select"   # divisor 1 where 0 or MIN / -1
    assert shl.args[1] == kir.binary("band", B, 31)
    assert to_int.args[0] == kir.clamp(X, -2147483648.0, 2147483520.0)
    assert from_bool.op == "select"


def test_a_constant_divisor_is_guarded_only_where_it_can_trigger():
    u = kir.bitcast(A, "u32")
    k = legalize(_kernel(A // 3, A % -3, u // 0xFFFFFFFF, A // -1, u % 0), spirv.SUPPORTS)
    assert [s.value for s in k.body[1:4]] == [A // 3, A % -3, u // 0xFFFFFFFF]
    assert k.body[4].value.args[1].op == "select"                # MIN / -1 = MIN
    assert k.body[5].value == kir.const(0, "u32")                # x % 0 = 0, folded


def test_supporting_everything_changes_nothing_but_unrolling():
    values = (kir.unary("erf", X), A // B, kir.cast(X, "u32"), C)
    k = _kernel(*values)
    assert [s.value for s in legalize(k, FEATURES).body[1:]] == list(values)
    assert legalize(k, FEATURES).bindings == k.bindings


def test_renderers_reject_what_they_were_not_given_legal():
    k = _kernel(kir.unary("erf", X))
    with pytest.raises(NotImplementedError, match="legalize"):
        wgsl.render(k)
    with pytest.raises(NotImplementedError, match="legalize"):
        spirv.emit(k)
    assert "erf" not in wgsl.render(legalize(k, wgsl.SUPPORTS))


@pytest.mark.parametrize("text", ["0.3275911", "1.061405429", "0x7fffffff", "2147483520", "4294967040"])
def test_each_formula_is_written_once(text):
    """erf's coefficients, the NaN/inf bit mask and the saturating bounds live in legalize.py only."""
    files = [p.relative_to(ROOT).as_posix() for p in (ROOT / "webiree").rglob("*.py")
             if text in p.read_text().lower()]
    assert files == ["webiree/wgsl_codegen/legalize.py"]
