"""Emit a legalized kernel-IR `Kernel` as a SPIR-V 1.3 binary (Vulkan 1.1 compute).

This walks the very same `kir.Kernel` objects that `wgsl.py` renders, so a
kernel is described once (DESIGN.md contract 4). SPIR-V natively has none of
legalize.FEATURES (`SUPPORTS` is empty): the compiler driver runs
`legalize.legalize(kernel, SUPPORTS)` first, which writes erf, tanh, the NaN/inf
bit tests, WGSL's total integer division, shift amounts mod 32, saturating
f32 -> int conversions and bool storage as primitive ops. What is left maps
op by op:

- every binding is a StorageBuffer `Block struct { T data[]; }` (ArrayStride 4,
  or 16 for vec4f and vec4u) at DescriptorSet 0 / Binding slot;
- shared arrays are Workgroup variables, `Decl`s and loop counters are
  Function variables (zero-initialised at their declaration, as WGSL does);
- builtins are Input variables (GlobalInvocationId, LocalInvocationId,
  WorkgroupId, NumWorkgroups, LocalInvocationIndex);
- `If`/`For` become structured control flow (OpSelectionMerge / OpLoopMerge),
  `Barrier` is OpControlBarrier(Workgroup, Workgroup, AcquireRelease|WorkgroupMemory);
- math goes through GLSL.std.450; non-finite f32 constants are OpBitcast of
  their bits in the entry block (naga's SPIR-V front end rejects them as constants).

Opcode numbers and the module's encoding (ids, sections, types, constants)
are in `spirv_module.py`. A sub-expression is computed once: values without
memory reads or mutable variables are reused in every block they dominate;
the others are reused within one statement (as the WGSL renderer binds them
with `let`).
"""

from __future__ import annotations

import math

from ..ir import kir
from ..ir.kir import Expr
from .spirv_module import (
    GLSL, SC_FUNCTION, SC_INPUT, SC_STORAGE, SC_WORKGROUP, SCOPE_WORKGROUP, SEM_ACQREL_WGMEM, Module,
    OpAccessChain, OpBitcast, OpBranch, OpBranchConditional, OpCapability, OpCompositeConstruct,
    OpCompositeExtract, OpControlBarrier, OpConvertFToS, OpConvertFToU, OpConvertSToF, OpConvertUToF,
    OpDecorate, OpEntryPoint, OpExecutionMode, OpExtension, OpExtInst, OpExtInstImport, OpFConvert, OpFNegate, OpFunction,
    OpFunctionEnd, OpIEqual, OpINotEqual, OpLabel, OpLoad, OpLogicalAnd, OpLogicalEqual, OpLogicalNot,
    OpLogicalNotEqual, OpLogicalOr, OpLoopMerge, OpMemoryModel, OpName, OpNot, OpReturn, OpSelect,
    OpSelectionMerge, OpSNegate, OpStore, OpVariable, f32_bits, string)

# legalize.FEATURES this emitter prints natively: none
SUPPORTS = frozenset()

UNARY_GLSL = {  # kir unary op -> GLSL.std.450 instruction (f32 / vec4f operands)
    "exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "floor": "floor", "ceil": "ceil", "round": "roundeven", "trunc": "trunc", "sin": "sin", "cos": "cos",
    "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan", "sinh": "sinh", "cosh": "cosh",
    "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
}

