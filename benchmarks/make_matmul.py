"""Write an ONNX model of one fp32 MatMul (N x N @ constant N x N) for `webiree bench`.

    python benchmarks/make_matmul.py 4096 out.onnx
"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
from webiree.testing.models import make_model  # noqa: E402

n = int(sys.argv[1])
rng = np.random.default_rng(0)
m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
               {"w": (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)}, name=f"matmul{n}")
onnx.save(m, sys.argv[2])
