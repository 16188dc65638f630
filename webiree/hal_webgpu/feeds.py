"""Feeds and results at the runtime boundary, in pure Python (no numpy).

Inputs arrive in their ONNX element type and are converted to the 32-bit
storage the kernels use: int64 is narrowed to i32 with a range check (WGSL
has no 64-bit integers), bool and small integers are widened. Outputs go the
other way. The numpy session does the same with numpy for speed; both raise
the same FeedError messages.
"""

from __future__ import annotations

import array
import struct
import sys

from ..dtypes import BY_ONNX, name_of
from ..errors import FeedError

# ONNX type -> array typecode of its host representation (the types a module's inputs and outputs have)
HOST_CODES = {d.onnx: d.host_code for d in BY_ONNX.values() if d.storage}
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


def type_name(onnx_type: int) -> str:
    return name_of(onnx_type)


def declared_shape(module, io) -> list:
    """An input's or output's shape as the build declares it: ints, a symbol's name where the dim
    is a symbol, None where it is computed from them (as onnxruntime shows symbolic dims)."""
    nsym = len(module.symbols)
    if not io.regs:
        return list(io.shape)
    return [d if r is None else (module.symbols[r][0] if r < nsym else None) for d, r in zip(io.shape, io.regs)]


def check_shape(io, shape, module=None) -> None:
    """A fed shape against a static input (a dynamic module's inputs are checked by bind_dims)."""
    shape = tuple(int(d) for d in shape)
    if io.dynamic:
        if len(shape) != len(io.shape):
            raise FeedError(f"input {io.name!r} has rank {len(shape)}; the model's input has rank {len(io.shape)}",
                            hint=f"feed a shape like {declared_shape(module, io) if module else list(io.shape)}")
        return
    if shape != tuple(io.shape):
        raise FeedError(f"input {io.name!r} has shape {shape}; the model was compiled for {tuple(io.shape)}",
                        hint="feed exactly that shape, or rebuild with --input-shape")


def bind_dims(module, shapes: dict) -> list:
    """The register file of one run: every symbol's value taken from the fed shapes (name ->
    shape), each checked against its declared range and against its other occurrences. A static
    module needs no shapes (those given are checked)."""
    from ..module.format import eval_registers, failed_asserts
    if not module.symbols:
        for io in module.inputs:
            if io.name in shapes:
                check_shape(io, shapes[io.name])
        return eval_registers(module, {i: io.shape for i, io in enumerate(module.inputs)})
    values: dict[int, tuple] = {}
    dims = {}
    for i, io in enumerate(module.inputs):
        if io.name not in shapes:
            raise FeedError(f"input {io.name!r} comes without a shape; this build takes sizes in ranges",
                            hint=f"give its shape, {declared_shape(module, io)}")
        shape = tuple(int(d) for d in shapes[io.name])
        check_shape(io, shape, module)
        for axis, (d, fixed, r) in enumerate(zip(shape, io.shape, io.regs)):
            if r is None:
                if d != fixed:
                    raise FeedError(f"input {io.name!r} has {d} at dim {axis}; the model fixes it at {fixed}",
                                    hint=f"feed a shape like {declared_shape(module, io)}")
                continue
            name, lo, hi = module.symbols[r]
            if not lo <= d <= hi:
                raise FeedError(f"input {io.name!r}: dim {axis} ({name}) is {d}, outside the build's range {lo}..{hi}",
                                hint=f"rebuild with a wider range, e.g. --dim {name}={min(lo, d)}..{max(hi, d)}")
            if r in values and values[r][0] != d:
                other_d, other_io, other_axis = values[r]
                raise FeedError(f"dim {name} is {d} in input {io.name!r} (dim {axis}) but {other_d} in input "
                                f"{other_io!r} (dim {other_axis})", hint=f"every occurrence of {name} must be equal")
            values[r] = (d, io.name, axis)
        dims[i] = shape
    regs = eval_registers(module, dims)
    broken = failed_asserts(module, regs)
    if broken:
        sizes = ", ".join(f"{module.symbols[r][0]}={v[0]}" for r, v in sorted(values.items()))
        raise FeedError(f"the model cannot take these sizes ({sizes}): {broken[0]}",
                        hint="the graph needs these sizes to agree (e.g. an image side that is a multiple of "
                             "the network's stride); feed sizes that do")
    return regs


def _as_array(data, code: str) -> array.array:
    if isinstance(data, array.array):
        if data.typecode == code:
            return data
        return array.array(code, data)
    if isinstance(data, (bytes, bytearray, memoryview)):
        a = array.array(code)
        a.frombytes(bytes(data) if not isinstance(data, bytes) else data)
        return a
    return array.array(code, data)  # a list or other sequence of numbers