# binary op -> opcode by operand kind: f (f32 / vec4f), s (i32), u (u32), b (bool)
BIN = {
    "add": {"f": 129, "s": 128, "u": 128}, "sub": {"f": 131, "s": 130, "u": 130},
    "mul": {"f": 133, "s": 132, "u": 132}, "div": {"f": 136, "s": 135, "u": 134},
    "mod": {"f": 140, "s": 138, "u": 137},
    "band": {"s": 199, "u": 199}, "bor": {"s": 197, "u": 197}, "bxor": {"s": 198, "u": 198},
    "shl": {"s": 196, "u": 196}, "shr": {"s": 195, "u": 194},
    "lt": {"f": 184, "s": 177, "u": 176}, "le": {"f": 188, "s": 179, "u": 178},
    "gt": {"f": 186, "s": 173, "u": 172}, "ge": {"f": 190, "s": 175, "u": 174},
    # WGSL: == is ordered, != is unordered (NaN != NaN)
    "eq": {"f": 180, "s": OpIEqual, "u": OpIEqual, "b": OpLogicalEqual},
    "ne": {"f": 183, "s": OpINotEqual, "u": OpINotEqual, "b": OpLogicalNotEqual},
    "and": {"b": OpLogicalAnd}, "or": {"b": OpLogicalOr},
}
MINMAX = {"min": {"f": "fmin", "s": "smin", "u": "umin"}, "max": {"f": "fmax", "s": "smax", "u": "umax"}}
CLAMP = {"f": "fclamp", "s": "sclamp", "u": "uclamp"}
KIND = {"f32": "f", "vec4f": "f", "i32": "s", "u32": "u", "bool": "b"}
# (source, result) -> conversion opcode (f32 -> int operands are in range after legalization)
CONVERT = {("i32", "f32"): OpConvertSToF, ("u32", "f32"): OpConvertUToF, ("f32", "i32"): OpConvertFToS,
           ("f32", "u32"): OpConvertFToU, ("i32", "u32"): OpBitcast, ("u32", "i32"): OpBitcast,
           # halves in storage (compiler/half_storage.py): widened when loaded, narrowed (exact) to be stored
           ("f16", "f32"): OpFConvert, ("f32", "f16"): OpFConvert, ("vec4h", "vec4f"): OpFConvert,
           ("vec4f", "vec4h"): OpFConvert}

BUILTINS = {"gid": 28, "lid": 27, "wid": 26, "nwg": 24, "lindex": 29}


