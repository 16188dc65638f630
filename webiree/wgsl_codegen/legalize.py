"""Legalization: rewrite a kernel into what one renderer prints natively.

Some kernel-IR ops mean what webiree defines rather than what any target's
instruction does (see `ir/kir.py`): erf, a tanh exact for large |x|, NaN/inf
tests on the bits, total integer division, shifts by any amount, saturating
float-to-int casts, bool tensors in memory. Each is a *feature* (`FEATURES`).
A renderer declares the features it prints natively (`wgsl.SUPPORTS`,
`spirv.SUPPORTS`); `legalize(kernel, supports)` rewrites every other one into
kernel-IR expressions made of primitive ops, by the rule in `RULES`. The
formula for each feature is written here and nowhere else, so the renderers
stay mechanical: they print the ops they get and reject an op they do not
know. Loops marked `unroll` are expanded here too (no renderer prints an
unroll hint).

Where it runs: in the compiler driver's "kernels" stage, once per target just
before rendering (`wgsl.render(legalize(k, wgsl.SUPPORTS))`,
`spirv.emit(legalize(k, spirv.SUPPORTS))`); a renderer never calls it. The
result is a new `kir.Kernel` (the input is not changed), a plain value that
can be printed between the two steps. Legalizing a kernel twice is wrong
(a guard would be guarded again): legalize the kernel the compiler built.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir import kir
from ..ir.kir import Expr

FEATURES = {
    "erf": "erf(x)",
    "tanh": "tanh(x), exactly +-1 for |x| > 9 and NaN for NaN",
    "isnan": "isnan(x), a test on the bits",
    "isinf": "isinf(x), a test on the bits",
    "int_divmod_total": "integer x / 0 = x, x % 0 = 0, MIN / -1 = MIN, MIN % -1 = 0",
    "shift_mod32": "the amount of << and >> taken modulo 32",
    "saturating_cast": "f32 -> i32 / u32 clamps to the target's range",
    "cast_to_bool": "x -> bool is x != 0",
    "cast_from_bool": "bool -> f32 / i32 / u32 is 1 or 0",
    "bool_storage": "bool elements of storage buffers and workgroup arrays",
    "round_f16": "an f32 rounded to the nearest float16 (ties to even, overflow to inf, NaN kept), as f32",
    "round_bf16": "an f32 rounded to the nearest bfloat16 (ties to even, NaN kept), as f32",
    "unpack_f16": "the IEEE half in the low 16 bits of a u32, as f32 (subnormals exact)",
    "packed_4x8": "pack4i8 (four i32's low bytes in a u32) and dot4i8 (the i32 dot product of two such words)",
}

# f32 bounds of a saturating conversion: the largest f32 values inside each integer range
CAST_RANGE = {"i32": (-2147483648.0, 2147483520.0), "u32": (0.0, 4294967040.0)}
I32_MIN = -(1 << 31)


def legalize(kernel: kir.Kernel, supports) -> kir.Kernel:
    """`kernel` with every feature outside `supports` rewritten into primitive ops."""
    lg = _Legalizer(kernel, supports)
    body = kir.map_exprs(kir.unroll(kernel.body), lg.expr)
    bindings, shared = kernel.bindings, kernel.shared
    if "bool_storage" not in supports:   # bool in memory is u32 0 / 1: write 1 or 0
        bools = {("buf", b.name) for b in bindings if b.dtype == "bool"}
        bools |= {("sh", s.name) for s in shared if s.dtype == "bool"}
        one, zero = kir.const(1, "u32"), kir.const(0, "u32")
        for s in kir.statements(body):      # the copies made by map_exprs
            if isinstance(s, kir.Store) and ("buf", s.buf) in bools or \
                    isinstance(s, kir.SStore) and ("sh", s.name) in bools:
                s.value = kir.select(s.value, one, zero)
        bindings = [replace(b, dtype="u32") if b.dtype == "bool" else b for b in bindings]
        shared = [replace(s, dtype="u32") if s.dtype == "bool" else s for s in shared]
    return kir.Kernel(kernel.name, bindings, kernel.workgroup_size, body, shared)


class _Legalizer:
    def __init__(self, kernel: kir.Kernel, supports):
        self.rules = {f: rule for f, rule in RULES.items() if f not in supports}
        self.bool_memory = {("load", b.name) for b in kernel.bindings if b.dtype == "bool"}
        self.bool_memory |= {("sload", s.name) for s in kernel.shared if s.dtype == "bool"}
        self.done: dict = {}      # original node -> legal node
        self.seen: set = set()    # ids of the nodes in `done` (kept alive by it)

    def expr(self, root: Expr) -> Expr:
        """`root` rewritten bottom-up: each node gets legal children, then its own rule."""
        for n in kir.walk(root, self.seen):
            args = tuple(self.done[a] for a in n.args)
            node = n if all(x is y for x, y in zip(args, n.args)) else kir.rebuild(n, args)
            self.done[n] = self.lower(node)
        return self.done[root]

    def lower(self, node: Expr) -> Expr:
        """`node` (its children legal already) after its feature's rule, when the renderer lacks it.
        A rule returns None when `node` needs no rewriting."""
        rule = self.rules.get(feature(node, self.bool_memory))
        out = rule(self, node) if rule else None
        return node if out is None else out


def feature(n: Expr, bool_memory=frozenset()) -> str | None:
    """The feature of FEATURES that the node `n` relies on, if any."""
    op = n.op
    if op in ("erf", "tanh", "isnan", "isinf", "round_f16", "round_bf16", "unpack_f16"):
        return op
    if op in ("div", "mod") and n.dtype in ("i32", "u32"):
        return "int_divmod_total"
    if op in ("shl", "shr"):
        return "shift_mod32"
    if op == "cast":
        src = n.args[0].dtype
        if n.dtype == "bool":
            return "cast_to_bool"
        if src == "bool":
            return "cast_from_bool"
        if src == "f32" and n.dtype in CAST_RANGE:
            return "saturating_cast"
    if op in ("load", "sload") and (op, n.attr) in bool_memory:
        return "bool_storage"
    if op in ("pack4i8", "dot4i8"):
        return "packed_4x8"
    return None


# ----------------------------------------------------------------------------
# the rules: (legalizer, node with legal children) -> legal replacement | None

def _scalar(n: Expr) -> Expr:
    if n.args[0].dtype != "f32":
        raise NotImplementedError(f"{n.op} of {n.args[0].dtype} has no legalization (f32 only)")
    return n.args[0]


def _erf(lg, n):
    """Abramowitz & Stegun 7.1.26 (absolute error 1.5e-7), extended to x < 0 as an odd function."""
    x = _scalar(n)
    a = kir.unary("abs", x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    p = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    y = 1.0 - p * kir.unary("exp", -a * a)
    return kir.select(x >= 0.0, y, -y)


def _tanh(lg, n):
    """(e - 1) / (e + 1) with e = exp(2x) of x clamped to [-9, 9]: exact in f32 beyond, and
    free of the inf / inf of the unclamped formula; NaN passes through."""
    x = _scalar(n)
    e = kir.unary("exp", 2.0 * kir.clamp(x, -9.0, 9.0))
    return kir.select(lg.lower(kir.unary("isnan", x)), x, (e - 1.0) / (e + 1.0))


def _float_class(lg, n):
    """On the bits (a compiler may assume floats are finite): |x| above inf's bits is NaN, equal is inf."""
    magnitude = kir.binary("band", kir.bitcast(_scalar(n), "u32"), kir.const(0x7FFFFFFF, "u32"))
    return kir.binary("gt" if n.op == "isnan" else "eq", magnitude, kir.const(0x7F800000, "u32"))


