"""Write an ONNX model of the seed CNNs' depthwise convolutions, for `webiree tune` / `webiree bench`.

    python benchmarks/make_depthwise.py out.onnx

One branch per distinct depthwise 3x3 convolution of MobileNetV2 (224 x 224) and DeepLabV3
(513 x 513): its own input, the convolution with a bias, ReLU6 (Clip) as both models have it,
its own output. Tuning this model times each shape's candidates (depthwise-shared, row-block,
direct) without the rest of the two networks.
"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
from webiree.testing.models import make_model  # noqa: E402

# channels, input size, stride, dilation (pads = dilation, as both models pad them)
SHAPES = [(32, 112, 1, 1), (96, 112, 2, 1), (144, 56, 1, 1), (144, 56, 2, 1), (192, 28, 1, 1),
          (192, 28, 2, 1), (384, 14, 1, 1), (576, 14, 1, 1), (576, 14, 2, 1), (960, 7, 1, 1),
          (32, 257, 1, 1), (96, 257, 2, 1), (144, 129, 1, 1), (144, 129, 2, 1), (192, 65, 1, 1),
          (384, 65, 1, 2), (576, 65, 1, 2), (960, 65, 1, 4)]


def main(out: str) -> None:
    rng = np.random.default_rng(0)
    nodes, inputs, outputs, inits = [], [], [], {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    for i, (c, size, s, d) in enumerate(SHAPES):
        inits[f"w{i}"] = (rng.standard_normal([c, 1, 3, 3]) / 3).astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal([c]).astype(np.float32)
        nodes += [helper.make_node("Conv", [f"x{i}", f"w{i}", f"b{i}"], [f"c{i}"], group=c, strides=[s, s],
                                   dilations=[d, d], pads=[d] * 4),
                  helper.make_node("Clip", [f"c{i}", "lo", "hi"], [f"y{i}"])]
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, c, size, size]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    onnx.save(make_model(nodes, inputs, outputs, inits, name="depthwise"), out)


if __name__ == "__main__":
    main(sys.argv[1])