class _Emitter:
    def __init__(self, kernel: kir.Kernel):
        self.k = kernel
        self.m = Module()
        self.code: list[int] = []          # function body after the entry block's variables
        self.vars: list[int] = []          # OpVariable (Function) of the entry block
        self.prelude: list[int] = []       # non-finite f32 values, computed first in the entry block
        self.nonfinite: dict = {}
        # name scopes: name -> ('let', id, dtype) | ('var', ptr, dtype)
        self.scopes: list[dict] = [{}]
        self.pure: list[dict] = [{}]       # layered cache of values valid in dominated blocks
        self.stmt_cache: dict = {}         # values valid within the current statement
        self._pure_memo: dict = {}
        self.mutable = {s.name for s in kir.statements(kernel.body) if isinstance(s, kir.Decl)}
        self.mutable |= {s.var for s in kir.statements(kernel.body) if isinstance(s, kir.For)}

    # --- small helpers ------------------------------------------------------
    def op(self, opcode, *operands) -> None:
        self.m.ins(self.code, opcode, *operands)

    def val(self, opcode, tkey, *operands) -> int:
        i = self.m.id()
        self.m.ins(self.code, opcode, self.m.type(tkey), i, *operands)
        return i

    def ext(self, tkey, name, *args) -> int:
        return self.val(OpExtInst, tkey, self.glsl, GLSL[name], *args)

    def c(self, value, dtype) -> int:
        if dtype == "f32" and not math.isfinite(value):
            # naga's SPIR-V front end rejects non-finite float constants (as the WGSL renderer
            # avoids non-finite literals): bitcast the bits once at the top of the entry block
            bits = f32_bits(value)
            got = self.nonfinite.get(bits)
            if got is None:
                got = self.m.id()
                self.m.ins(self.prelude, OpBitcast, self.m.type("f32"), got, self.m.const(bits, "u32"))
                self.nonfinite[bits] = got
            return got
        return self.m.const(value, dtype)

    def lookup(self, name: str):
        for s in reversed(self.scopes):
            if name in s:
                return s[name]
        raise KeyError(f"kernel {self.k.name}: unknown name {name}")

    def push(self):
        self.scopes.append({})
        self.pure.append({})

    def pop(self):
        self.scopes.pop()
        self.pure.pop()

    def is_pure(self, e: Expr) -> bool:
        got = self._pure_memo.get(e)
        if got is None:
            if e.op in ("load", "sload"):
                got = False
            elif e.op == "var":
                got = e.attr not in self.mutable
            else:
                got = all(self.is_pure(a) for a in e.args)
            self._pure_memo[e] = got
        return got

    # --- module skeleton ------------------------------------------------------
    def build(self) -> bytes:
        m = self.m
        k = self.k
        m.ins(m.header, OpCapability, 1)  # Shader
        halves = any(b.dtype in ("f16", "vec4h") for b in k.bindings)
        if halves:
            m.ins(m.header, OpCapability, 4433)  # StorageBuffer16BitAccess (loads, stores, OpFConvert)
        if kir.uses_subgroups(k):
            m.ins(m.header, OpCapability, 61)  # GroupNonUniform
            m.ins(m.header, OpCapability, 64)  # GroupNonUniformBallot (OpGroupNonUniformBroadcast)
        self.glsl = m.id()
        main = m.id()
        if any(a.dtype == "bool" for a in k.bindings + k.shared):
            raise NotImplementedError(f"kernel {k.name}: SPIR-V has no bool storage; "
                                      "legalize the kernel first (wgsl_codegen/legalize.py)")
        # storage buffers
        self.buffers = {}
        for b in k.bindings:
            ptr = m.type(("ptr", SC_STORAGE, ("block", b.dtype)))
            v = m.id()
            m.ins(m.globals, OpVariable, ptr, v, SC_STORAGE)
            m.ins(m.annotations, OpDecorate, v, 34, 0)       # DescriptorSet 0
            m.ins(m.annotations, OpDecorate, v, 33, b.slot)  # Binding
            m.ins(m.debug, OpName, v, string(b.name))
            self.buffers[b.name] = (v, b.dtype)
        self.shared = {}
        for s in k.shared:
            ptr = m.type(("ptr", SC_WORKGROUP, ("array", s.dtype, s.size)))
            v = m.id()
            m.ins(m.globals, OpVariable, ptr, v, SC_WORKGROUP)
            m.ins(m.debug, OpName, v, string(s.name))
            self.shared[s.name] = (v, s.dtype)
        interface = []
        builtin_vars = {}
        for name, bi in BUILTINS.items():
            tkey = "u32" if name == "lindex" else "uvec3"
            v = m.id()
            m.ins(m.globals, OpVariable, m.type(("ptr", SC_INPUT, tkey)), v, SC_INPUT)
            m.ins(m.annotations, OpDecorate, v, 11, bi)  # BuiltIn
            m.ins(m.debug, OpName, v, string(name))
            builtin_vars[name] = (v, tkey)
            interface.append(v)
        # the function body
        entry = m.id()
        for name, (v, tkey) in builtin_vars.items():
            x = self.val(OpLoad, tkey, v)
            if tkey == "u32":
                self.scopes[0][name] = ("let", x, "u32")
            else:
                for j, comp in enumerate("xyz"):
                    self.scopes[0][f"{name}.{comp}"] = ("let", self.val(OpCompositeExtract, "u32", x, j), "u32")
        self.stmts(k.body)
        self.op(OpReturn)
        fn_type = m.type(("fn",))
        void = m.type("void")
        function = []
        m.ins(function, OpFunction, void, main, 0, fn_type)
        m.ins(function, OpLabel, entry)
        function += self.vars + self.prelude + self.code
        m.ins(function, OpFunctionEnd)
        # header: capability, ext import, memory model, entry point, execution mode
        if halves:
            m.ins(m.header, OpExtension, string("SPV_KHR_16bit_storage"))
        m.ins(m.header, OpExtInstImport, self.glsl, string("GLSL.std.450"))
        m.ins(m.header, OpMemoryModel, 0, 1)  # Logical GLSL450
        m.ins(m.header, OpEntryPoint, 5, main, string("main"), interface)  # GLCompute
        wx, wy, wz = (tuple(k.workgroup_size) + (1, 1, 1))[:3]
        m.ins(m.header, OpExecutionMode, main, 17, wx, wy, wz)  # LocalSize
        m.ins(m.debug, OpName, main, string("main"))
        m.globals += function
        return m.binary()

    # --- statements -----------------------------------------------------------
    def stmts(self, body) -> None:
        for s in body:
            self.stmt_cache = {}
            self.stmt(s)

    def new_var(self, tkey) -> int:
        ptr = self.m.type(("ptr", SC_FUNCTION, tkey))
        v = self.m.id()
        self.m.ins(self.vars, OpVariable, ptr, v, SC_FUNCTION)
        return v

    def stmt(self, s) -> None:
        if isinstance(s, kir.Let):
            value = self.expr(s.value)
            if any(s.name in scope for scope in self.scopes):
                # a shadowing Let: values cached under the old binding of the name must not be reused
                for layer in self.pure:
                    layer.clear()
            self.scopes[-1][s.name] = ("let", value, s.value.dtype)
        elif isinstance(s, kir.Decl):
            v = self.new_var(s.dtype)
            init = self.expr(s.init) if s.init is not None else self.m.null(s.dtype)
            self.op(OpStore, v, init)
            self.scopes[-1][s.name] = ("var", v, s.dtype)
        elif isinstance(s, kir.Assign):
            kind, ptr, dtype = self.lookup(s.name)
            self.op(OpStore, ptr, self.expr(s.value))
        elif isinstance(s, kir.Store):
            v, dtype = self.buffers[s.buf]
            value = self.expr(s.value)
            ptr = self.val(OpAccessChain, ("ptr", SC_STORAGE, dtype), v, self.c(0, "i32"), self.expr(s.index))
            self.op(OpStore, ptr, value)
        elif isinstance(s, kir.SStore):
            v, dtype = self.shared[s.name]
            value = self.expr(s.value)
            ptr = self.val(OpAccessChain, ("ptr", SC_WORKGROUP, dtype), v, self.expr(s.index))
            self.op(OpStore, ptr, value)
        elif isinstance(s, kir.If):
            self.emit_if(s)
        elif isinstance(s, kir.For):
            self.emit_for(s)
        elif isinstance(s, kir.Barrier):
            sc = self.c(SCOPE_WORKGROUP, "u32")
            self.op(OpControlBarrier, sc, sc, self.c(SEM_ACQREL_WGMEM, "u32"))
        else:
            raise TypeError(f"unknown statement {s!r}")

    def block(self, label: int, stmts: list, to: int) -> None:
        """A labelled block: the statements in a scope of their own, then a branch to `to`."""
        self.op(OpLabel, label)
        self.push()
        self.stmts(stmts)
        self.pop()
        self.op(OpBranch, to)

    def emit_if(self, s: kir.If) -> None:
        cond = self.expr(s.cond)
        then_l, merge_l = self.m.id(), self.m.id()
        else_l = self.m.id() if s.orelse else merge_l
        self.op(OpSelectionMerge, merge_l, 0)
        self.op(OpBranchConditional, cond, then_l, else_l)
        self.block(then_l, s.then, merge_l)
        if s.orelse:
            self.block(else_l, s.orelse, merge_l)
        self.op(OpLabel, merge_l)

    def emit_for(self, s: kir.For) -> None:
        counter = self.new_var("i32")
        self.op(OpStore, counter, self.expr(s.start))
        header, body_l, cont_l, merge_l = (self.m.id() for _ in range(4))
        self.op(OpBranch, header)
        self.op(OpLabel, header)
        self.push()
        self.scopes[-1][s.var] = ("var", counter, "i32")
        self.stmt_cache = {}
        i = self.val(OpLoad, "i32", counter)
        stop = self.expr(s.stop)
        cond = self.val(177, "bool", i, stop)  # OpSLessThan
        self.op(OpLoopMerge, merge_l, cont_l, 0)
        self.op(OpBranchConditional, cond, body_l, merge_l)
        self.block(body_l, s.body, cont_l)
        self.op(OpLabel, cont_l)
        i = self.val(OpLoad, "i32", counter)
        self.op(OpStore, counter, self.val(128, "i32", i, self.c(s.step, "i32")))  # OpIAdd
        self.op(OpBranch, header)
        self.pop()
        self.op(OpLabel, merge_l)
        self.stmt_cache = {}

    # --- expressions ----------------------------------------------------------
    def expr(self, e: Expr) -> int:
        if e.op == "const":
            return self.c(e.attr, e.dtype)

        pure = self.is_pure(e)
        if pure:
            for layer in reversed(self.pure):
                got = layer.get(e)
                if got is not None:
                    return got
        else:
            got = self.stmt_cache.get(e)
            if got is not None:
                return got
        i = self._expr(e)
        (self.pure[-1] if pure else self.stmt_cache)[e] = i
        return i

    def _expr(self, e: Expr) -> int:
        op, a, t = e.op, e.args, e.dtype
        if op == "var":
            kind, ref, dtype = self.lookup(e.attr)
            if kind == "let":
                return ref
            return self.val(OpLoad, dtype, ref)
        if op == "load":
            v, dtype = self.buffers[e.attr]
            ptr = self.val(OpAccessChain, ("ptr", SC_STORAGE, dtype), v, self.c(0, "i32"), self.expr(a[0]))
            return self.val(OpLoad, dtype, ptr)
        if op == "sload":
            v, dtype = self.shared[e.attr]
            ptr = self.val(OpAccessChain, ("ptr", SC_WORKGROUP, dtype), v, self.expr(a[0]))
            return self.val(OpLoad, dtype, ptr)
        if op in ("min", "max"):
            return self.ext(t, MINMAX[op][KIND[t]], self.expr(a[0]), self.expr(a[1]))
        if op in ("pow", "atan2"):
            return self.ext(t, op, self.expr(a[0]), self.expr(a[1]))
        if op in BIN:
            return self.val(BIN[op][KIND[a[0].dtype]], t, self.expr(a[0]), self.expr(a[1]))
        if op == "neg":
            return self.val(OpFNegate if KIND[t] == "f" else OpSNegate, t, self.expr(a[0]))
        if op == "not":
            return self.val(OpLogicalNot, "bool", self.expr(a[0]))
        if op == "bnot":
            return self.val(OpNot, t, self.expr(a[0]))
        if op == "abs":
            k = KIND[t]
            return self.expr(a[0]) if k == "u" else self.ext(t, "fabs" if k == "f" else "sabs", self.expr(a[0]))
        if op == "sign":
            return self.ext(t, "fsign" if KIND[t] == "f" else "ssign", self.expr(a[0]))
        if op in UNARY_GLSL:
            return self.ext(t, UNARY_GLSL[op], self.expr(a[0]))
        if op == "splat":
            x = self.expr(a[0])
            return self.val(OpCompositeConstruct, "vec4f", x, x, x, x)
        if op == "lane":
            return self.val(OpCompositeExtract, t, self.expr(a[0]), "xyzw".index(e.attr))
        if op == "vec4":
            return self.val(OpCompositeConstruct, "vec4f", *[self.expr(x) for x in a])
        if op == "sgbcast":   # OpGroupNonUniformBroadcast, Subgroup scope (3)
            return self.val(337, t, self.c(3, "u32"), self.expr(a[0]), self.c(e.attr, "u32"))
        if op == "select":
            cond = self.expr(a[0])
            if t == "vec4f":
                cond = self.val(OpCompositeConstruct, "bvec4", cond, cond, cond, cond)
            return self.val(OpSelect, t, cond, self.expr(a[1]), self.expr(a[2]))
        if op == "cast" and (a[0].dtype, t) in CONVERT:
            return self.val(CONVERT[a[0].dtype, t], t, self.expr(a[0]))
        if op == "bitcast":
            return self.val(OpBitcast, t, self.expr(a[0]))
        if op == "fma":
            return self.ext(t, "fma", *[self.expr(x) for x in a])
        if op == "clamp":
            return self.ext(t, CLAMP[KIND[t]], *[self.expr(x) for x in a])
        raise NotImplementedError(f"kernel {self.k.name}: SPIR-V has no {op} ({t}); "
                                  "legalize the kernel first (wgsl_codegen/legalize.py)")


def emit(kernel: kir.Kernel) -> bytes:
    """The SPIR-V 1.3 binary of `kernel` (entry point `main`, GLCompute)."""
    return _Emitter(kernel).build()


def validate_spirv(name: str, code: bytes, target_env: str = "vulkan1.1") -> bool:
    """Run `spirv-val` (Debian's spirv-tools) on a module; a failure is a CompilerBug naming the
    dispatch. Returns False (and checks nothing) when spirv-val is not installed."""
    import shutil
    import subprocess
    import tempfile

    exe = shutil.which("spirv-val")
    if exe is None:
        return False
    with tempfile.NamedTemporaryFile(suffix=".spv") as f:
        f.write(code)
        f.flush()
        r = subprocess.run([exe, "--target-env", target_env, f.name], capture_output=True, text=True)
    if r.returncode != 0:
        from ..errors import CompilerBug
        raise CompilerBug(f"spirv-val rejected the SPIR-V of dispatch {name}: {(r.stderr or r.stdout)[:2000]}",
                          hint="this is a webiree bug; please report it with the model")
    return True