def _int_divmod(lg, n):
    """x op y', y' = 1 where y is 0 or (i32) x is MIN and y is -1: gives WGSL's values
    (x / 1 = x, x % 1 = 0, MIN / 1 = MIN). A constant divisor that cannot trigger it keeps the op."""
    x, y = n.args
    signed = n.dtype == "i32"
    if y.is_const and y.attr != 0 and not (signed and y.attr == -1):
        return None
    bad = kir.binary("eq", y, 0)
    if signed:
        bad = kir.binary("or", bad, kir.binary("and", kir.binary("eq", x, I32_MIN), kir.binary("eq", y, -1)))
    return kir.binary(n.op, x, kir.select(bad, 1, y))


def _shift(lg, n):
    x, k = n.args
    k31 = kir.const(k.attr & 31, k.dtype) if k.is_const else kir.binary("band", k, 31)
    return None if k31 is k else kir.binary(n.op, x, k31)


def _saturating_cast(lg, n):
    return kir.cast(kir.clamp(n.args[0], *CAST_RANGE[n.dtype]), n.dtype)


def _cast_to_bool(lg, n):
    return kir.binary("ne", n.args[0], 0)


def _cast_from_bool(lg, n):
    return kir.select(n.args[0], kir.const(1, n.dtype), kir.const(0, n.dtype))


def _bool_load(lg, n):
    read = kir.load if n.op == "load" else kir.sload
    return kir.binary("ne", read(n.attr, n.args[0], "u32"), kir.const(0, "u32"))


def _u32(v: int) -> Expr:
    return kir.const(v, "u32")


