"""Narrow storage of constants: how a weight keeps the size it was shipped in.

Kernels compute in 32-bit types (f32, i32, u32), but a constant need not be *stored* in
them. A constant whose every value fits a narrower form is stored in that form in
weights.bin, packed into u32 words little-end first (element i of a form with b bits is bits
b*(i % (32/b)) .. of word i / (32/b)), and the kernel that reads it decodes each element
where it loads it (`load`). The host never widens anything: weights.bin is uploaded as it is.

The forms (`PACKS`): 'f16' (IEEE half), 'bf16', 'i16'/'u16', 'i8'/'u8', 'i4'/'u4'. The choice
(`choose`) is lossless by construction: a value is packed only when decoding gives back the
same 32-bit value, so a float16 model's weights (widened to f32 exactly on import) go back to
2 bytes, an int8 model's to 1, 4-bit blocks (uint8 bytes holding two nibbles) to 1 byte per
byte, and a float32 weight stays 4 bytes unless its values happen to be halves.

Both sides live here, the numpy encoder the compiler uses (`choose`, `encode`, `stored_bytes`)
and the kernel-IR decoder every kernel's loads go through (`load`), so they cannot drift apart.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .mapped import release

from . import kir

MIN_ELEMENTS = 16          # smaller constants stay 32-bit (nothing to gain, one decode less)


class Pack(NamedTuple):
    bits: int
    kind: str               # 'f' (IEEE half), 's' (signed integer), 'u' (unsigned integer)
    lo: int = 0             # integer range
    hi: int = 0


PACKS = {
    "i4": Pack(4, "s", -8, 7), "u4": Pack(4, "u", 0, 15),
    "i8": Pack(8, "s", -128, 127), "u8": Pack(8, "u", 0, 255),
    "f16": Pack(16, "f"), "bf16": Pack(16, "b"),
    "i16": Pack(16, "s", -32768, 32767), "u16": Pack(16, "u", 0, 65535),
}
_INT_ORDER = ("u4", "i4", "u8", "i8", "u16", "i16")       # narrowest first


CHUNK = 1 << 22     # elements choose and encode_into convert at a time (their temporaries stay small)


def _chunks(a: np.ndarray):
    """`a` flat, CHUNK elements at a time; a chunk of a mapped constant gives its pages back once
    the caller is done with it (webiree/ir/mapped.py)."""
    flat = a.reshape(-1)
    for i in range(0, flat.size, CHUNK):
        c = flat[i:i + CHUNK]
        yield c
        release(c)


def choose(data: np.ndarray) -> str | None:
    """The narrowest form that holds every value of `data` exactly (None: keep 32 bits).
    `data` may be an ONNX-typed array (float16, int8, ...) or its 32-bit internal form."""
    a = np.asarray(data)
    if a.size < MIN_ELEMENTS or a.dtype == np.bool_:
        return None
    if a.dtype == np.float16:
        return "f16"
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
        f16 = bf16 = True
        for c in _chunks(a):
            f = c.astype(np.float32, copy=False)
            if f16:
                with np.errstate(over="ignore", invalid="ignore"):
                    back = f.astype(np.float16).astype(np.float32)
                f16 = np.array_equal(back.view(np.uint32), f.view(np.uint32))   # (bit for bit: -0.0, NaN payloads)
            if bf16:
                bf16 = not (f.view(np.uint32) & 0xFFFF).any()
            if not (f16 or bf16):
                return None
        return "f16" if f16 else "bf16"
    if a.dtype.kind in "iu":
        lo, hi = int(a.min()), int(a.max())
        for name in _INT_ORDER:
            p = PACKS[name]
            if p.lo <= lo and hi <= p.hi:
                return name
    return None


def is_exact(data, kind: str) -> bool:
    """Whether every value of `data` is a value of the float type `kind` ('f16' / 'bf16'); NaN is."""
    a = np.asarray(data)
    if kind == "f16" and a.dtype == np.float16:
        return True
    for c in _chunks(a):
        f = c.astype(np.float32, copy=False)
        if kind == "bf16":
            if (f.view(np.uint32)[~np.isnan(f)] & 0xFFFF).any():
                return False
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            back = f.astype(np.float16).astype(np.float32)
        if not np.array_equal(back, f, equal_nan=True):
            return False
    return True


def stored_bytes(data: np.ndarray, pack: str | None = None) -> int:
    """Bytes `data` takes in weights.bin in the form `pack` (None: 4 a value)."""
    n = int(np.asarray(data).size)
    if pack is None:
        return 4 * n
    per_word = 32 // PACKS[pack].bits
    return 4 * -(-n // per_word)


def narrow_bytes(data: np.ndarray) -> int:
    """Bytes of `data` in its narrowest lossless form (what folding compares, compiler/lowering.py)."""
    return stored_bytes(data, choose(data))


def encode(data: np.ndarray, pack: str | None) -> bytes:
    """The little-endian bytes of `data` in weights.bin (4-byte multiple)."""
    out = bytearray(stored_bytes(data, pack))
    encode_into(data, pack, memoryview(out))
    return bytes(out)


def encode_into(data: np.ndarray, pack: str | None, out: memoryview) -> None:
    """Write encode(data, pack) into `out` (exactly stored_bytes(data, pack) bytes), a chunk at a
    time: no copy of the whole constant is made (the blob of a 650 MB model is written in place)."""
    a = np.ascontiguousarray(data).reshape(-1)
    if pack is None:
        # 32-bit words: bool as u32, any float (a float16 weight kept unwidened) as f32
        dst = np.frombuffer(out, dtype="<u4" if a.dtype == np.bool_ else "<f4" if a.dtype.kind == "f"
                            else a.dtype.newbyteorder("<"))
        for c, i in zip(_chunks(a), range(0, a.size, CHUNK)):
            dst[i:i + c.size] = c
        return
    p = PACKS[pack]
    per_word = 32 // p.bits
    words = np.frombuffer(out, dtype="<u4")
    for c, i in zip(_chunks(a), range(0, a.size, CHUNK)):    # CHUNK is a multiple of every per_word
        if p.kind == "f":
            raw = c.astype(np.float32).astype("<f2").view("<u2").astype(np.uint32)
        elif p.kind == "b":
            raw = c.astype(np.float32).view(np.uint32) >> np.uint32(16)
        else:
            raw = c.astype(np.int64).astype(np.uint32) & ((1 << p.bits) - 1)
        pad = (-raw.size) % per_word
        lanes = np.concatenate([raw, np.zeros(pad, np.uint32)]).reshape(-1, per_word)
        w = np.zeros(lanes.shape[0], np.uint32)
        for j in range(per_word):
            w |= lanes[:, j] << np.uint32(p.bits * j)
        words[i // per_word:i // per_word + w.size] = w


def _split(index: kir.Expr, per_word: int) -> tuple[kir.Expr, kir.Expr]:
    """(word, lane as u32) of element `index`. An index x * c + q with c a multiple of per_word and
    a constant q (a vec4 load's lanes, a row's start) gives the word x * (c / per_word) + q / per_word
    and a constant lane, so the lanes of one word load the same word (one load after CSE)."""
    x, c, q = None, 0, 0
    if index.op == "mul" and index.args[1].is_const:
        x, c = index.args[0], index.args[1].attr
    elif index.op == "add" and index.args[1].is_const and index.args[0].op == "mul" and index.args[0].args[1].is_const:
        x, c, q = index.args[0].args[0], index.args[0].args[1].attr, index.args[1].attr
    if x is not None and c % per_word == 0 and q >= 0:
        return x * (c // per_word) + q // per_word, kir.const(q % per_word, "u32")
    shift = per_word.bit_length() - 1
    return (kir.binary("shr", index, kir.i32(shift)),
            kir.cast(kir.binary("band", index, kir.i32(per_word - 1)), "u32"))


def load(buf: str, index: kir.Expr, pack: str | None, dtype: str, word_offset: int = 0) -> kir.Expr:
    """Element `index` of a tensor packed in the array<u32> `buf` from word `word_offset` on,
    decoded to `dtype` (pack None: a 32-bit value, bitcast; the constant table holds every type)."""
    if pack is None:
        word = kir.load(buf, kir.as_expr(index, "i32") + word_offset, "u32")
        return kir.binary("ne", word, kir.const(0, "u32")) if dtype == "bool" else kir.bitcast(word, dtype)
    p = PACKS[pack]
    per_word = 32 // p.bits
    index = kir.as_expr(index, "i32")
    word_index, lane = _split(index, per_word)
    word = kir.load(buf, word_index + word_offset, "u32")
    if p.kind == "f":
        v = kir.unpack_f16(kir.binary("shr", word, lane * kir.const(16, "u32")))
        return v if dtype == "f32" else kir.cast(v, dtype)
    if p.kind == "b":       # the upper half of an f32
        half = kir.binary("shr", word, lane * kir.const(16, "u32"))
        return kir.bitcast(kir.binary("shl", half, kir.const(16, "u32")), "f32")
    if p.kind == "s":       # move the lane to the top bits, then shift down arithmetically
        top = kir.binary("shl", word, kir.const(32 - p.bits, "u32") - lane * kir.const(p.bits, "u32"))
        v = kir.binary("shr", kir.bitcast(top, "i32"), kir.i32(32 - p.bits))
        return kir.cast(v, dtype)
    v = kir.binary("band", kir.binary("shr", word, lane * kir.const(p.bits, "u32")),
                   kir.const((1 << p.bits) - 1, "u32"))
    return kir.cast(v, dtype)
