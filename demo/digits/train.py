"""Train the "draw a digit" CNN and export it to ONNX.

    .venv/bin/python demo/digits/train.py --out build/digits.onnx

Data: scikit-learn's bundled 8x8 digits (sklearn.datasets.load_digits: 1,797
images, values 0..16, shipped with scikit-learn, no download), split 80/20
with a fixed seed. Model: two 3x3 convolutions, a 2x2 max-pool and two dense
layers on the 8x8 image (about 40k parameters). Training is deterministic:
CPU, torch.manual_seed, one thread, a fixed shuffle; each epoch also sees
every image shifted by one pixel in a random direction, so a drawing that is
a little off-centre still reads.

The ONNX model (opset 17) takes `pixels` [1, 1, 8, 8] float32 on sklearn's
0..16 scale (it divides by 16 itself) and returns `probs` [1, 10] (softmax).
Prints the test accuracy and the training time; writes NAME.json beside the
.onnx with both (and a few test images, used by tests/test_demos.py).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SEED = 0
EPOCHS = 30


def load(seed: int = SEED):
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.images.astype(np.float32)  # [n, 8, 8], 0..16
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def make_model():
    import torch
    from torch import nn

    class DigitNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                nn.MaxPool2d(2),
            )
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

        def forward(self, pixels):
            return torch.softmax(self.head(self.features(pixels / 16.0)), dim=1)

        def logits(self, pixels):
            return self.head(self.features(pixels / 16.0))

    return DigitNet()


def shift(x, rng):
    """Each image moved by one pixel up/down/left/right or not at all (zeros fill in)."""
    import numpy as np

    out = np.zeros_like(x)
    moves = rng.integers(0, 5, len(x))
    for i, m in enumerate(moves):
        dy, dx = [(0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)][m]
        out[i] = np.roll(x[i], (dy, dx), axis=(0, 1))
        if dy == 1: out[i, 0, :] = 0
        if dy == -1: out[i, -1, :] = 0
        if dx == 1: out[i, :, 0] = 0
        if dx == -1: out[i, :, -1] = 0
    return out


def train(epochs: int = EPOCHS, seed: int = SEED):
    import numpy as np
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(seed)
    xtr, ytr, xte, yte = load(seed)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    t0 = time.perf_counter()
    for _ in range(epochs):
        x = np.concatenate([xtr, shift(xtr, rng)])
        y = np.concatenate([ytr, ytr])
        order = rng.permutation(len(x))
        model.train()
        for i in range(0, len(x), 64):
            b = order[i:i + 64]
            opt.zero_grad()
            loss = loss_fn(model.logits(torch.from_numpy(x[b][:, None])), torch.from_numpy(y[b]))
            loss.backward()
            opt.step()
    seconds = time.perf_counter() - t0
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(xte[:, None])).argmax(1).numpy()
    accuracy = float((pred == yte).mean())
    return model, accuracy, seconds, (xte, yte, pred)


def export(model, path: Path) -> None:
    import onnx
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    x = torch.zeros(1, 1, 8, 8)
    try:
        torch.onnx.export(model, (x,), str(path), input_names=["pixels"], output_names=["probs"],
                          opset_version=17, external_data=False, verbose=False)
        if {o.domain: o.version for o in onnx.load(str(path)).opset_import}.get("") != 17:
            raise RuntimeError("the dynamo exporter did not reach opset 17")
    except Exception:  # noqa: BLE001  (fall back to the TorchScript exporter)
        torch.onnx.export(model, (x,), str(path), input_names=["pixels"], output_names=["probs"],
                          opset_version=17, dynamo=False)
    onnx.checker.check_model(onnx.load(str(path)))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("build/digits.onnx"), help="the .onnx to write")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    args = ap.parse_args(argv)
    model, accuracy, seconds, (xte, yte, pred) = train(args.epochs)
    export(model, args.out)
    # a few correctly classified test images per class, for the browser test
    samples = {}
    for c in range(10):
        idx = [i for i in range(len(yte)) if yte[i] == c and pred[i] == c][:3]
        samples[str(c)] = [xte[i].astype(int).tolist() for i in idx]
    info = {"test_accuracy": accuracy, "test_images": int(len(yte)), "train_seconds": round(seconds, 2),
            "epochs": args.epochs, "seed": SEED, "samples": samples}
    args.out.with_suffix(".json").write_text(json.dumps(info) + "\n")
    print(f"digits CNN: test accuracy {accuracy:.4f} on {len(yte)} held-out images; "
          f"trained {args.epochs} epochs in {seconds:.1f} s; wrote {args.out}")
    return info


if __name__ == "__main__":
    main()