def _round_f16(lg, n):
    """On the bits, so every target rounds alike (WGSL leaves pack2x16float's rounding and overflow to
    the implementation). |x| >= 65520 (inf's half-way point) -> inf; normal f16 range: drop 13 mantissa
    bits, ties to even (a carry moves into the exponent, as it should); below 2^-14: the nearest
    multiple of 2^-24, as round(|x| 2^24) 2^-24 (scalings by powers of two are exact there, and WGSL's
    round is ties to even); NaN unchanged."""
    u = kir.bitcast(_scalar(n), "u32")
    sign = kir.binary("band", u, _u32(0x80000000))
    a = kir.binary("band", u, _u32(0x7FFFFFFF))
    odd = kir.binary("band", kir.binary("shr", a, _u32(13)), _u32(1))
    normal = kir.binary("band", kir.binary("add", kir.binary("add", a, _u32(0xFFF)), odd), _u32(0xFFFFE000))
    scaled = kir.binary("mul", kir.bitcast(a, "f32"), kir.f32(2.0 ** 24))
    sub = kir.bitcast(kir.binary("mul", kir.unary("round", scaled), kir.f32(2.0 ** -24)), "u32")
    mag = kir.select(kir.binary("ge", a, _u32(0x38800000)), normal, sub)
    mag = kir.select(kir.binary("ge", a, _u32(0x477FF000)), _u32(0x7F800000), mag)
    mag = kir.select(kir.binary("gt", a, _u32(0x7F800000)), a, mag)
    return kir.bitcast(kir.binary("bor", sign, mag), "f32")


def _round_bf16(lg, n):
    """The upper 16 bits, rounded to nearest, ties to even (overflow carries into inf); a NaN keeps
    its upper bits with the quiet bit set, so it stays NaN."""
    u = kir.bitcast(_scalar(n), "u32")
    a = kir.binary("band", u, _u32(0x7FFFFFFF))
    odd = kir.binary("band", kir.binary("shr", u, _u32(16)), _u32(1))
    rounded = kir.binary("band", kir.binary("add", kir.binary("add", u, _u32(0x7FFF)), odd), _u32(0xFFFF0000))
    nan = kir.binary("bor", kir.binary("band", u, _u32(0xFFFF0000)), _u32(0x00400000))
    return kir.bitcast(kir.select(kir.binary("gt", a, _u32(0x7F800000)), nan, rounded), "f32")


def _unpack_f16(lg, n):
    """Exponent rebiased (15 -> 127) for normal halves, inf / NaN kept (payload shifted along), and a
    subnormal's integer mantissa times 2^-24, which is exact in f32."""
    h = kir.binary("band", n.args[0], _u32(0xFFFF))
    sign = kir.binary("shl", kir.binary("band", h, _u32(0x8000)), _u32(16))
    e = kir.binary("band", kir.binary("shr", h, _u32(10)), _u32(0x1F))
    m = kir.binary("band", h, _u32(0x3FF))
    exp = kir.select(kir.binary("eq", e, _u32(0x1F)), _u32(0xFF << 23),
                     kir.binary("shl", kir.binary("add", e, _u32(112)), _u32(23)))
    normal = kir.bitcast(kir.binary("bor", kir.binary("bor", sign, exp), kir.binary("shl", m, _u32(13))), "f32")
    tiny = kir.binary("mul", kir.cast(m, "f32"), kir.f32(2.0 ** -24))
    tiny = kir.select(kir.binary("eq", sign, _u32(0)), tiny, kir.unary("neg", tiny))
    return kir.select(kir.binary("eq", e, _u32(0)), tiny, normal)


def _packed_4x8(lg, n):
    """pack4i8: the four low bytes or'ed into place; dot4i8: each signed byte moved to the top of an
    i32 and shifted back down (sign-extended), the four products summed (exact in i32)."""
    if n.op == "pack4i8":
        out = None
        for q, x in enumerate(n.args):
            byte = kir.binary("band", kir.bitcast(x, "u32"), _u32(255))
            byte = kir.binary("shl", byte, _u32(8 * q)) if q else byte
            out = byte if out is None else kir.binary("bor", out, byte)
        return out

    def byte(word, q):
        w = kir.bitcast(word, "i32")
        w = kir.binary("shl", w, kir.i32(24 - 8 * q)) if q < 3 else w
        return kir.binary("shr", w, kir.i32(24))
    x, y = n.args
    total = None
    for q in range(4):
        p = byte(x, q) * byte(y, q)
        total = p if total is None else total + p
    return total


RULES = {
    "erf": _erf, "tanh": _tanh, "isnan": _float_class, "isinf": _float_class,
    "int_divmod_total": _int_divmod, "shift_mod32": _shift, "saturating_cast": _saturating_cast,
    "cast_to_bool": _cast_to_bool, "cast_from_bool": _cast_from_bool, "bool_storage": _bool_load,
    "round_f16": _round_f16, "round_bf16": _round_bf16, "unpack_f16": _unpack_f16, "packed_4x8": _packed_4x8,
}
assert RULES.keys() == FEATURES.keys()
