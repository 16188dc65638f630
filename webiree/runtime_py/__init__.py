"""webiree's Python API for the browser (Pyodide), shipped as `webiree_runtime`.

    import webiree_runtime as wr
    sess = await wr.InferenceSession.create("./")          # a build folder's URL
    print(sess.get_inputs())                                 # [NodeArg(name, shape, type)]
    outs = await sess.run(None, {"x": (array.array("f", values), [1, 64])})
    outs[0].data, outs[0].shape, outs[0].type                # array.array, (1, 10), 'float32'
    outs[0].numpy()                                          # only where numpy is importable
    tok = await wr.Tokenizer.from_url("./")                  # the build's tokenizer.json (or its URL)
    enc = tok.encode("Hello, world!")                         # ids, tokens, offsets, attention_mask, ...

It mirrors the native `webiree.InferenceSession` (onnxruntime style) with
`await` on create and run. Feeds are `{name: value}` where value is
`(data, shape)`, `(data, shape, type)`, a `Tensor`, or bare data (the model's
shape; a build with sizes in ranges needs the shape); data is an array.array, a JS typed array (from `js`), a memoryview,
bytes in the model's element type, a flat list, or a numpy array when numpy
is there. Results are `Tensor`s holding an array.array, at their shape in that run
(a dynamic build's outputs vary with the fed sizes); `get_inputs()` shows a
varying dim by its symbol's name, as onnxruntime does.

A decoder built with the generation head generates token by token, the KV cache on the GPU and
only each new token id read back: `await sess.generate([5, 17, 99], 16)` (greedy) or
`generate(ids, 16, strategy="top-k", k=8, seed=1)`; `async for t in sess.generate_stream(...)`
streams them (docs/generation.md).

Outputs can stay on the GPU: `await sess.run(None, feeds, keep=["present"])`
returns a `DeviceTensor` for `present` (no readback); feed it to the next run of
the same session (copied on the GPU), `await t.read_value()` reads it back as
(array.array, ONNX type), `t.release()` frees it.

`Tokenizer` is webiree.text's (a Hugging Face tokenizer.json: WordPiece, byte-level
BPE), the same pure-Python code as natively, with `await Tokenizer.from_url(url)`.

The schedule is run by the same `Interpreter` as natively, over
`BrowserDriver` (navigator.gpu). Standard library + Pyodide only: no numpy.
"""

from __future__ import annotations

import array
import asyncio
import base64
import json

from ..dtypes import BY_ONNX, DTYPES
from ..errors import DeviceError, FeedError, ModelError, WebireeError
from ..hal_webgpu.feeds import (bind_dims, check_names, check_shape, declared_shape, decode_output, encode_input,
                                type_name)
from ..hal_webgpu.interpreter import DeviceTensor, Interpreter
from ..module.folder import MANIFEST_FILE, MODULE_FILE, TOKENIZER_FILE, WEIGHTS_FILE
from ..hal_webgpu.requirements import adapter_facts
from ..module.format import ModuleFormatError, pick_variant, read_module, select_variant
from ..text import Encoding
from ..text import Tokenizer as _TextTokenizer
from ..version import __version__

__all__ = ["InferenceSession", "Tensor", "DeviceTensor", "NodeArg", "Tokenizer", "Encoding", "WebireeError", "FeedError",
           "DeviceError", "ModelError", "load_sample", "fetch_bytes", "__version__"]

TYPE_OF_NAME = {d.name: d.onnx for d in DTYPES if d.name != "string"}
# array typecode (and item size, for the C long codes) -> ONNX element type
_INT_TYPES = {("b", 1): 3, ("B", 1): 2, ("h", 2): 5, ("H", 2): 4, ("i", 4): 6, ("I", 4): 12, ("l", 4): 6,
              ("L", 4): 12, ("l", 8): 7, ("L", 8): 13, ("q", 8): 7, ("Q", 8): 13, ("f", 4): 1, ("d", 8): 11}
