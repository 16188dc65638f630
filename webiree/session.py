"""InferenceSession: the native Python API, in the style of onnxruntime.

    sess = webiree.InferenceSession("site/")
    [logits] = sess.run(None, {"input": x})

numpy lives only here, at the edge: feeds are checked and converted to the
kernels' 32-bit storage, results converted back to the model's ONNX types.
The schedule itself is run by the pure-Python interpreter on the wgpu driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .dtypes import BY_ONNX, RUNTIME_TYPES, STORAGE_NUMPY
from .errors import FeedError, ModelError
from .hal_webgpu.feeds import check_names, check_shape, declared_shape, type_name
from .hal_webgpu.hal import run_sync
from .hal_webgpu.interpreter import DeviceTensor, Interpreter
from .hal_webgpu.trace import chrome_trace

try:   # numpy has no bfloat16: ml_dtypes' (onnx's own dependency) where installed, else its uint16 bits
    from ml_dtypes import bfloat16 as _BFLOAT16
except ImportError:     # pragma: no cover
    _BFLOAT16 = np.uint16
NUMPY_OF_ONNX = {t: (_BFLOAT16 if d.name == "bfloat16" else np.dtype(d.numpy).type) for t, d in RUNTIME_TYPES.items()}
ONNX_OF_NUMPY = {np.dtype(v): k for k, v in NUMPY_OF_ONNX.items() if k != 16 or v is not np.uint16}


def f32_of_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")


def bf16_bits_of_f32(a: np.ndarray) -> np.ndarray:
    """The upper halves of f32 values already rounded to bfloat16 (exact)."""
    return (np.ascontiguousarray(a, dtype="<f4").view("<u4") >> 16).astype("<u2")


@dataclass
class NodeArg:
    """An input or output: name, shape, and type as onnxruntime spells it ('tensor(float)')."""
    name: str
    shape: list
    type: str


def _ort_type(t: int) -> str:
    return BY_ONNX[t].ort_type if t in BY_ONNX else f"tensor({type_name(t)})"


class InferenceSession:
    def __init__(self, path, submit_chunk: int | None = None, variant: str | None = None,
                 pre_encode: bool | None = None):
        """path: a build folder. submit_chunk: 0 (one submit per inference) or N, a submit every
        N dispatches so the GPU starts while the host encodes the rest; None (the default) chooses
        by the adapter: every 16 dispatches on a discrete GPU, one submit elsewhere (WgpuDriver).
        pre_encode: encode a repeated run's commands while the GPU runs the one before, so that
        the run only submits them; None (the default): on GPUs, not on CPU renderers.
        variant: the kernel variant to run ('gpu', 'cpu') of a build that carries several; None
        picks by the adapter (a CPU renderer such as lavapipe runs 'cpu'), or $WEBIREE_VARIANT.
        `session.variant` says which runs ("" for a build with one set of kernels)."""
        from .hal_webgpu.wgpu_driver import WgpuDriver
        from .module.folder import MODULE_FILE, BuildFolder

        folder = BuildFolder(path)
        module = folder.module()
        driver = WgpuDriver(submit_chunk=submit_chunk, pre_encode=pre_encode)
        self._init(module, folder.weights(), driver, folder.path, str(folder.path / MODULE_FILE), variant)

    @classmethod
    def from_module(cls, module, weights: bytes, submit_chunk: int | None = None,
                    variant: str | None = None, pre_encode: bool | None = None) -> "InferenceSession":
        """A session on a module and weights in memory (a CompileResult's `module` and `weights`),
        without writing a build folder. The module goes through its wire format once, so the
        session runs exactly what a build folder's model.wrm would hold."""
        from .hal_webgpu.wgpu_driver import WgpuDriver
        from .module import read_module, write_module

        sess = cls.__new__(cls)
        driver = WgpuDriver(submit_chunk=submit_chunk, pre_encode=pre_encode)
        sess._init(read_module(write_module(module)), weights, driver, None, "the schedule module", variant)
        return sess

    def _init(self, module, weights: bytes, driver, path, source: str, variant=None) -> None:
        import os

        from .hal_webgpu.requirements import adapter_facts
        from .module.format import ModuleFormatError, pick_variant, select_variant
        self.interp = None
        if variant is None and module.variants:
            variant = os.environ.get("WEBIREE_VARIANT") or None    # a whole test run can force one
        try:
            name = pick_variant(module, adapter_facts(driver.adapter_info(), driver.limits()), variant)
        except ModuleFormatError as e:
            raise ModelError(str(e), hint="leave variant out to pick by the adapter") from None
        module = select_variant(module, name)
        self.variant = name             # the kernel variant running ("": the build has one)
        bad = [io.name for io in module.inputs + module.outputs if io.onnx_type not in NUMPY_OF_ONNX]
        if bad:
            raise ModelError(f"{source} is corrupt: tensors {bad} have unknown element types",
                             hint="rebuild the model")
        self.module = module
        self.driver = driver
        interp = Interpreter(module, driver, weights)
        run_sync(interp.prepare())
        self.interp = interp
        self.path = path
        self.last_profile = None      # per-dispatch GPU ns of the last run(profile=True)
        self.last_trace = None        # the same as a Chrome trace (hal_webgpu/trace.py)

    def close(self) -> None:
        """Free the session's GPU buffers now (otherwise when it is garbage-collected)."""
        interp = getattr(self, "interp", None)
        if interp is not None:
            interp.release()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def get_inputs(self) -> list[NodeArg]:
        return [NodeArg(io.name, declared_shape(self.module, io), _ort_type(io.onnx_type)) for io in self.module.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [NodeArg(io.name, declared_shape(self.module, io), _ort_type(io.onnx_type))
                for io in self.module.outputs]

    def generate_stream(self, ids, max_new_tokens: int, strategy: str = "greedy", k: int = 50, seed: int = 0,
                        temperature: float = 1.0, eos_token_id: int | None = None):
        """Iterator over the new token ids of a decoder built with the generation head
        (webiree.compile(..., generation=True); docs/generation.md): the KV cache stays on the
        GPU, each token is picked there (argmax, or top-k sampling with `seed`), and per step only
        its id (4 bytes) is read back. ids: the prompt (a list or 1-D array of token ids, or
        [1, n]). Stops after max_new_tokens, or after yielding eos_token_id."""
        from .hal_webgpu.generate import generate_tokens
        prompt = np.asarray(ids).reshape(-1).tolist() if not isinstance(ids, (list, tuple)) else list(ids)
        agen = generate_tokens(self.interp, prompt, max_new_tokens, strategy, k, seed, temperature, eos_token_id)
        try:
            while True:
                try:
                    token = run_sync(agen.__anext__())
                except StopAsyncIteration:
                    return
                yield token
        finally:
            run_sync(agen.aclose())

    def generate(self, ids, max_new_tokens: int, strategy: str = "greedy", k: int = 50, seed: int = 0,
                 temperature: float = 1.0, eos_token_id: int | None = None, on_token=None) -> list:
        """The new token ids (see generate_stream); on_token(id) is called as each one arrives."""
        out = []
        for token in self.generate_stream(ids, max_new_tokens, strategy, k, seed, temperature, eos_token_id):
            out.append(token)
            if on_token is not None:
                on_token(token)
        return out

    def _encode(self, io, value) -> bytes:
        try:
            a = np.asarray(value)
        except Exception as e:
            raise FeedError(f"input {io.name!r} is not an array ({type(e).__name__}: {str(e)[:120]})",
                            hint="feed a numpy array") from None
        want = NUMPY_OF_ONNX[io.onnx_type]
        if io.onnx_type == 16 and a.dtype == np.uint16:
            a = a.view(want)    # bfloat16 given as its bits
        if a.dtype != want:
            raise FeedError(f"input {io.name!r} must be {np.dtype(want).name}, got {a.dtype.name}",
                            hint=f"convert it, e.g. x.astype(np.{np.dtype(want).name})")
        check_shape(io, a.shape, self.module)    # a dynamic input's dims are checked by bind_dims
        if io.onnx_type == 16:
            return f32_of_bf16_bits(a.view(np.uint16)).tobytes()
        if io.dtype == "f32":      # float16 widens exactly
            return np.ascontiguousarray(a, dtype="<f4").tobytes()
        if io.dtype == "bool":
            return np.ascontiguousarray(a, dtype="<u4").tobytes()
        if a.dtype == np.uint64 and a.size and int(a.max()) >= (1 << 32):
            raise FeedError(f"input {io.name!r} holds {int(a.max())}, outside the uint32 range WebGPU can compute "
                            "with", hint="uint64 inputs are narrowed to uint32; keep values below 2^32")
        if a.dtype == np.int64 and a.size:
            lo, hi = int(a.min()), int(a.max())
            if lo < -(1 << 31) or hi >= (1 << 31):
                bad = lo if lo < -(1 << 31) else hi
                raise FeedError(f"input {io.name!r} holds {bad}, outside the int32 range WebGPU can compute with",
                                hint="int64 inputs are narrowed to int32; keep values within +-2^31")
        return np.ascontiguousarray(a, dtype="<i4" if io.dtype == "i32" else "<u4").tobytes()

    def _decode(self, io, raw: bytes, shape=None) -> np.ndarray:
        store = STORAGE_NUMPY[io.dtype]
        a = np.frombuffer(raw, dtype=store).reshape(io.shape if shape is None else shape)
        if io.onnx_type == 16:    # kernels rounded the values to bfloat16: the upper halves are exact
            return bf16_bits_of_f32(a).view(NUMPY_OF_ONNX[16])
        return a.astype(NUMPY_OF_ONNX.get(io.onnx_type, a.dtype))

    def run(self, output_names, input_feed: dict, profile: bool = False, keep=None) -> list:
        """Outputs named in output_names (None: all) as numpy arrays, in that order. keep: output
        names to leave on the GPU: those come back as DeviceTensors (not read back; `.numpy()`
        reads one, `.release()` frees it) and can be fed to a later run of this session, where
        they are copied on the GPU into the input. A feed may be a DeviceTensor of this session."""
        if not isinstance(input_feed, dict):
            raise FeedError("feeds must be a dict {input name: array or DeviceTensor}")
        by_name = {io.name: io for io in self.module.inputs}
        wanted = check_names(self.module, input_feed, output_names)
        keep = [keep] if isinstance(keep, str) else list(keep or ())
        unknown = [n for n in keep if n not in wanted]
        if unknown:
            names = [io.name for io in self.module.outputs]
            raise FeedError(f"keep names {unknown}, which {'is' if len(unknown) == 1 else 'are'} not among the "
                            f"outputs returned", hint=f"keep names outputs of the model ({names}) that run returns")
        feeds = {n: v if isinstance(v, DeviceTensor) else self._encode(by_name[n], v) for n, v in input_feed.items()}
        shapes = {n: v.shape if isinstance(v, DeviceTensor) else np.shape(v) for n, v in input_feed.items()}
        self.driver.last_spans = None
        raw, times = run_sync(self.interp.run_raw(feeds, profile, keep, wanted, shapes))
        self.last_profile = times
        spans = self.driver.last_spans
        self.last_trace = chrome_trace(self.module.info.get("dispatches", []), spans,
                                       self.module.info.get("model", "")) if spans else None
        shapes = self.interp.last_shapes
        outs = {io.name: raw[io.name] if isinstance(raw[io.name], DeviceTensor) else
                self._decode(io, raw[io.name], shapes.get(io.name))
                for io in self.module.outputs if io.name in raw}
        return [outs[n] for n in wanted]
