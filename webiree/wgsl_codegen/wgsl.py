"""Render a legalized kernel-IR `Kernel` to WGSL text.

The rendering is mechanical: type maps and operator tables are data, and a
sub-expression used more than once within a statement is bound once with
`let`. Anything clever (tiling, vectorization) was decided before this point
and is already in the kernel's structure; what WGSL lacks (erf, NaN tests,
bool in storage, ...) was rewritten by `legalize.legalize(kernel, SUPPORTS)`,
which the compiler driver runs first. The few rules that are about printing
only stay here: non-finite and subnormal literals, `u32` shift amounts, and
a division of two constants kept from naga's constant folding.
"""

from __future__ import annotations

import math
import struct

from ..ir import kir
from ..ir.kir import Expr

# legalize.FEATURES that WGSL itself guarantees (integer division, shifts and f32 -> int
# conversions are defined for every operand; i32(b) / f32(b) convert a bool; unpack2x16float
# converts a half exactly; pack4xI8 and dot4I8Packed: the language feature
# packed_4x8_integer_dot_product, which the module then requires: compiler/driver.py)
SUPPORTS = frozenset({"int_divmod_total", "shift_mod32", "saturating_cast", "cast_from_bool", "unpack_f16",
                      "round_f16", "round_bf16", "packed_4x8"})
# features printed as a call of a helper function whose body is legalize.py's own rule for it, rendered
# once per shader (a float16 model rounds every result: inlined, the formula would be repeated per value)
HELPERS = ("round_f16", "round_bf16")

TYPE = {"f32": "f32", "i32": "i32", "u32": "u32", "bool": "bool", "vec4f": "vec4<f32>", "f16": "f16",
        "vec4h": "vec4<f16>", "vec4u": "vec4<u32>"}

INFIX = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%",
    "band": "&", "bor": "|", "bxor": "^", "shl": "<<", "shr": ">>",
    "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
    "and": "&&", "or": "||",
}
PREFIX = {"neg": "-", "not": "!", "bnot": "~"}
BUILTIN_CALL = {
    "abs": "abs", "exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2",
    "sqrt": "sqrt", "rsqrt": "inverseSqrt", "floor": "floor", "ceil": "ceil",
    "round": "round", "trunc": "trunc", "sign": "sign", "sin": "sin", "cos": "cos",
    "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh",
    "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
    "min": "min", "max": "max", "pow": "pow", "atan2": "atan2", "clamp": "clamp", "fma": "fma",
}

# Emitted only when a kernel has a non-finite f32 constant (see f32_literal).
WI_F32 = """fn wi_f32(bits: u32) -> f32 {
  return bitcast<f32>(bits);
}"""


def f32_literal(v: float) -> str:
    # Non-finite values go through a function call: WGSL const-expressions must be
    # finite, and Tint (Chromium) rejects even bitcast<f32>(0x7f800000u).
    if math.isnan(v):
        return "wi_f32(0x7fc00000u)"
    if math.isinf(v):
        return "wi_f32(0x7f800000u)" if v > 0 else "wi_f32(0xff800000u)"
    if v == 0.0 and math.copysign(1.0, v) < 0:
        return "bitcast<f32>(0x80000000u)"
    # subnormals are flushed by some drivers; write them exactly anyway
    text = repr(v)
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    if abs(v) < 1.1754943508222875e-38 and v != 0.0:
        bits = struct.unpack("<I", struct.pack("<f", v))[0]
        return f"bitcast<f32>({bits}u)"
    return text + "f"


def literal(e: Expr) -> str:
    v = e.attr
    if e.dtype == "f32":
        return f32_literal(v)
    if e.dtype == "i32":
        return "i32(-2147483648)" if v == -(1 << 31) else (f"{v}i" if v >= 0 else f"({v}i)")
    if e.dtype == "u32":
        return f"{v}u"
    return "true" if v else "false"


