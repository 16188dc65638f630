"""One dtype table (webiree/dtypes.py): webiree.js, the manifest and the runtimes name types alike."""

from __future__ import annotations

import array
import re
from pathlib import Path

import numpy as np

from webiree import dtypes

ROOT = Path(__file__).resolve().parents[1]
JS_ARRAYS = {"Float32Array": "f", "Float64Array": "d", "Uint8Array": "B", "Int8Array": "b", "Uint16Array": "H",
             "Int16Array": "h", "Int32Array": "i", "Uint32Array": "I", "BigInt64Array": "q", "BigUint64Array": "Q"}


def test_webiree_js_table_matches():
    js = (ROOT / "web" / "webiree.js").read_text()
    table = js[js.index("const ONNX_TYPES = {"):]
    table = table[:table.index("};")]
    entries = {int(n): (name, cls) for n, name, cls in re.findall(r"(\d+): \['(\w+)', (\w+)\]", table)}
    assert set(entries) == {d.onnx for d in dtypes.DTYPES if d.host_code}, sorted(entries)
    for n, (name, cls) in entries.items():
        d = dtypes.BY_ONNX[n]
        assert name == d.name, (n, name, d.name)
        assert JS_ARRAYS[cls] == d.host_code or (d.name == "bool" and cls == "Uint8Array"), (n, cls)


def test_names_are_onnxruntimes_and_codes_fit_numpy():
    from onnx import TensorProto, helper

    for d in dtypes.DTYPES:
        assert helper.tensor_dtype_to_np_dtype(d.onnx) == np.dtype(d.numpy) or d.name == "bfloat16", d
        assert TensorProto.DataType.Name(d.onnx).lower() in (d.name, d.name.replace("32", ""),
                                                           {"float64": "double"}.get(d.name)), d
        if d.host_code:
            assert array.array(d.host_code).itemsize * 8 >= d.bits, d
    assert dtypes.BY_NAME["float32"].ort_type == "tensor(float)"
    assert dtypes.BY_NAME["int64"].ort_type == "tensor(int64)"
    assert [dtypes.storage_of(t) for t in (1, 7, 13, 9, 10, 16, 11)] == ["f32", "i32", "u32", "bool", "f32", "f32", None]