def _little(a: array.array) -> array.array:
    if sys.byteorder != "little":
        a = array.array(a.typecode, a)
        a.byteswap()
    return a


def encode_input(io, data, onnx_type: int | None = None, shape=None) -> bytes:
    """The storage bytes of one input, from an array.array, a bytes-like
    object in the ONNX element type, or a flat sequence of numbers (of `shape`, default the
    input's declared shape)."""
    onnx_type = io.onnx_type if onnx_type is None else onnx_type
    if onnx_type != io.onnx_type:
        raise FeedError(f"input {io.name!r} must be {type_name(io.onnx_type)}, got {type_name(onnx_type)}",
                        hint=f"convert the input to {type_name(io.onnx_type)}")
    code = HOST_CODES.get(onnx_type)
    if code is None:
        raise FeedError(f"input {io.name!r} has unsupported type {type_name(onnx_type)}")
    a = _as_array(data, code)
    shape = tuple(io.shape if shape is None else shape)
    n = 1
    for d in shape:
        n *= d
    if len(a) != n:
        raise FeedError(f"input {io.name!r} has {len(a)} elements; shape {shape} needs {n}")
    if onnx_type == 10:     # float16 bits (host form array('H')) widen exactly
        out = array.array("f", struct.unpack(f"<{n}e", _little(a).tobytes()))
    elif onnx_type == 16:   # bfloat16 bits: the upper half of an f32
        out = array.array("I", (v << 16 for v in a))
    elif io.dtype == "f32" or (io.dtype == "i32" and code == "i") or (io.dtype == "u32" and code == "I"):
        out = a
    elif io.dtype == "i32":
        if code == "q" and n and (min(a) < I32_MIN or max(a) > I32_MAX):
            bad = next(v for v in a if v < I32_MIN or v > I32_MAX)
            raise FeedError(f"input {io.name!r} holds {bad}, outside the int32 range WebGPU can compute with",
                            hint="int64 inputs are narrowed to int32; keep values within +-2^31")
        out = array.array("i", a)
    elif io.dtype == "u32":
        if code == "Q" and n and max(a) > 0xFFFFFFFF:
            raise FeedError(f"input {io.name!r} holds {max(a)}, outside the uint32 range WebGPU can compute with",
                            hint="uint64 inputs are narrowed to uint32; keep values below 2^32")
        out = array.array("I", a)
    else:  # bool
        out = array.array("I", (1 if v else 0 for v in a))
    if sys.byteorder != "little":
        out = array.array(out.typecode, out)
        out.byteswap()
    return out.tobytes()


def decode_output(io, raw: bytes):
    """(array.array in the ONNX element type, onnx_type) of one output."""
    t = io.onnx_type
    if t in (10, 16):       # values the kernels rounded to float16 / bfloat16: their bits, exactly
        bits = array.array("I")
        bits.frombytes(raw)
        if sys.byteorder != "little":
            bits.byteswap()
        if t == 16:
            out = array.array("H", (v >> 16 for v in bits))
        else:
            out = array.array("H")
            out.frombytes(struct.pack(f"={len(bits)}e", *array.array("f", bits.tobytes())))
        return out, t
    if io.dtype == "f32":
        a = array.array("f")
        a.frombytes(raw)
        return a, 1
    src = array.array("i" if io.dtype == "i32" else "I")
    src.frombytes(raw)
    if io.dtype == "bool":
        return array.array("B", (1 if v else 0 for v in src)), 9
    code = HOST_CODES.get(t, "i")
    return array.array(code, src), t


def check_names(module, input_feed: dict, output_names) -> list:
    """Check feed and output names against the module (both runtimes call this);
    returns the output names to return, in order."""
    by_name = [io.name for io in module.inputs]
    unknown = sorted(set(input_feed) - set(by_name))
    if unknown:
        raise FeedError(f"unknown input name(s) {unknown}", hint=f"the model's inputs are {by_name}")
    missing = [n for n in by_name if n not in input_feed]
    if missing:
        raise FeedError(f"missing input(s) {missing}", hint=f"the model's inputs are {by_name}")
    names = [io.name for io in module.outputs]
    if output_names is None:
        return names
    output_names = list(output_names)
    bad = [n for n in output_names if n not in names]
    if bad:
        raise FeedError(f"unknown output name(s) {bad}", hint=f"the model's outputs are {names}")
    return output_names
