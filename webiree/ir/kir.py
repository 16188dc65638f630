"""Kernel IR: the one description of a compute kernel (DESIGN.md contract 4).

Every dispatch the compiler forms is described here, as a tree of typed
expressions and a short list of structured statements; `wgsl_codegen/wgsl.py`
renders it to WGSL text and `wgsl_codegen/spirv.py` to SPIR-V, both after
`wgsl_codegen/legalize.py` has rewritten it for them. No kernel is ever
written as a string anywhere else.

Ops mean what webiree defines, whatever a target's instruction of the same
name does: `erf`; `tanh` (exactly +-1 for large |x|, NaN passes through);
`isnan` / `isinf` (true to the bits, also where a shader compiler assumes
finite floats); `round_f16` / `round_bf16` (an f32 rounded to the nearest float16 /
bfloat16, ties to even, still held as f32: overflow gives inf, NaN stays NaN); integer `div` / `mod` (WGSL's: x / 0 = x, x % 0 = 0,
MIN / -1 = MIN, MIN % -1 = 0); shifts (amount taken mod 32); f32 -> i32 / u32
`cast` (saturating); bool in storage (u32 0 / 1); `unpack_f16` (the half in a word's low
16 bits, subnormals exact). The legalization writes each
of these, once, in primitive ops for a renderer that lacks it.

Expressions are hash-consed (the constructors return the same object for the same
structure), so a repeated sub-expression is one object and the renderer can
bind it once with `let`. Arithmetic on constants is folded at construction,
which keeps index math (strides, offsets) small.

Scalar types: 'f32', 'i32', 'u32', 'bool'; one vector type, 'vec4f' (four
f32), for wide loads and stores. Index math is i32 throughout. 'f16' and 'vec4h' are
storage types only (a binding of halves, compiler/half_storage.py): a load of one is cast to
f32 / vec4f at once, and a value is cast to it only to be stored. 'vec4u' is a load type only
(four words of packed 8-bit integers, read at once): its lanes are taken as u32.

Packed 8-bit integers: `pack4i8(a, b, c, d)` puts the low 8 bits of four i32 into one u32 (a in
bits 0-7); `dot4i8(x, y)` is the i32 sum of the products of the four signed bytes of two such
words (WGSL's pack4xI8 and dot4I8Packed; legalize.py writes both with shifts for SPIR-V).
"""

from __future__ import annotations

import math
import struct
import weakref
from dataclasses import dataclass, field

SCALARS = ("f32", "i32", "u32", "bool")

BINARY = {  # op -> result dtype rule: "same" or "bool"
    "add": "same", "sub": "same", "mul": "same", "div": "same", "mod": "same",
    "min": "same", "max": "same", "pow": "same", "atan2": "same",
    "band": "same", "bor": "same", "bxor": "same", "shl": "same", "shr": "same",
    "lt": "bool", "le": "bool", "gt": "bool", "ge": "bool", "eq": "bool", "ne": "bool",
    "and": "bool", "or": "bool",
}
UNARY = {
    "neg", "not", "bnot", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt",
    "floor", "ceil", "round", "trunc", "sign", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "isnan", "isinf",
    "round_f16", "round_bf16",
}


def _f32(v: float) -> float:
    """Round a Python float to the nearest float32 (keeps folding faithful)."""
    try:
        return struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def _wrap_i32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= (1 << 31) else v


