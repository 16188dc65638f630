"""Open an .onnx file without reading its weights into memory.

`onnx.load` parses the whole file into protobuf messages, weights included, and
every consumer after it (the checker, shape inference, `numpy_helper.to_array`)
made another copy: building a 650 MB GPT-2 peaked at 3.2 GB of host memory.
`open_model` reads the file through a memory map and parses a copy of it in
which every large `raw_data` field is replaced by an external-data reference to
the same file (`location`, `offset`, `length`: ONNX's own external-data form),
so the ModelProto holds no weights. `tensor_array` then maps each such tensor
(and the tensors of a model saved with external data) with `numpy.memmap`: the
constants are the file's pages, read when the compiler reads them, and
`webiree.ir.mapped.release` hands a constant's pages back once they were read.

The protobuf wire format (https://protobuf.dev/programming-guides/encoding/):
a message is a sequence of fields, each a varint key (field number << 3 | wire
type) and a value: a varint (type 0), 8 bytes (1), a varint length and that many
bytes (2), 4 bytes (5). ModelProto.graph is field 7, GraphProto.initializer
field 5, and in TensorProto: dims 1, data_type 2, raw_data 9, external_data 13
(key 1 / value 2 entries), data_location 14 (1: EXTERNAL).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import onnx

from ..errors import ModelError

OFFLOAD_MIN_BYTES = 1 << 16     # a raw_data field this large is mapped, not parsed

# element types whose raw_data is the little-endian values one after another (numpy can map them)
_MAPPABLE = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
             onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.INT8: np.int8,
             onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT16: np.int16,
             onnx.TensorProto.UINT16: np.uint16, onnx.TensorProto.INT32: np.int32,
             onnx.TensorProto.UINT32: np.uint32, onnx.TensorProto.INT64: np.int64,
             onnx.TensorProto.UINT64: np.uint64, onnx.TensorProto.BOOL: np.bool_}


def _varint(buf, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _encode_varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf, start: int, end: int):
    """(field number, wire type, key start, value start, value end) of each field in [start, end)."""
    pos = start
    while pos < end:
        key_start = pos
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            _, value_end = _varint(buf, pos)
        elif wt == 1:
            value_end = pos + 8
        elif wt == 2:
            n, pos = _varint(buf, pos)
            value_end = pos + n
        elif wt == 5:
            value_end = pos + 4
        else:
            raise ValueError(f"wire type {wt} (field {num})")
        if value_end > end:
            raise ValueError("a field runs past its message")
        yield num, wt, key_start, pos, value_end
        pos = value_end


def _len_field(num: int, payload: bytes) -> bytes:
    return _encode_varint(num << 3 | 2) + _encode_varint(len(payload)) + payload


def _tensor(buf, start: int, end: int, location: str) -> bytes | None:
    """The TensorProto in [start, end) with its raw_data replaced by a reference to the file at
    the payload's offset, or None to keep it as it is."""
    raw = data_type = None
    external = False
    for num, wt, _, vs, ve in _fields(buf, start, end):
        if num == 9 and wt == 2:
            raw = (vs, ve)
        elif num == 2 and wt == 0:
            data_type = _varint(buf, vs)[0]
        elif num in (13, 14):
            external = True
    if raw is None or external or data_type not in _MAPPABLE or raw[1] - raw[0] < OFFLOAD_MIN_BYTES:
        return None
    out = bytearray()
    for num, wt, ks, vs, ve in _fields(buf, start, end):
        if not (num == 9 and wt == 2):
            out += buf[ks:ve]
    for key, value in (("location", location), ("offset", str(raw[0])), ("length", str(raw[1] - raw[0]))):
        out += _len_field(13, _len_field(1, key.encode()) + _len_field(2, value.encode()))
    out += _encode_varint(14 << 3 | 0) + _encode_varint(onnx.TensorProto.EXTERNAL)
    return bytes(out)


def _graph(buf, start: int, end: int, location: str) -> bytes | None:
    out, changed = bytearray(), False
    for num, wt, ks, vs, ve in _fields(buf, start, end):
        t = _tensor(buf, vs, ve, location) if num == 5 and wt == 2 else None
        if t is None:
            out += buf[ks:ve]
        else:
            out += _len_field(5, t)
            changed = True
    return bytes(out) if changed else None


def _model_bytes(buf, location: str) -> bytes:
    out = bytearray()
    for num, wt, ks, vs, ve in _fields(buf, 0, len(buf)):
        g = _graph(buf, vs, ve, location) if num == 7 and wt == 2 else None
        out += buf[ks:ve] if g is None else _len_field(7, g)
    return bytes(out)


def open_model(path: Path) -> onnx.ModelProto:
    """The ModelProto of the file at `path`, its large raw_data fields turned into references to
    the file itself (external data, location = the file's name): tensor_array maps them."""
    size = path.stat().st_size
    if size == 0:
        raise ValueError("the file is empty")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return onnx.ModelProto.FromString(_model_bytes(buf, path.name))


def tensor_array(t: onnx.TensorProto, base: Path) -> np.ndarray:
    """The values of an initializer kept in a file (external data; the offloaded raw_data of
    open_model) as a read-only map of that file; ModelError when the reference is bad."""
    info = {e.key: e.value for e in t.external_data}
    dtype = _MAPPABLE.get(t.data_type)
    if dtype is None:
        raise ModelError(f"initializer {t.name!r} keeps {onnx.TensorProto.DataType.Name(t.data_type)} values in "
                         "external data, which webiree maps only for plain numeric types",
                         hint="save the model with this tensor inside the .onnx file")
    shape = tuple(int(d) for d in t.dims)
    n = int(np.prod(shape, dtype=np.int64))
    itemsize = np.dtype(dtype).itemsize
    file = base / info.get("location", "")
    offset = int(info.get("offset", 0) or 0)
    length = int(info.get("length", 0) or 0) or n * itemsize
    if length != n * itemsize or offset < 0 or offset + length > os.path.getsize(file):
        raise ModelError(f"initializer {t.name!r} is corrupt: {length} bytes at offset {offset} of {file.name} for "
                         f"{n} values of {np.dtype(dtype).name}",
                         hint="its byte count must match its shape and type; re-export the model")
    if n == 0:
        return np.zeros(shape, dtype)
    # read-only: a write into a weight raises instead of changing the model's values
    return np.memmap(file, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", offset=offset, shape=shape)