_HOST = {d.onnx: d.host_code for d in DTYPES if d.host_code}
_TYPED_ARRAYS = {"Float32Array": 1, "Float64Array": 11, "Int8Array": 3, "Uint8Array": 2, "Uint8ClampedArray": 2,
                 "Int16Array": 5, "Uint16Array": 4, "Int32Array": 6, "Uint32Array": 12, "BigInt64Array": 7,
                 "BigUint64Array": 13}
_NUMPY = {d.onnx: d.numpy for d in DTYPES}


class NodeArg:
    """An input or output: name, shape, and type as onnxruntime spells it ('tensor(float)')."""

    __slots__ = ("name", "shape", "type")

    def __init__(self, name, shape, type):  # noqa: A002 - onnxruntime's attribute name
        self.name, self.shape, self.type = name, shape, type

    def __repr__(self):
        return f"NodeArg(name={self.name!r}, shape={self.shape}, type={self.type!r})"

    def __eq__(self, other):
        return isinstance(other, NodeArg) and (self.name, self.shape, self.type) == (other.name, other.shape, other.type)


def _onnx_type(t) -> int:
    if isinstance(t, int):
        return t
    if t in TYPE_OF_NAME:
        return TYPE_OF_NAME[t]
    raise FeedError(f"unknown tensor type {t!r}", hint=f"use one of {sorted(TYPE_OF_NAME)}")


class Tensor:
    """A tensor on the host: `data` is an array.array in the ONNX element type
    (bool as 'B' 0/1), `shape` a tuple, `type` a name such as 'float32'."""

    __slots__ = ("name", "type", "onnx_type", "shape", "data")

    def __init__(self, type, data, shape=None, name: str = ""):  # noqa: A002
        self.onnx_type = _onnx_type(type)
        self.type = type_name(self.onnx_type)
        self.data = data
        self.shape = tuple(int(d) for d in shape) if shape is not None else (len(data),)
        self.name = name

    @property
    def dims(self) -> list:
        return list(self.shape)

    @property
    def size(self) -> int:
        return len(self.data)

    def tolist(self) -> list:
        return list(self.data)

    def memoryview(self) -> memoryview:
        return memoryview(self.data)

    def numpy(self):
        """A numpy view of the data, shaped (needs numpy: `await pyodide.loadPackage('numpy')`)."""
        try:
            import numpy as np
        except ImportError:
            raise ImportError("numpy is not available here; use .data (an array.array) or .tolist()") from None
        a = np.frombuffer(self.data, dtype="u1" if self.onnx_type == 9 else _NUMPY[self.onnx_type])
        return (a.astype(bool) if self.onnx_type == 9 else a).reshape(self.shape)

    def to_js(self):
        """The data as a JS typed array (a copy; Pyodide only)."""
        from pyodide.ffi import to_js
        return to_js(memoryview(self.data))

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        head = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in self.data[:6])
        more = ", ..." if len(self.data) > 6 else ""
        label = f"{self.name}: " if self.name else ""
        return f"Tensor({label}{self.type} {list(self.shape)} [{head}{more}])"


def _ort_type(t: int) -> str:
    return BY_ONNX[t].ort_type if t in BY_ONNX else f"tensor({type_name(t)})"