class Expr:
    """A typed, immutable, hash-consed expression node.

    op:    'const' | 'var' | 'load' | 'sload' | 'cast' | 'bitcast' | 'select' | 'fma' | 'sgbcast' | 'unpack_f16'
           | 'clamp' | 'pack4i8' | 'dot4i8' | a key of BINARY | a member of UNARY
    dtype: the scalar type of the value
    args:  child expressions
    attr:  constant value, variable or buffer name, or None
    """

    __slots__ = ("op", "dtype", "args", "attr", "__weakref__")
    _interned: "weakref.WeakValueDictionary[tuple, Expr]" = weakref.WeakValueDictionary()

    def __init__(self, op, dtype, args, attr):  # build nodes with the functions below
        self.op, self.dtype, self.args, self.attr = op, dtype, args, attr

    # Expr nodes are compared by identity (hash-consing makes that structural).
    __hash__ = object.__hash__

    def __repr__(self):
        if self.op == "const":
            return f"{self.attr!r}:{self.dtype}"
        if self.op == "var":
            return str(self.attr)
        inner = ", ".join(map(repr, self.args))
        return f"{self.op}{'[' + str(self.attr) + ']' if self.attr else ''}({inner})"

    # --- Python operators build expressions (numbers become constants) ---
    def __add__(self, o): return binary("add", self, o)
    def __radd__(self, o): return binary("add", o, self)
    def __sub__(self, o): return binary("sub", self, o)
    def __rsub__(self, o): return binary("sub", o, self)
    def __mul__(self, o): return binary("mul", self, o)
    def __rmul__(self, o): return binary("mul", o, self)
    def __truediv__(self, o): return binary("div", self, o)
    def __rtruediv__(self, o): return binary("div", o, self)
    def __floordiv__(self, o): return binary("div", self, o)  # integer division (truncating)
    def __mod__(self, o): return binary("mod", self, o)
    def __neg__(self): return unary("neg", self)
    def __lt__(self, o): return binary("lt", self, o)
    def __le__(self, o): return binary("le", self, o)
    def __gt__(self, o): return binary("gt", self, o)
    def __ge__(self, o): return binary("ge", self, o)
    def __and__(self, o): return binary("and" if self.dtype == "bool" else "band", self, o)
    def __or__(self, o): return binary("or" if self.dtype == "bool" else "bor", self, o)

    @property
    def is_const(self) -> bool:
        return self.op == "const"


def _make(op, dtype, args=(), attr=None) -> Expr:
    key = (op, dtype, tuple(id(a) for a in args), _const_key(attr) if op == "const" else attr)
    found = Expr._interned.get(key)
    if found is not None:
        return found
    node = Expr(op, dtype, args, attr)
    Expr._interned[key] = node
    return node


def _const_key(v):
    if isinstance(v, float):
        if math.isnan(v):
            return ("f", "nan")
        return ("f", v, math.copysign(1.0, v))
    return (type(v).__name__, v)



# ----------------------------------------------------------------------------
# constructors

def const(value, dtype: str) -> Expr:
    if dtype == "f32":
        value = _f32(float(value))
    elif dtype == "i32":
        value = _wrap_i32(int(value))
    elif dtype == "u32":
        value = int(value) & 0xFFFFFFFF
    elif dtype == "bool":
        value = bool(value)
    else:
        raise ValueError(f"unknown scalar type {dtype}")
    return _make("const", dtype, (), value)


def f32(v) -> Expr:
    return const(v, "f32")


def size_f32(n) -> Expr:
    """A size (an int or a symbolic Dim) as an f32 value."""
    if hasattr(n, "__kir__"):
        return cast(n.__kir__(), "f32")
    return f32(float(n))


def i32(v) -> Expr:
    if hasattr(v, "__kir__"):       # a symbolic size (ir/sym.py)
        return v.__kir__()
    return const(v, "i32")


def var(name: str, dtype: str) -> Expr:
    return _make("var", dtype, (), name)


def load(buf: str, index: Expr, dtype: str) -> Expr:
    return _make("load", dtype, (as_expr(index, "i32"),), buf)


def sload(name: str, index: Expr, dtype: str) -> Expr:
    """Read workgroup (shared) memory."""
    return _make("sload", dtype, (as_expr(index, "i32"),), name)


def as_expr(x, dtype: str) -> Expr:
    if isinstance(x, Expr):
        return x
    if hasattr(x, "__kir__"):       # a symbolic size (ir/sym.py): read from the dims buffer
        return x.__kir__()
    if isinstance(x, bool):
        return const(x, "bool") if dtype == "bool" else const(int(x), dtype)
    return const(x, dtype)