class _Renderer:
    def __init__(self, kernel: kir.Kernel):
        self.uniform = {b.name for b in kernel.bindings if b.uniform}
        self.k = kernel
        self.uses_wi_f32 = False
        self.helpers: set = set()
        self.tmp = 0
        self.lines: list[str] = []

    # --- expressions -------------------------------------------------------
    def expr(self, e: Expr, names: dict) -> str:
        got = names.get(e)
        if got is not None:
            return got
        op, a = e.op, e.args
        if op == "const":
            text = literal(e)
            self.uses_wi_f32 |= text.startswith("wi_f32")
            return text
        if op == "var":
            return e.attr
        if op in ("load", "sload"):
            if e.attr in self.uniform:      # word k of a uniform array<vec4<i32>>
                if a[0].is_const:
                    return f"{e.attr}[{a[0].attr // 4}][{a[0].attr % 4}]"
                i = self.expr(a[0], names)
                return f"{e.attr}[({i}) / 4][({i}) % 4]"
            return f"{e.attr}[{self.expr(a[0], names)}]"
        if op in INFIX:
            lhs, rhs = self.expr(a[0], names), self.expr(a[1], names)
            if op in ("shl", "shr"):
                rhs = f"u32({rhs})" if a[1].dtype != "u32" else rhs
            if op == "div" and e.dtype == "f32" and a[0].is_const and a[1].is_const:
                return f"({lhs} / ({rhs} + 0.0f * {lhs}))"  # keep naga from const-folding 1/0
            return f"({lhs} {INFIX[op]} {rhs})"
        if op in PREFIX:
            return f"({PREFIX[op]}{self.expr(a[0], names)})"
        if op == "splat":
            return f"vec4<f32>({self.expr(a[0], names)})"
        if op == "unpack_f16":
            return f"unpack2x16float({self.expr(a[0], names)}).x"
        if op in HELPERS:
            self.helpers.add(op)
            return f"wi_{op}({self.expr(a[0], names)})"
        if op == "lane":
            return f"{self.expr(a[0], names)}.{e.attr}"
        if op == "sgbcast":
            return f"subgroupBroadcast({self.expr(a[0], names)}, {e.attr}u)"
        if op == "vec4":
            return f"vec4<f32>({', '.join(self.expr(x, names) for x in a)})"
        if op == "pack4i8":
            return f"pack4xI8(vec4<i32>({', '.join(self.expr(x, names) for x in a)}))"
        if op == "dot4i8":
            return f"dot4I8Packed({self.expr(a[0], names)}, {self.expr(a[1], names)})"
        if op == "select":
            c, t, f = (self.expr(x, names) for x in a)
            return f"select({f}, {t}, {c})"
        if op == "cast":
            return f"{TYPE[e.dtype]}({self.expr(a[0], names)})"
        if op == "bitcast":
            return f"bitcast<{e.dtype}>({self.expr(a[0], names)})"
        if op not in BUILTIN_CALL:
            raise NotImplementedError(f"kernel {self.k.name}: WGSL has no {op} ({e.dtype}); "
                                      "legalize the kernel first (wgsl_codegen/legalize.py)")
        return f"{BUILTIN_CALL[op]}({', '.join(self.expr(x, names) for x in a)})"

    def bind_common(self, exprs: list[Expr], indent: str) -> dict:
        """Emit `let` for sub-expressions used more than once in `exprs`."""
        uses: dict[int, int] = {}
        order: list[Expr] = []
        seen: set[int] = set()

        def visit(node: Expr):
            stack = [node]
            while stack:
                n = stack.pop()
                uses[id(n)] = uses.get(id(n), 0) + 1
                if id(n) in seen:
                    continue
                seen.add(id(n))
                stack.extend(n.args)

        for x in exprs:
            visit(x)
        # post-order so children are bound before parents
        names: dict = {}
        for n in _postorder(exprs):
            if uses.get(id(n), 0) > 1 and n.op not in ("const", "var") and n.args:
                text = self.expr(n, names)
                name = f"t{self.tmp}"
                self.tmp += 1
                self.lines.append(f"{indent}let {name} = {text};")
                names[n] = name
            order.append(n)
        return names

    # --- statements --------------------------------------------------------
    def stmts(self, body, depth: int):
        ind = "  " * depth
        for s in body:
            exprs = kir.stmt_exprs(s)
            names = self.bind_common(exprs, ind) if exprs else {}
            x = lambda e: self.expr(e, names)  # noqa: E731
            if isinstance(s, kir.Let):
                self.lines.append(f"{ind}let {s.name} = {x(s.value)};")
            elif isinstance(s, kir.Decl):
                init = f" = {x(s.init)}" if s.init is not None else ""
                self.lines.append(f"{ind}var {s.name}: {TYPE[s.dtype]}{init};")
            elif isinstance(s, kir.Assign):
                self.lines.append(f"{ind}{s.name} = {x(s.value)};")
            elif isinstance(s, kir.Store):
                self.lines.append(f"{ind}{s.buf}[{x(s.index)}] = {x(s.value)};")
            elif isinstance(s, kir.SStore):
                self.lines.append(f"{ind}{s.name}[{x(s.index)}] = {x(s.value)};")
            elif isinstance(s, kir.For):
                self.lines.append(
                    f"{ind}for (var {s.var}: i32 = {x(s.start)}; {s.var} < {x(s.stop)}; {s.var} += {s.step}i) {{")
                self.stmts(s.body, depth + 1)
                self.lines.append(f"{ind}}}")
            elif isinstance(s, kir.If):
                self.lines.append(f"{ind}if ({x(s.cond)}) {{")
                self.stmts(s.then, depth + 1)
                if s.orelse:
                    self.lines.append(f"{ind}}} else {{")
                    self.stmts(s.orelse, depth + 1)
                self.lines.append(f"{ind}}}")
            elif isinstance(s, kir.Barrier):
                self.lines.append(f"{ind}workgroupBarrier();")
            else:
                raise TypeError(f"unknown statement {s!r}")


