"""onnx's light model zoo (onnx/backend/test/data/light, installed with the onnx package): nine
ImageNet CNNs whose every weight is a ConstantOfShape fill. Each is built as shipped (with the
CPU kernels alone, `limits="cpu"`, to keep the suite's time: the kernel variants are tested
elsewhere), run natively and compared with onnxruntime CPU on one seeded input, both the
probabilities and (added as an output) the logits the final Softmax reads (DenseNet-121 has no
Softmax: its one output).

AlexNet, VGG-19 and ZFNet-512 were refused before their fills were computed where they are read
(compiler/lowering.py is_large_fill): VGG-19's fc6 weight alone is 411 MB. Now no fill is
folded into weights.bin.

Tolerance: max |webiree - onnxruntime| / max |onnxruntime| <= 1e-4 per output (the logits reach
1e31 in VGG-19: the fills make every channel alike, so the values grow layer by layer).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import webiree

from .conftest import assert_close

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
          "vgg19", "zfnet512"]
WEIGHTS_MAX = 1 << 20     # every weight is a fill: weights.bin holds only small folded constants


def test_the_light_zoo_is_all_here():
    assert sorted(p.stem[len("light_"):] for p in LIGHT.glob("light_*.onnx")) == MODELS


def _with_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with the final Softmax's input as a second output (DenseNet-121 has none: as it is)."""
    softmax = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert len(softmax) <= 1, [n.name for n in softmax]
    if not softmax:
        return model
    probs = model.graph.output[0].type.tensor_type.shape
    model.graph.output.append(helper.make_tensor_value_info(
        softmax[0].input[0], onnx.TensorProto.FLOAT, [d.dim_value for d in probs.dim][:2]))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_light_model(name, tmp_path):
    import onnxruntime as ort

    model = _with_logits(onnx.load(LIGHT / f"light_{name}.onnx"))
    inits = {i.name for i in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    x = np.random.default_rng(0).standard_normal([d.dim_value for d in inp.type.tensor_type.shape.dim],
                                                 dtype=np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {inp.name: x})
    res = webiree.compile(model, tmp_path / name, limits="cpu")    # one kernel set: the graphs are tested here
    assert res.manifest["sizes"]["weights_bytes"] <= WEIGHTS_MAX, res.manifest["sizes"]
    sess = webiree.InferenceSession(tmp_path / name)
    got = sess.run(None, {inp.name: x})
    assert len(got) == len(ref) == (1 if name == "densenet121" else 2)
    for o, g, r in zip(sess.get_outputs(), got, ref, strict=True):
        assert g.shape == r.shape, (o.name, g.shape, r.shape)
        assert np.isfinite(r).all()
        assert_close(g, r, 1e-4, f"{name}:{o.name}")


def test_a_large_fill_is_computed_where_it_is_read(tmp_path):
    """A ConstantOfShape of 4 Mi elements (a MatMul's weight) and an Expand of a scalar to 1 Mi:
    neither is folded into weights.bin, and the values read are right."""
    T = onnx.TensorProto
    g = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], value=helper.make_tensor("v", T.FLOAT, [1], [0.25])),
         helper.make_node("Expand", ["three", "s2"], ["e"]),
         helper.make_node("MatMul", ["x", "c"], ["y"]),
         helper.make_node("Add", ["y", "e"], ["z"])],
        "fills", [helper.make_tensor_value_info("x", T.FLOAT, [1, 2048])],
        [helper.make_tensor_value_info("z", T.FLOAT, [512, 2048])],
        [onnx.numpy_helper.from_array(np.array([2048, 2048], np.int64), "s"),
         onnx.numpy_helper.from_array(np.array([512, 2048], np.int64), "s2"),
         onnx.numpy_helper.from_array(np.array([[3.0]], np.float32), "three")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    res = webiree.compile(model, tmp_path / "fills", limits="cpu")
    assert res.manifest["sizes"]["weights_bytes"] < 1024, res.manifest["sizes"]
    x = np.random.default_rng(1).standard_normal((1, 2048), dtype=np.float32)
    (z,) = webiree.InferenceSession(tmp_path / "fills").run(None, {"x": x})
    assert z.shape == (512, 2048)
    np.testing.assert_allclose(z, np.full((512, 2048), x.astype(np.float64).sum() * 0.25 + 3.0), rtol=1e-5, atol=1e-4)