def _pair(a, b):
    if isinstance(a, Expr) and isinstance(b, Expr):
        if a.dtype != b.dtype:
            raise TypeError(f"dtype mismatch {a.dtype} vs {b.dtype}")
        return a, b
    if isinstance(a, Expr):
        return a, as_expr(b, a.dtype)
    if isinstance(b, Expr):
        return as_expr(a, b.dtype), b
    if hasattr(a, "__kir__") or hasattr(b, "__kir__"):
        return _pair(as_expr(a, "i32"), b)
    raise TypeError("binary op needs at least one Expr")


def _fold_binary(op, a, b, dtype):
    x, y = a.attr, b.attr
    if dtype == "bool" and op in ("and", "or", "eq", "ne"):
        return {"and": x and y, "or": x or y, "eq": x == y, "ne": x != y}[op]
    if a.dtype in ("i32", "u32"):
        if op == "add": return x + y
        if op == "sub": return x - y
        if op == "mul": return x * y
        if op == "div" and y != 0: return int(x / y)  # truncating, as WGSL
        if op == "mod" and y != 0: return int(math.fmod(x, y))
        if op == "min": return min(x, y)
        if op == "max": return max(x, y)
        if op in ("lt", "le", "gt", "ge", "eq", "ne"):
            return {"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[op]
    if a.dtype == "f32" and op in ("add", "sub", "mul") and math.isfinite(x) and math.isfinite(y):
        return {"add": x + y, "sub": x - y, "mul": x * y}[op]
    return None


def binary(op: str, a, b) -> Expr:
    a, b = _pair(a, b)
    dtype = "bool" if BINARY[op] == "bool" else a.dtype
    if a.is_const and b.is_const:
        v = _fold_binary(op, a, b, dtype)
        if v is not None:
            return const(v, dtype)
    # identities that keep index arithmetic short (exact for integers; for
    # floats only those that hold for every value, NaN included)
    if a.dtype in ("i32", "u32"):
        if op == "add" and b.is_const and b.attr == 0: return a
        if op == "add" and a.is_const and a.attr == 0: return b
        if op == "sub" and b.is_const and b.attr == 0: return a
        if op == "mul" and b.is_const and b.attr == 1: return a
        if op == "mul" and a.is_const and a.attr == 1: return b
        if op == "mul" and ((b.is_const and b.attr == 0) or (a.is_const and a.attr == 0)):
            return const(0, a.dtype)
        if op == "div" and b.is_const and b.attr == 1: return a
        if op == "mod" and b.is_const and b.attr == 1: return const(0, a.dtype)
    elif a.dtype == "f32":
        if op == "mul" and b.is_const and b.attr == 1.0: return a
        if op == "mul" and a.is_const and a.attr == 1.0: return b
        if op == "div" and b.is_const and b.attr == 1.0: return a
        if op in ("add", "sub") and b.is_const and b.attr == 0.0 and math.copysign(1, b.attr) > 0 and op == "sub":
            return a
    return _make(op, dtype, (a, b))


def unary(op: str, a: Expr) -> Expr:
    if op not in UNARY:
        raise ValueError(op)
    if a.is_const and a.dtype in ("i32", "u32") and op == "neg":
        return const(-a.attr, a.dtype)
    if a.is_const and a.dtype == "bool" and op == "not":
        return const(not a.attr, "bool")
    if op in ("round_f16", "round_bf16") and a.op in (op, "unpack_f16" if op == "round_f16" else op):
        return a        # already a value of the narrow type: rounding again changes nothing
    dtype = "bool" if op in ("isnan", "isinf") else a.dtype
    return _make(op, dtype, (a,))


def select(cond: Expr, if_true, if_false) -> Expr:
    """cond ? if_true : if_false (both sides are evaluated)."""
    t, f = _pair(if_true, if_false)
    if cond.is_const:
        return t if cond.attr else f
    if t is f:
        return t
    return _make("select", t.dtype, (cond, t, f))


def cast(x: Expr, dtype: str) -> Expr:
    if x.dtype == dtype:
        return x
    if x.is_const and dtype in SCALARS:
        v = x.attr
        if dtype == "f32":
            return const(float(v), dtype)
        if dtype == "bool":
            return const(bool(v), dtype)
        if x.dtype != "f32" or math.isfinite(v):
            return const(int(v), dtype)
    return _make("cast", dtype, (x,))


def bitcast(x: Expr, dtype: str) -> Expr:
    return x if x.dtype == dtype else _make("bitcast", dtype, (x,))


def unpack_f16(word: Expr) -> Expr:
    """The IEEE half in the low 16 bits of the u32 `word`, as f32 (exact: subnormals, inf, NaN)."""
    return _make("unpack_f16", "f32", (as_expr(word, "u32"),))


def splat(x: Expr) -> Expr:
    """A vec4f with all four lanes equal to the f32 `x`."""
    return _make("splat", "vec4f", (as_expr(x, "f32"),))


def lane(v: Expr, i: int) -> Expr:
    """Lane i (0..3) of a vec4f (an f32) or of a vec4u (a u32)."""
    return _make("lane", "u32" if v.dtype == "vec4u" else "f32", (v,), "xyzw"[i])


def pack4i8(a, b, c, d) -> Expr:
    """The low 8 bits of four i32 values in one u32, `a` in the lowest byte."""
    return _make("pack4i8", "u32", tuple(as_expr(x, "i32") for x in (a, b, c, d)))


def dot4i8(x, y) -> Expr:
    """The i32 sum of the products of the four signed bytes of the u32 words x and y."""
    return _make("dot4i8", "i32", (as_expr(x, "u32"), as_expr(y, "u32")))


def subgroup_broadcast(v: Expr, lane_id: int) -> Expr:
    """The value `v` of subgroup invocation `lane_id` (a constant), in every invocation.
    Kernels using it need the subgroups feature and record the subgroup size they assume."""
    return _make("sgbcast", v.dtype, (v,), int(lane_id))


def uses_subgroups(kernel: "Kernel") -> bool:
    return any(n.op == "sgbcast" for s in statements(kernel.body) for e in stmt_exprs(s) for n in walk(e))


PACKED_4X8 = "packed_4x8_integer_dot_product"   # the WGSL language feature of pack4i8 and dot4i8


def uses_packed_4x8(kernel: "Kernel") -> bool:
    return any(n.op in ("pack4i8", "dot4i8") for s in statements(kernel.body) for e in stmt_exprs(s) for n in walk(e))


def vec4(a, b, c, d) -> Expr:
    return _make("vec4", "vec4f", tuple(as_expr(x, "f32") for x in (a, b, c, d)))


def minimum(a, b) -> Expr:
    return binary("min", a, b)


def maximum(a, b) -> Expr:
    return binary("max", a, b)


def clamp(x: Expr, lo, hi) -> Expr:
    lo, hi = as_expr(lo, x.dtype), as_expr(hi, x.dtype)
    return _make("clamp", x.dtype, (x, lo, hi))


def fma(a: Expr, b: Expr, c: Expr) -> Expr:
    return _make("fma", a.dtype, (a, b, c))


def call(op: str, *args) -> Expr:
    """Math by name: unary ops, 'pow', 'atan2', 'min', 'max'."""
    if op in UNARY:
        return unary(op, args[0])
    return binary(op, args[0], args[1])


def substitute(e: Expr, mapping: dict, cache: dict | None = None) -> Expr:
    """Rebuild `e` with nodes replaced by `mapping` (keys are Expr nodes or
    callables (node) -> Expr | None, tried on every node)."""
    if cache is None:
        cache = {}
    fn = mapping.get("__fn__") if isinstance(mapping, dict) else None
    return _subst(e, mapping, fn, cache)


def _subst(e, mapping, fn, cache):
    got = cache.get(e)
    if got is not None:
        return got
    if e in mapping:
        out = mapping[e]
    else:
        out = fn(e) if fn else None
        if out is None:
            if e.args:
                new_args = tuple(_subst(a, mapping, fn, cache) for a in e.args)
                out = e if all(n is o for n, o in zip(new_args, e.args)) else rebuild(e, new_args)
            else:
                out = e
    cache[e] = out
    return out


def rebuild(e: Expr, args: tuple) -> Expr:
    """The node `e` with new children (re-running folding rules)."""
    if e.op in BINARY:
        return binary(e.op, *args)
    if e.op in UNARY:
        return unary(e.op, args[0])
    if e.op == "select":
        return select(*args)
    if e.op == "cast":
        return cast(args[0], e.dtype)
    if e.op == "bitcast":
        return bitcast(args[0], e.dtype)
    if e.op == "load":
        return load(e.attr, args[0], e.dtype)
    if e.op == "sload":
        return sload(e.attr, args[0], e.dtype)
    return _make(e.op, e.dtype, args, e.attr)


def walk(e: Expr, seen: set | None = None):
    """Every distinct node below and including `e`, children first."""
    seen = set() if seen is None else seen
    stack = [(e, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in seen:
            continue
        if done:
            seen.add(id(node))
            yield node
        else:
            stack.append((node, True))
            stack.extend((a, False) for a in node.args if id(a) not in seen)


def loads_of(e: Expr) -> list[Expr]:
    return [n for n in walk(e) if n.op == "load"]


def cost(e: Expr) -> int:
    """A rough count of operations (for fusion decisions)."""
    return sum(1 for n in walk(e) if n.op not in ("const", "var"))


def varying_cost(e: Expr, index: Expr) -> int:
    """cost(e) less the operations that do not depend on `index` (a scale read from a fixed
    place and the arithmetic on it): what computing `e` costs per element beyond its first."""
    varying: set[int] = set()
    count = 0
    for n in walk(e):
        if n is index or any(id(a) in varying for a in n.args):
            varying.add(id(n))
            count += n.op not in ("const", "var")
    return count


# ----------------------------------------------------------------------------
# statements

@dataclass
class Let:
    name: str
    value: Expr


@dataclass
class Decl:
    """A mutable local `var name: dtype = init`."""
    name: str
    dtype: str
    init: Expr | None = None


@dataclass
class Assign:
    name: str
    value: Expr


@dataclass
class Store:
    buf: str
    index: Expr
    value: Expr


@dataclass
class SStore:
    """Write workgroup (shared) memory."""
    name: str
    index: Expr
    value: Expr


@dataclass
class For:
    var: str
    start: Expr
    stop: Expr
    body: list
    step: int = 1
    unroll: bool = False


@dataclass
class If:
    cond: Expr
    then: list
    orelse: list = field(default_factory=list)


@dataclass
class Barrier:
    """workgroupBarrier(): every invocation of the workgroup must reach it."""


def lvar(name: str, dtype: str) -> Expr:
    """Read a local variable or Let binding."""
    return var(name, dtype)


# builtins (rendered as WGSL builtins / SPIR-V built-in variables)
GID = tuple(var(f"gid.{c}", "u32") for c in "xyz")      # global_invocation_id
LID = tuple(var(f"lid.{c}", "u32") for c in "xyz")      # local_invocation_id
WID = tuple(var(f"wid.{c}", "u32") for c in "xyz")      # workgroup_id
NWG = tuple(var(f"nwg.{c}", "u32") for c in "xyz")      # num_workgroups
LINDEX = var("lindex", "u32")                            # local_invocation_index


@dataclass
class Binding:
    """A storage buffer the kernel reads and/or writes: array<dtype>. `uniform` > 0: instead a
    uniform buffer of that many i32 words (the dims buffer, read as array<vec4<i32>>: uniform
    values, so loop bounds may hold barriers and CPU renderers keep them scalar)."""
    slot: int
    name: str
    dtype: str
    writes: bool = False
    uniform: int = 0


@dataclass
class SharedArray:
    name: str
    dtype: str
    size: int


@dataclass
class Kernel:
    name: str
    bindings: list[Binding]
    workgroup_size: tuple[int, int, int]
    body: list
    shared: list[SharedArray] = field(default_factory=list)

    def binding(self, name: str) -> Binding:
        for b in self.bindings:
            if b.name == name:
                return b
        raise KeyError(name)


def statements(body):
    """Every statement, nested ones included, in order."""
    for s in body:
        yield s
        if isinstance(s, For):
            yield from statements(s.body)
        elif isinstance(s, If):
            yield from statements(s.then)
            yield from statements(s.orelse)


def stmt_exprs(s) -> list[Expr]:
    if isinstance(s, Let):
        return [s.value]
    if isinstance(s, Decl):
        return [s.init] if s.init is not None else []
    if isinstance(s, Assign):
        return [s.value]
    if isinstance(s, (Store, SStore)):
        return [s.index, s.value]
    if isinstance(s, For):
        return [s.start, s.stop]
    if isinstance(s, If):
        return [s.cond]
    return []


def map_exprs(body: list, fn) -> list:
    """A copy of `body` (nested statements too) with every expression `e` replaced by `fn(e)`."""
    out = []
    for s in body:
        if isinstance(s, Let):
            out.append(Let(s.name, fn(s.value)))
        elif isinstance(s, Decl):
            out.append(Decl(s.name, s.dtype, None if s.init is None else fn(s.init)))
        elif isinstance(s, Assign):
            out.append(Assign(s.name, fn(s.value)))
        elif isinstance(s, Store):
            out.append(Store(s.buf, fn(s.index), fn(s.value)))
        elif isinstance(s, SStore):
            out.append(SStore(s.name, fn(s.index), fn(s.value)))
        elif isinstance(s, For):
            out.append(For(s.var, fn(s.start), fn(s.stop), map_exprs(s.body, fn), s.step, s.unroll))
        elif isinstance(s, If):
            out.append(If(fn(s.cond), map_exprs(s.then, fn), map_exprs(s.orelse, fn)))
        else:
            out.append(s)
    return out


def subst_stmts(body: list, mapping: dict) -> list:
    """A copy of `body` with expression nodes replaced by `mapping`."""
    cache: dict = {}
    return map_exprs(body, lambda e: substitute(e, mapping, cache))


def unroll(body: list) -> list:
    """Expand every `For(unroll=True)` with constant bounds into copies of its body.

    Let names inside an unrolled body get a suffix per copy so they stay unique.
    """
    out = []
    for s in body:
        if isinstance(s, For):
            inner = unroll(s.body)
            if s.unroll and s.start.is_const and s.stop.is_const:
                for i in range(s.start.attr, s.stop.attr, s.step):
                    mapping = {var(s.var, "i32"): i32(i)}
                    copy = subst_stmts(inner, mapping)
                    out.extend(rename_lets(copy, f"_{s.var}{i}"))
                continue
            out.append(For(s.var, s.start, s.stop, inner, s.step))
        elif isinstance(s, If):
            out.append(If(s.cond, unroll(s.then), unroll(s.orelse)))
        else:
            out.append(s)
    return out


def hoist_invariants(body: list, written, prefix: str = "inv") -> list:
    """`body` with every largest subexpression that reads a buffer but depends on nothing that varies
    within the kernel computed once, at the top: no invocation or workgroup id, loop counter,
    variable or workgroup memory, only loads (at such indices) of buffers the kernel never writes
    (`written`: their names) and the leading top-level Lets of such values (the sizes bind_dims
    reads). Shader compilers keep such loads where they are: every binding is read_write, so a
    store anywhere may alias them; lavapipe then pays a load per lane for each, every time (an int8
    product's dequantization scale, read again for each of its 128 outputs per invocation)."""
    written = set(written)
    invariant_names: set = set()
    memo: dict = {}
    loads: dict = {}

    def invariant(n: Expr) -> bool:
        got = memo.get(n)
        if got is None:
            if n.op == "var":
                got = n.attr in invariant_names
            elif n.op in ("sload", "sgbcast"):
                got = False
            elif n.op == "load":
                got = n.attr not in written and invariant(n.args[0])
            else:
                got = all(invariant(a) for a in n.args)
            memo[n] = got
        return got

    def reads(n: Expr) -> bool:
        got = loads.get(n)
        if got is None:
            got = loads[n] = n.op == "load" or any(reads(a) for a in n.args)
        return got

    k = 0
    while k < len(body) and isinstance(body[k], Let) and invariant(body[k].value):
        invariant_names.add(body[k].name)
        memo.clear()
        k += 1
    hoisted: dict = {}
    lets: list = []

    def fn(node: Expr):
        if node.op in ("const", "var") or not invariant(node) or not reads(node):
            return None
        name = hoisted.get(node)
        if name is None:
            name = hoisted[node] = f"{prefix}{len(hoisted)}"
            lets.append(Let(name, node))
        return var(name, node.dtype)
    cache: dict = {}
    rest = map_exprs(body[k:], lambda e: substitute(e, {"__fn__": fn}, cache))
    return body[:k] + lets + rest


def share_reads(stmts: list, written, prefix: str = "sh") -> list:
    """`stmts` (straight-line statements, such as a register block's guarded stores) preceded by a
    Let for every largest subexpression that reads a buffer the kernel never writes and appears in
    two or more of them: a bias or a column's scale read once per column, not once per output. A
    WebGPU dispatch may not bind one byte range writable twice, so no store here changes what such
    a read gives; a shader compiler cannot tell, and would read it again after every store."""
    written = set(written)
    count: dict = {}
    reads: dict = {}

    def reads_memory(n: Expr) -> bool:
        got = reads.get(n)
        if got is None:
            got = reads[n] = (n.op == "load" and n.attr not in written) or any(reads_memory(a) for a in n.args)
        return got

    clean_memo: dict = {}

    def clean(n: Expr) -> bool:      # reads only buffers the kernel never writes, no workgroup memory
        got = clean_memo.get(n)
        if got is None:
            got = clean_memo[n] = n.op != "sload" and not (n.op == "load" and n.attr in written) and \
                all(clean(a) for a in n.args)
        return got

    for s in stmts:
        seen: set = set()
        for e in [x for t in statements([s]) for x in stmt_exprs(t)]:
            for n in walk(e, seen):
                count[n] = count.get(n, 0) + 1
    shared: dict = {}
    lets: list = []

    def fn(node: Expr):
        if node.op in ("const", "var") or count.get(node, 0) < 2 or not reads_memory(node) or not clean(node):
            return None
        name = shared.get(node)
        if name is None:
            inner = substitute(node, {"__fn__": lambda n: fn(n) if n is not node else None})
            name = shared[node] = f"{prefix}{len(shared)}"
            lets.append(Let(name, inner))
        return var(name, node.dtype)
    cache: dict = {}
    rest = map_exprs(stmts, lambda e: substitute(e, {"__fn__": fn}, cache))
    return lets + rest


def rename_lets(body: list, suffix: str) -> list:
    lets = [s for s in statements(body) if isinstance(s, (Let, Decl))]
    if not lets:
        return body
    mapping = {var(s.name, s.value.dtype if isinstance(s, Let) else s.dtype):
               var(s.name + suffix, s.value.dtype if isinstance(s, Let) else s.dtype) for s in lets}
    renamed = subst_stmts(body, mapping)
    for s in statements(renamed):
        if isinstance(s, (Let, Decl)):
            s.name += suffix
        elif isinstance(s, Assign) and any(s.name == l.name for l in lets):
            s.name += suffix
    return renamed
