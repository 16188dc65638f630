# The digit model from Python, in this browser (Pyodide + webiree_runtime; no numpy needed).
# Edit and press Run: the session stays alive between runs.
import array
import webiree_runtime as wr

# Wrapping a webiree model in a few lines of Python: load once, call like a function.
class DigitReader:
    def __init__(self, session):
        self.session = session

    @classmethod
    async def load(cls, url="./"):
        return cls(await wr.InferenceSession.create(url))

    async def __call__(self, pixels):
        """pixels: 64 numbers, 8x8 row by row, on scikit-learn's 0..16 scale."""
        feeds = {"pixels": (array.array("f", pixels), [1, 1, 8, 8])}
        (probs,) = await self.session.run(None, feeds)
        p = probs.tolist()
        return max(range(10), key=p.__getitem__), p

if "read_digit" not in globals():
    read_digit = await DigitReader.load("./")
    print("inputs: ", read_digit.session.get_inputs())
    print("outputs:", read_digit.session.get_outputs())

# two images from scikit-learn's held-out test set
SAMPLES = {SAMPLES}
for label, pixels in SAMPLES.items():
    digit, p = await read_digit(pixels)
    print(f"a {label} from the test set -> predicted {digit} ({100 * p[digit]:.1f}%)")
    for row in range(8):
        print("   " + "".join(" .:-=+*#%@"[min(9, int(v) * 10 // 17)] for v in pixels[row * 8:row * 8 + 8]))

import time
t0 = time.perf_counter()
for _ in range(10):
    await read_digit(SAMPLES[next(iter(SAMPLES))])
latency_ms = (time.perf_counter() - t0) * 1e3 / 10
print(f"latency: {latency_ms:.2f} ms per call (mean of 10)")
