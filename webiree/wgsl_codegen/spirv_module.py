"""The SPIR-V binary: opcode numbers, id allocation, a module's sections, and
types and constants made once each (`Module`). `spirv.py` walks the kernel IR
and writes its instructions through this; nothing here knows the kernel IR.
"""

from __future__ import annotations

import struct

MAGIC = 0x07230203
VERSION_1_3 = 0x00010300

# opcodes (SPIR-V 1.3 unified spec)
OpName, OpExtension, OpExtInstImport, OpExtInst, OpMemoryModel, OpEntryPoint = 5, 10, 11, 12, 14, 15
OpExecutionMode, OpCapability = 16, 17
OpTypeVoid, OpTypeBool, OpTypeInt, OpTypeFloat, OpTypeVector = 19, 20, 21, 22, 23
OpTypeArray, OpTypeRuntimeArray, OpTypeStruct, OpTypePointer, OpTypeFunction = 28, 29, 30, 32, 33
OpConstantTrue, OpConstantFalse, OpConstant, OpConstantNull = 41, 42, 43, 46
OpFunction, OpFunctionEnd, OpVariable, OpLoad, OpStore, OpAccessChain = 54, 56, 59, 61, 62, 65
OpDecorate, OpMemberDecorate, OpCompositeConstruct, OpCompositeExtract = 71, 72, 80, 81
OpConvertFToU, OpConvertFToS, OpConvertSToF, OpConvertUToF, OpFConvert, OpBitcast = 109, 110, 111, 112, 115, 124
OpSNegate, OpFNegate = 126, 127
OpLogicalEqual, OpLogicalNotEqual, OpLogicalOr, OpLogicalAnd, OpLogicalNot, OpSelect = 164, 165, 166, 167, 168, 169
OpIEqual, OpINotEqual = 170, 171
OpNot = 200
OpControlBarrier, OpLoopMerge, OpSelectionMerge, OpLabel = 224, 246, 247, 248
OpBranch, OpBranchConditional, OpReturn = 249, 250, 253

# GLSL.std.450 extended instructions
GLSL = {
    "roundeven": 2, "trunc": 3, "fabs": 4, "sabs": 5, "fsign": 6, "ssign": 7, "floor": 8, "ceil": 9,
    "sin": 13, "cos": 14, "tan": 15, "asin": 16, "acos": 17, "atan": 18, "sinh": 19, "cosh": 20,
    "asinh": 22, "acosh": 23, "atanh": 24, "atan2": 25, "pow": 26, "exp": 27, "log": 28, "exp2": 29,
    "log2": 30, "sqrt": 31, "rsqrt": 32, "fmin": 37, "umin": 38, "smin": 39, "fmax": 40, "umax": 41,
    "smax": 42, "fclamp": 43, "uclamp": 44, "sclamp": 45, "fma": 50,
}

SC_INPUT, SC_WORKGROUP, SC_FUNCTION, SC_STORAGE = 1, 4, 7, 12
SCOPE_WORKGROUP = 2
SEM_ACQREL_WGMEM = 0x8 | 0x100


def string(s: str) -> list[int]:
    """A literal string operand: UTF-8, NUL-terminated, padded to whole words."""
    b = s.encode("utf-8") + b"\0"
    b += b"\0" * ((-len(b)) % 4)
    return list(struct.unpack(f"<{len(b) // 4}I", b))


def f32_bits(v: float) -> int:
    """The bits of `v` rounded to f32."""
    return struct.unpack("<I", struct.pack("<f", v))[0]


