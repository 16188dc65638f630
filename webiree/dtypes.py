"""ONNX element types: the one table the compiler, the runtimes, the bundler and webiree.js
(whose ONNX_TYPES must agree, tests/test_dtypes.py) use. Standard library only (Pyodide).

Names are onnxruntime's ('float32', 'int64', ...). `storage` is the 32-bit type kernels
compute in: every integer type up to 32 bits and int64 (narrowed at the input boundary with
a range check) are i32, uint32 and uint64 are u32, bool is stored as u32; None where
kernels cannot hold the type. float16 and bfloat16 are stored and computed as f32 (the path
for adapters without `shader-f16`); `rounded` names the narrow type ('f16' / 'bf16') every
such value is rounded to where it is produced (round-to-nearest-even), so values agree with
a runtime that holds them in 16 bits, and the boundary converts them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    onnx: int                  # TensorProto.DataType value
    name: str                  # onnxruntime's name
    numpy: str                 # numpy dtype string of the ONNX type
    host_code: str | None      # array.array typecode of its host form (the pure-Python runtime)
    storage: str | None        # f32 / i32 / u32 / bool: what kernels store and compute it as
    bits: int
    rounded: str | None = None  # 'f16' / 'bf16': stored as f32, rounded to this type when produced

    @property
    def ort_type(self) -> str:
        """onnxruntime's NodeArg type string: 'tensor(float)', 'tensor(int64)', ..."""
        return "tensor(" + {"float32": "float", "float64": "double"}.get(self.name, self.name) + ")"

    @property
    def signed(self) -> bool:
        return self.numpy[-2] in "if"


DTYPES = (
    DType(1, "float32", "<f4", "f", "f32", 32),
    DType(2, "uint8", "|u1", "B", "i32", 8),
    DType(3, "int8", "|i1", "b", "i32", 8),
    DType(4, "uint16", "<u2", "H", "i32", 16),
    DType(5, "int16", "<i2", "h", "i32", 16),
    DType(6, "int32", "<i4", "i", "i32", 32),
    DType(7, "int64", "<i8", "q", "i32", 64),
    DType(8, "string", "|O", None, None, 0),
    DType(9, "bool", "|b1", "B", "bool", 8),
    DType(10, "float16", "<f2", "H", "f32", 16, "f16"),
    DType(11, "float64", "<f8", "d", None, 64),
    DType(12, "uint32", "<u4", "I", "u32", 32),
    DType(13, "uint64", "<u8", "Q", "u32", 64),
    DType(16, "bfloat16", "<u2", "H", "f32", 16, "bf16"),
)
BY_ONNX = {d.onnx: d for d in DTYPES}
BY_NAME = {d.name: d for d in DTYPES}
# the ONNX types a module's inputs and outputs may have (what kernels store)
RUNTIME_TYPES = {d.onnx: d for d in DTYPES if d.storage}
# storage type -> numpy dtype string of its 32-bit buffer element
STORAGE_NUMPY = {"f32": "<f4", "i32": "<i4", "u32": "<u4", "bool": "<u4"}
ONNX_OF_STORAGE = {"f32": 1, "i32": 6, "u32": 12, "bool": 9}


def name_of(onnx_type: int) -> str:
    d = BY_ONNX.get(onnx_type)
    return d.name if d else f"onnx type {onnx_type}"


def storage_of(onnx_type: int) -> str | None:
    d = BY_ONNX.get(onnx_type)
    return d.storage if d else None


def rounded_of(onnx_type: int) -> str | None:
    """'f16' / 'bf16' for a type stored as f32 but rounded to 16 bits; None otherwise."""
    d = BY_ONNX.get(onnx_type)
    return d.rounded if d else None