def _host_array(data):
    """(array.array or bytes, ONNX type or None, shape or None) of a feed's data."""
    if isinstance(data, array.array):
        return data, _INT_TYPES.get((data.typecode, data.itemsize)), None
    if isinstance(data, (bytes, bytearray)):
        return bytes(data), None, None
    if isinstance(data, memoryview):
        fmt = data.format.lstrip("<=@")
        if fmt in ("B", "b", "h", "H", "i", "I", "l", "L", "q", "Q", "f", "d"):
            t = _INT_TYPES.get((fmt, data.itemsize))
            a = array.array(_HOST[t] if t else "B")
            a.frombytes(data.tobytes())
            return a, t, tuple(data.shape) if data.ndim > 1 else None
        return data.tobytes(), None, None
    ctor = type(data).__name__
    if ctor.startswith("Js"):   # a JS typed array from Pyodide
        name = str(getattr(getattr(data, "constructor", None), "name", ""))
        t = _TYPED_ARRAYS.get(name)
        if t is None:
            raise FeedError(f"cannot feed a JS {name or 'object'}; pass a typed array (Float32Array, ...)")
        a = array.array(_HOST[t])
        a.frombytes(data.to_bytes())
        return a, t, None
    if hasattr(data, "__array_interface__") and hasattr(data, "dtype"):   # numpy, when it is there
        kind, size = data.dtype.kind, data.dtype.itemsize
        t = 9 if kind == "b" else {("f", 4): 1, ("f", 8): 11, ("i", 1): 3, ("u", 1): 2, ("i", 2): 5, ("u", 2): 4,
                                   ("i", 4): 6, ("u", 4): 12, ("i", 8): 7, ("u", 8): 13}.get((kind, size))
        if t is None:
            raise FeedError(f"cannot feed numpy dtype {data.dtype}")
        a = array.array(_HOST[t])
        a.frombytes(data.astype(data.dtype.newbyteorder("<")).tobytes(order="C"))
        return a, t, tuple(data.shape)
    if isinstance(data, (list, tuple, range)):
        return list(data), None, None
    raise FeedError(f"cannot feed a {ctor}",
                    hint="pass an array.array, a JS typed array, bytes, a list, or (data, shape)")


def _feed(module, io, value):
    """(data, onnx_type, shape) for Interpreter feeds, checked against the module's input `io`;
    shape is None where none was given and the input's dims vary (bind_dims then says so)."""
    shape = want = None
    if type(value).__name__.startswith("Js"):   # from JS: [typedArray, dims] or a webiree.js Tensor
        ctor = str(getattr(getattr(value, "constructor", None), "name", ""))
        if ctor == "Array":
            value = tuple(value)
        elif ctor == "Tensor" and hasattr(value, "dims") and hasattr(value, "data"):
            value = (value.data, list(value.dims), str(value.type))
    if isinstance(value, Tensor):
        data, shape, want = value.data, value.shape, value.onnx_type
    elif isinstance(value, tuple) and len(value) in (2, 3) and not all(isinstance(v, (int, float)) for v in value):
        data, shape = value[0], value[1]
        if len(value) == 3:
            want = _onnx_type(value[2])
    else:
        data = value
    data, natural, natural_shape = _host_array(data)
    if want is None:
        want = natural
    if want == 2 and io.onnx_type == 9:   # Uint8Array / 'B' data feeds a bool input
        want = 9
    if want is None:
        want = io.onnx_type
    if shape is None:
        shape = natural_shape if natural_shape is not None else None if io.dynamic else io.shape
    if shape is None:
        return data, want, None
    shape = tuple(int(d) for d in shape)   # also a JS array of dims
    check_shape(io, shape, module)         # a dynamic input's rank (bind_dims checks its dims)
    return data, want, shape


async def fetch_bytes(url: str) -> bytes:
    """GET url (relative to the page) as bytes; ModelError on an HTTP or network failure."""
    import js
    from pyodide.ffi import JsException
    try:
        response = await js.fetch(url)
    except JsException as e:
        raise ModelError(f"cannot fetch {url}: {getattr(e, 'message', e)}",
                         hint="serve the build folder over http(s), e.g. `webiree serve DIR`") from None
    if not response.ok:
        raise ModelError(f"cannot fetch {url}: HTTP {response.status}", hint="is this a webiree build folder?")
    return (await response.arrayBuffer()).to_bytes()


def _base(url: str) -> str:
    import js
    return str(js.URL.new(url if url.endswith("/") else url + "/", js.location.href).href)


async def load_sample(url: str = "./") -> dict:
    """The build folder's sample input (sample.json) as {name: Tensor}."""
    text = await fetch_bytes(_base(url) + "sample.json")
    feeds = {}
    for e in json.loads(text)["inputs"]:
        t = _onnx_type(e["type"])
        a = array.array(_HOST[t])
        a.frombytes(base64.b64decode(e["data"]))
        feeds[e["name"]] = Tensor(t, a, e["dims"], e["name"])
    return feeds