def _postorder(roots: list[Expr]):
    seen: set[int] = set()
    for r in roots:
        for n in kir.walk(r, seen):
            yield n


def _helper(fn: str) -> str:
    """`fn wi_<fn>(x: f32) -> f32`: the body is legalize.py's rule for the feature, legalized for WGSL."""
    from .legalize import RULES, legalize
    x = kir.var("x", "f32")
    body = RULES[fn](None, kir.unary(fn, x))
    k = legalize(kir.Kernel(f"wi_{fn}", [], (1, 1, 1), [kir.Let("r", body)], []), SUPPORTS - set(HELPERS))
    r = _Renderer(k)
    value = k.body[0].value
    names = r.bind_common([value], "  ")
    return "\n".join([f"fn wi_{fn}(x: f32) -> f32 {{"] + r.lines + [f"  return {r.expr(value, names)};", "}"])


def render(kernel: kir.Kernel) -> str:
    """WGSL source of `kernel` (legalized for SUPPORTS), entry point `main`."""
    if any(a.dtype == "bool" for a in kernel.bindings + kernel.shared):
        raise NotImplementedError(f"kernel {kernel.name}: WGSL has no bool storage; "
                                  "legalize the kernel first (wgsl_codegen/legalize.py)")
    r = _Renderer(kernel)
    r.stmts(kernel.body, 1)
    head = [f"// webiree kernel {kernel.name}"]
    if any(b.dtype in ("f16", "vec4h") for b in kernel.bindings):
        head.append("enable f16;")     # halves in storage (compiler/half_storage.py): needs shader-f16
    for b in kernel.bindings:
        if b.uniform:
            head.append(f"@group(0) @binding({b.slot}) var<uniform> {b.name}: array<vec4<i32>, {-(-b.uniform // 4)}>;")
        else:
            head.append(f"@group(0) @binding({b.slot}) var<storage, read_write> {b.name}: array<{TYPE[b.dtype]}>;")
    for s in kernel.shared:
        head.append(f"var<workgroup> {s.name}: array<{TYPE[s.dtype]}, {s.size}>;")
    helpers = [_helper(fn) for fn in sorted(r.helpers)]
    if r.uses_wi_f32 or any("wi_f32(" in h for h in helpers):
        head.append(WI_F32)
    head += helpers
    x, y, z = kernel.workgroup_size
    head.append(f"@compute @workgroup_size({x}, {y}, {z})")
    head.append("fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,"
                " @builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,"
                " @builtin(local_invocation_index) lindex: u32) {")
    return "\n".join(head + r.lines + ["}", ""])
