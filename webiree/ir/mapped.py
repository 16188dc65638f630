"""Constants mapped from model files (compiler/onnx_file.py): hand their pages back once read.

A `numpy.memmap` of an .onnx file costs no memory until it is read; then each page read stays
in the process's resident set until it is unmapped or advised away. The build reads every
weight twice (packing.choose, then packing.encode_into writing weights.bin), a chunk at a time,
and releases each chunk's pages after it: the pages go back to the page cache, from where a
later read takes them again. Anything that is not (a view of) a memory map is left alone.
"""

from __future__ import annotations

import mmap

import numpy as np

PAGE = mmap.PAGESIZE


def _map_of(a):
    """The mmap object under `a` (numpy.memmap keeps it as `_mmap`), or None."""
    while a is not None:
        m = getattr(a, "_mmap", None)
        if m is not None:
            return m
        a = getattr(a, "base", None)
    return None


def release(a) -> None:
    """Advise the kernel that the pages holding `a` (a mapped array or a view of one) are not
    needed: they leave the resident set, and are read again from the file if touched."""
    if not isinstance(a, np.ndarray) or a.size == 0:
        return
    m = _map_of(a)
    if m is None or m.closed:
        return
    try:
        view = np.frombuffer(m, np.uint8, count=1)      # the map's address (its buffer, exported
        base = view.ctypes.data                         # only while `view` lives)
        del view
        first = a.ctypes.data - base
        last = first + a.nbytes
        start = max(first // PAGE * PAGE, 0)
        end = min(-(-last // PAGE) * PAGE, len(m))
        if end > start:
            m.madvise(mmap.MADV_DONTNEED, start, end - start)
    except (AttributeError, OSError, ValueError, TypeError, BufferError):   # no madvise, a read-only map
        pass