class Tokenizer(_TextTokenizer):
    """webiree.text.Tokenizer (from_str, encode, decode, ...) plus `await Tokenizer.from_url(url)`."""

    @classmethod
    async def from_url(cls, url: str = "./") -> "Tokenizer":
        """Fetch a tokenizer.json (relative to the page); a URL ending in '/' is a build folder,
        whose tokenizer.json (webiree build --tokenizer) is read."""
        if url.endswith("/"):
            url = _base(url) + TOKENIZER_FILE
        data = await fetch_bytes(url)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelError(f"{url} is not UTF-8 text", hint="give the URL of a tokenizer.json") from None
        return cls.from_str(text)


class InferenceSession:
    """One model on one WebGPU device. Create with `await InferenceSession.create(url)`."""

    def __init__(self, module, interpreter, driver, manifest=None, url=None):
        self.module = module
        self.variant = module.variant    # the kernel variant running ("": the build has one)
        self.interp = interpreter
        self.driver = driver
        self.manifest = manifest or {}
        self.url = url
        self.last_profile = None
        self._lock = asyncio.Lock()
        self._released = False

    @classmethod
    async def create(cls, url: str = "./", *, timeout_ms: int = 30000, power_preference: str = "high-performance",
                     variant: str | None = None):
        """Fetch a build folder (manifest.json, model.wrm, weights.bin) and prepare it on a new device.
        variant: the kernel variant to run ('gpu', 'cpu') of a build that carries several; None picks
        by the adapter (a fallback / CPU adapter such as SwiftShader runs 'cpu'); `sess.variant`."""
        from ..hal_webgpu.browser_driver import BrowserDriver
        base = _base(url)
        manifest_url = base + MANIFEST_FILE
        try:
            manifest = json.loads(await fetch_bytes(manifest_url))
        except ValueError:
            raise ModelError(f"{manifest_url} is not JSON", hint="is this a webiree build folder?") from None
        files = manifest.get("files") or {}
        module_file, weights_file = files.get("module", MODULE_FILE), files.get("weights", WEIGHTS_FILE)
        # both downloads run concurrently with each other (JS fetches start before the first await)
        module_job = asyncio.ensure_future(fetch_bytes(base + module_file))
        weights_job = asyncio.ensure_future(fetch_bytes(base + weights_file))
        module_bytes, weights = await module_job, await weights_job
        module = _read(module_bytes, module_file)
        driver = await BrowserDriver.create(module.limits, timeout_ms=timeout_ms, power_preference=power_preference)
        try:
            return await cls.from_module(module, weights, driver, manifest, base, variant=variant)
        except BaseException:
            await driver.release()
            raise

    @classmethod
    async def from_module(cls, module, weights, driver, manifest=None, url=None, variant=None):
        """A session over any HAL driver (the browser's, or natively wgpu-py's under `run_sync`);
        a build with kernel variants runs `variant`, or the one the driver's adapter picks."""
        try:
            name = pick_variant(module, adapter_facts(driver.adapter_info(), driver.limits()), variant)
        except ModuleFormatError as e:
            raise ModelError(str(e), hint="leave variant out to pick by the adapter") from None
        module = select_variant(module, name)
        interp = Interpreter(module, driver, weights)
        if hasattr(driver, "push_error_scopes"):
            driver.push_error_scopes()
            try:
                await interp.prepare()
            finally:
                await driver.pop_error_scopes("preparing it")
        else:
            await interp.prepare()
        return cls(module, interp, driver, manifest, url)

    def get_inputs(self) -> list:
        return [NodeArg(io.name, declared_shape(self.module, io), _ort_type(io.onnx_type))
                for io in self.module.inputs]

    def get_outputs(self) -> list:
        return [NodeArg(io.name, declared_shape(self.module, io), _ort_type(io.onnx_type))
                for io in self.module.outputs]

    async def run(self, output_names, input_feed, *, profile: bool = False, keep=()) -> list:
        """Run once. Returns a list of Tensor (all outputs, or those named), in order; an output
        named in `keep` stays on the GPU and comes back as a DeviceTensor, which a later run of
        this session takes as a feed."""
        if self._released:
            raise DeviceError("the session was released", hint="create a new session")
        if hasattr(input_feed, "to_py") and not isinstance(input_feed, dict):
            input_feed = input_feed.to_py(depth=1)   # a JS object / Map of feeds
        if not isinstance(input_feed, dict):
            raise FeedError("feeds must be a dict {input name: (data, shape)}")
        by_name = {io.name: io for io in self.module.inputs}
        wanted = check_names(self.module, input_feed, output_names)
        keep = [keep] if isinstance(keep, str) else list(keep or ())
        if any(n not in wanted for n in keep):
            raise FeedError(f"keep names {[n for n in keep if n not in wanted]}, not among the outputs returned",
                            hint=f"keep names outputs of the model that run returns ({wanted})")
        on_gpu = {name: v for name, v in input_feed.items() if isinstance(v, DeviceTensor)}
        fed = {name: _feed(self.module, by_name[name], value) for name, value in input_feed.items()
               if name not in on_gpu}
        shapes = {name: shape for name, (_, _, shape) in fed.items() if shape is not None}
        shapes.update({name: t.shape for name, t in on_gpu.items()})
        if self.module.symbols:
            bind_dims(self.module, shapes)   # every size in its range before any data is converted
        enc = {name: encode_input(by_name[name], data, onnx_type, shape=shapes.get(name))
               for name, (data, onnx_type, _) in fed.items()}
        enc.update(on_gpu)
        async with self._lock:   # one run at a time: they share the input and readback buffers
            raw, times = await self.interp.run_raw(enc, profile, keep=keep, outputs=wanted, shapes=shapes)
            run_shapes = self.interp.last_shapes
        if profile and times is not None:
            ds = self.module.info.get("dispatches") or []
            self.last_profile = [(ds[i]["name"] if i < len(ds) else f"dispatch {i}", t / 1e6)
                                 for i, t in enumerate(times)]
        outs = {}
        for io in self.module.outputs:
            if io.name not in raw:
                continue
            if isinstance(raw[io.name], DeviceTensor):
                outs[io.name] = raw[io.name]
                continue
            data, t = decode_output(io, raw[io.name])
            outs[io.name] = Tensor(t, data, run_shapes[io.name], io.name)
        return [outs[n] for n in wanted]

    async def generate_stream(self, ids, max_new_tokens: int, strategy: str = "greedy", k: int = 50, seed: int = 0,
                              temperature: float = 1.0, eos_token_id=None):
        """Async iterator over the new token ids of a decoder built with the generation head, as
        natively (webiree.InferenceSession.generate_stream): the KV cache stays on the GPU, each
        token is picked there, only its id is read back. ids: a list (or array.array, or JS array)
        of token ids."""
        from ..hal_webgpu.generate import generate_tokens
        if self._released:
            raise DeviceError("the session was released", hint="create a new session")
        if hasattr(ids, "to_py"):
            ids = ids.to_py()
        agen = generate_tokens(self.interp, list(ids), max_new_tokens, strategy, k, seed, temperature, eos_token_id)
        try:
            while True:
                async with self._lock:   # a step at a time: runs of this session may come between steps
                    try:
                        token = await agen.__anext__()
                    except StopAsyncIteration:
                        return
                yield token
        finally:
            await agen.aclose()

    async def generate(self, ids, max_new_tokens: int, strategy: str = "greedy", k: int = 50, seed: int = 0,
                       temperature: float = 1.0, eos_token_id=None, on_token=None) -> list:
        """The new token ids (see generate_stream); on_token(id) is called (and awaited if it
        returns an awaitable) as each one arrives."""
        out = []
        async for token in self.generate_stream(ids, max_new_tokens, strategy, k, seed, temperature, eos_token_id):
            out.append(token)
            if on_token is not None:
                r = on_token(token)
                if hasattr(r, "__await__"):
                    await r
        return out

    async def release(self):
        """Destroy the GPU buffers and the device; the session cannot run afterwards."""
        if self._released:
            return
        async with self._lock:
            self._released = True
            if hasattr(self.driver, "release"):
                await self.driver.release()


def _read(data: bytes, file: str = MODULE_FILE):
    try:
        return read_module(data)
    except ModuleFormatError as e:
        raise ModelError(f"{file} is corrupt: {e}", hint="rebuild the model with this version of webiree") from None