class Module:
    """Id allocation and the module's sections; types and constants deduplicated."""

    def __init__(self):
        self.bound = 1
        self.header: list[int] = []       # capabilities .. execution modes
        self.debug: list[int] = []
        self.annotations: list[int] = []
        self.globals: list[int] = []      # types, constants, global variables
        self._types: dict = {}
        self._consts: dict = {}

    def id(self) -> int:
        i = self.bound
        self.bound += 1
        return i

    @staticmethod
    def ins(out: list, op: int, *operands) -> None:
        words = []
        for o in operands:
            if isinstance(o, (list, tuple)):
                words.extend(o)
            else:
                words.append(o)
        out.append(((len(words) + 1) << 16) | op)
        out.extend(words)

    def type(self, key) -> int:
        """key: 'void' | 'bool' | 'f32' | 'i32' | 'u32' | 'vec4f' | 'vec4u' | 'f16' | 'vec4h' | 'bvec4' | 'uvec3' |
        ('ptr', sc, key) | ('array', key, n) | ('rtarray', key) | ('block', key) | ('fn',)"""
        got = self._types.get(key)
        if got is not None:
            return got
        if key == "void":
            i = self.id(); self.ins(self.globals, OpTypeVoid, i)
        elif key == "bool":
            i = self.id(); self.ins(self.globals, OpTypeBool, i)
        elif key == "f32":
            i = self.id(); self.ins(self.globals, OpTypeFloat, i, 32)
        elif key == "i32":
            i = self.id(); self.ins(self.globals, OpTypeInt, i, 32, 1)
        elif key == "u32":
            i = self.id(); self.ins(self.globals, OpTypeInt, i, 32, 0)
        elif key == "vec4f":
            c = self.type("f32"); i = self.id(); self.ins(self.globals, OpTypeVector, i, c, 4)
        elif key == "f16":      # storage only (StorageBuffer16BitAccess)
            i = self.id(); self.ins(self.globals, OpTypeFloat, i, 16)
        elif key == "vec4u":
            c = self.type("u32"); i = self.id(); self.ins(self.globals, OpTypeVector, i, c, 4)
        elif key == "vec4h":
            c = self.type("f16"); i = self.id(); self.ins(self.globals, OpTypeVector, i, c, 4)
        elif key == "bvec4":
            c = self.type("bool"); i = self.id(); self.ins(self.globals, OpTypeVector, i, c, 4)
        elif key == "uvec3":
            c = self.type("u32"); i = self.id(); self.ins(self.globals, OpTypeVector, i, c, 3)
        elif key[0] == "ptr":
            t = self.type(key[2]); i = self.id(); self.ins(self.globals, OpTypePointer, i, key[1], t)
        elif key[0] == "array":
            t = self.type(key[1]); n = self.const(key[2], "u32"); i = self.id()
            self.ins(self.globals, OpTypeArray, i, t, n)
        elif key[0] == "rtarray":
            t = self.type(key[1]); i = self.id()
            self.ins(self.globals, OpTypeRuntimeArray, i, t)
            stride = {"vec4f": 16, "vec4u": 16, "vec4h": 8, "f16": 2}.get(key[1], 4)
            self.ins(self.annotations, OpDecorate, i, 6, stride)   # ArrayStride
        elif key[0] == "block":
            a = self.type(("rtarray", key[1])); i = self.id()
            self.ins(self.globals, OpTypeStruct, i, a)
            self.ins(self.annotations, OpDecorate, i, 2)                 # Block
            self.ins(self.annotations, OpMemberDecorate, i, 0, 35, 0)   # Offset 0
        elif key[0] == "fn":
            v = self.type("void"); i = self.id(); self.ins(self.globals, OpTypeFunction, i, v)
        else:
            raise ValueError(f"unknown type {key!r}")
        self._types[key] = i
        return i

    def const(self, value, dtype: str) -> int:
        if dtype == "f32":
            key = ("f32", f32_bits(value))
        elif dtype == "bool":
            key = ("bool", bool(value))
        else:
            key = (dtype, int(value) & 0xFFFFFFFF)
        got = self._consts.get(key)
        if got is not None:
            return got
        t = self.type(dtype)
        i = self.id()
        if dtype == "bool":
            self.ins(self.globals, OpConstantTrue if value else OpConstantFalse, t, i)
        else:
            self.ins(self.globals, OpConstant, t, i, key[1])
        self._consts[key] = i
        return i

    def null(self, tkey) -> int:
        key = ("null", tkey)
        got = self._consts.get(key)
        if got is None:
            t = self.type(tkey)
            got = self.id()
            self.ins(self.globals, OpConstantNull, t, got)
            self._consts[key] = got
        return got

    def binary(self) -> bytes:
        words = [MAGIC, VERSION_1_3, 0, self.bound, 0] + self.header + self.debug + self.annotations + self.globals
        return struct.pack(f"<{len(words)}I", *words)
