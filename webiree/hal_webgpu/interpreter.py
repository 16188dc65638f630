"""The schedule interpreter: runs a schedule module on any HAL driver.

Written once, as coroutines, for both drivers (DESIGN.md contract 6).
`prepare()` does everything that can be done once per session: buffers,
weight upload, every pipeline (created concurrently where the driver can),
bind groups, and the recorded list of dispatches. `run()` then only writes
the inputs, submits that list in one command encoder and reads all outputs
back with one copy into one readback buffer.

GPU-resident tensors: `run_raw(..., keep=names)` leaves those outputs on the
device, each copied into a buffer of its own (a `DeviceTensor`) instead of the
readback buffer, and a `DeviceTensor` fed as an input is copied on the GPU into
the input's place (`driver.copy`, copyBufferToBuffer). The schedule module is
unchanged: only the copies around its dispatches differ.
"""

from __future__ import annotations

from ..errors import DeviceError, FeedError, LimitsError, ModelError
from ..module import format as F
from .feeds import bind_dims, decode_output, encode_input, type_name
from .requirements import check_requirements

def _round4(n: int) -> int:
    return (n + 3) // 4 * 4


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


class DeviceTensor:
    """An output kept on the GPU: its own storage buffer holding the tensor in the kernels'
    32-bit storage. name, shape, onnx_type (ONNX element type), dtype (storage), size (bytes).
    Feed it back to the session that made it; `read()` (awaitable storage bytes) or, natively,
    `numpy()` reads it back on demand; `release()` frees it (also done when its session closes)."""

    def __init__(self, owner: "Interpreter", buffer, io, shape=None):
        self._owner = owner
        self._io = io
        self.buffer = buffer
        self.name = io.name
        self.shape = tuple(io.shape if shape is None else shape)
        self.onnx_type = io.onnx_type
        self.dtype = io.dtype
        self.size = 4 * _numel(self.shape)

    @property
    def released(self) -> bool:
        return self.buffer is None

    def release(self) -> None:
        """Free the GPU buffer now (idempotent)."""
        owner, buf = self._owner, self.buffer
        self.buffer = None
        if owner is not None and buf is not None:
            owner._resident.pop(id(self), None)
            try:
                owner.driver.destroy_buffer(buf)
            except Exception:
                pass

    async def read(self) -> bytes:
        """The tensor's storage bytes, read back from the GPU."""
        if self.buffer is None:
            raise FeedError(f"device tensor {self.name!r} was released", hint="keep it until it is read")
        return await self._owner.read_tensor(self)

    async def read_value(self):
        """(array.array, onnx_type), as Interpreter.run returns outputs."""
        return decode_output(self._io, await self.read())

    def numpy(self):
        """The tensor as a numpy array of its ONNX type (native drivers only)."""
        import numpy as np

        from ..dtypes import RUNTIME_TYPES, STORAGE_NUMPY
        from .hal import run_sync
        raw = run_sync(self.read())
        a = np.frombuffer(raw, dtype=STORAGE_NUMPY[self.dtype]).reshape(self.shape)
        return a.astype(np.dtype(RUNTIME_TYPES[self.onnx_type].numpy))

    def __repr__(self):
        state = "released" if self.released else "on the GPU"
        return f"DeviceTensor({self.name!r}, shape={list(self.shape)}, onnx_type={self.onnx_type}, {state})"


class Interpreter:
    def __init__(self, module: F.Module, driver, weights):
        self.m = module
        self.driver = driver
        self.weights = memoryview(weights) if weights is not None else memoryview(b"")
        check_requirements(module.limits, driver.limits())
        self.buffers = []
        self.items = []
        self.uploads = []      # (input_index, buffer)
        self.readbacks = []    # (output_index, offset in the readback buffer, size)
        self.readback = None
        self.readback_size = 0
        self.prepared = False
        self.params = []       # the dims buffers of a dynamic module (written per run)
        self.dynamic = bool(module.symbols) or any(c[0] == F.OP_DISPATCH_DYN for c in module.commands)
        self.last_shapes = {}  # name -> shape of every input and output of the last run
        self._plans = {}       # frozenset of output indices read back -> (items, readbacks, size)
        self._sized = {}       # (id(items), registers) -> (items, a dynamic module's run-size plan)
        self._resident = {}    # id -> DeviceTensor made by this interpreter and not released
        self._out_by_name = {io.name: io for io in module.outputs}

    async def prepare(self):
        try:
            return await self._prepare()
        except BaseException:
            self.release()      # a failed session holds no GPU buffers
            raise

    def release(self) -> None:
        """Destroy every GPU buffer this interpreter created (idempotent), device tensors included."""
        for t in list(self._resident.values()):
            t.release()
        self._plans, self._sized = {}, {}
        bufs, self.buffers = self.buffers, []
        if self.readback is not None:
            bufs.append(self.readback)
            self.readback = None
        for buf in bufs:
            try:
                self.driver.destroy_buffer(buf)
            except Exception:
                pass
        self.items, self.uploads, self.prepared = [], [], False

    async def _prepare(self):
        m, d = self.m, self.driver
        pages = [b for b in m.buffers if b.kind == "weights"]
        expected = max((b.blob_offset + b.size for b in pages), default=0)
        if len(self.weights) != expected:
            raise ModelError(f"the weights blob is {len(self.weights)} bytes; the module expects {expected}",
                             hint="the site's weights file is incomplete or belongs to another build; "
                                  "rebuild or re-download it")
        for i, b in enumerate(m.buffers):
            buf = d.create_buffer(max(b.size, 4), "uniform" if b.kind == "params" else "storage",
                                  b.name or f"{b.kind}{i}")
            self.buffers.append(buf)
            if b.kind == "params":
                self.params.append(buf)
            if b.kind == "weights":
                d.write_buffer(buf, 0, self.weights[b.blob_offset:b.blob_offset + b.size])
        pending = [d.create_pipeline(e.name, e.format, e.code, e.entry, e.bindings) for e in m.executables]
        pipelines = [await p for p in pending]
        for cmd in m.commands:
            op = cmd[0]
            if op == F.OP_UPLOAD_INPUT:
                io = m.inputs[cmd[1]]
                self.uploads.append((cmd[1], self.buffers[io.buffer], io.offset))
            elif op in (F.OP_DISPATCH, F.OP_DISPATCH_DYN):
                _, ex, gx, gy, gz, binds = cmd
                entries = [(slot, self.buffers[buf], off, size) for slot, buf, off, size in binds]
                bg = d.create_bind_group(pipelines[ex], entries)
                # a dynamic dispatch keeps its count registers ("dispatch_dyn"); run() fills them in
                kind = "dispatch" if op == F.OP_DISPATCH else "dispatch_dyn"
                self.items.append((kind, pipelines[ex], bg, (gx, gy, gz)))
            elif op == F.OP_READBACK:
                io = m.outputs[cmd[1]]
                self.readbacks.append((cmd[1], io.buffer, io.offset, self.readback_size, io.size))
                self.readback_size += (io.size + 3) // 4 * 4
            # SET_REG / LOAD_DIM / ARITH: evaluated per run (format.eval_registers)
        self.dispatches = list(self.items)
        self.readback = d.create_buffer(max(self.readback_size, 4), "readback", "readback")
        for _, buf, off, dst, size in self.readbacks:
            self.items.append(("copy", self.buffers[buf], off, self.readback, dst, (size + 3) // 4 * 4))
        self._plans[frozenset(range(len(m.outputs)))] = (self.items, self.readbacks, self.readback_size)
        self.prepared = True
        return self

    def upload(self, name: str, data: bytes, shape) -> DeviceTensor:
        """A device tensor holding `data` (storage bytes, as encode_input makes them) for input
        `name`, written once and fed to any number of runs without another upload."""
        io = next((i for i in self.m.inputs if i.name == name), None)
        if io is None:
            raise FeedError(f"unknown input name {name!r}", hint=f"the model's inputs are {self.input_names()}")
        if not self.prepared:
            raise DeviceError("this session is closed (or was never prepared)", hint="create a new session")
        size = 4 * _numel(shape)
        if len(data) != size:
            raise FeedError(f"input {name!r} has {len(data)} bytes, expected {size} for shape {tuple(shape)}")
        t = DeviceTensor(self, self.driver.create_buffer(max(_round4(size), 4), "storage", f"upload {name}"), io, shape)
        self._resident[id(t)] = t
        if data:
            self.driver.write_buffer(t.buffer, 0, data)
        return t

    def input_names(self):
        return [io.name for io in self.m.inputs]

    def output_names(self):
        return [io.name for io in self.m.outputs]

    def _plan(self, read: frozenset):
        """(items, readbacks, readback size) reading back only the outputs `read` (by index),
        packed at the start of the one readback buffer; made once per set."""
        plan = self._plans.get(read)
        if plan is None:
            items, readbacks, at = list(self.dispatches), [], 0
            for i, buf, off, _, size in self.readbacks:
                if i in read:
                    readbacks.append((i, buf, off, at, size))
                    items.append(("copy", self.buffers[buf], off, self.readback, at, _round4(size)))
                    at += _round4(size)
            plan = self._plans[read] = (items, readbacks, at)
        return plan

    def _device_feed(self, io, t: DeviceTensor):
        if t._owner is not self:
            raise FeedError(f"input {io.name!r} is device tensor {t.name!r} of another session",
                            hint="a device tensor feeds only the session that made it; "
                                 "read it with .numpy() and feed the array")
        if t.released:
            raise FeedError(f"input {io.name!r} is device tensor {t.name!r}, which was released",
                            hint="feed a device tensor before releasing it")
        if not io.dynamic and tuple(t.shape) != tuple(io.shape):
            raise FeedError(f"input {io.name!r} has shape {tuple(t.shape)} (device tensor {t.name!r}); "
                            f"the model was compiled for {tuple(io.shape)}", hint="feed exactly that shape")
        if t.onnx_type != io.onnx_type or t.dtype != io.dtype:
            raise FeedError(f"input {io.name!r} must be {type_name(io.onnx_type)}, got device tensor {t.name!r} "
                            f"of {type_name(t.onnx_type)}", hint="feed a tensor of the input's type")

    async def run_raw(self, feeds: dict, profile: bool = False, keep=(), outputs=None, shapes=None):
        """feeds: name -> storage bytes or a DeviceTensor of this interpreter. keep: output names
        to leave on the GPU, returned as new DeviceTensors; outputs: the names to return (None:
        all); only those not kept are read back. shapes: name -> the fed shape of each input (a
        dynamic module needs them; a static one checks them where given). Returns ({name:
        storage bytes | DeviceTensor}, per-dispatch ns or None); `last_shapes` then holds every
        input's and output's shape in this run."""
        m, d = self.m, self.driver
        if not self.prepared:
            raise DeviceError("this session is closed (or was never prepared)", hint="create a new session")
        missing = [io.name for io in m.inputs if io.name not in feeds]
        if missing:
            raise FeedError(f"missing input(s) {missing}", hint=f"the model's inputs are {self.input_names()}")
        extra = sorted(set(feeds) - {io.name for io in m.inputs})
        if extra:
            raise FeedError(f"unknown input name(s) {extra}", hint=f"the model's inputs are {self.input_names()}")
        index = {io.name: i for i, io in enumerate(m.outputs)}
        keep = list(dict.fromkeys(keep or ()))
        wanted = list(index) if outputs is None else list(outputs)
        bad = [n for n in keep + wanted if n not in index]
        if bad:
            raise FeedError(f"unknown output name(s) {bad}", hint=f"the model's outputs are {self.output_names()}")
        shapes = dict(shapes or {})
        for name, t in feeds.items():
            if isinstance(t, DeviceTensor):
                shapes.setdefault(name, t.shape)
        regs = bind_dims(m, shapes)
        in_shapes = {io.name: F.shape_of(io, regs) for io in m.inputs}
        copies = []
        for i, buf, off in self.uploads:
            io = m.inputs[i]
            data = feeds[io.name]
            size = 4 * _numel(in_shapes[io.name])
            if isinstance(data, DeviceTensor):
                self._device_feed(io, data)
                if size:
                    copies.append((data.buffer, 0, buf, off, _round4(size)))
            elif len(data) != size:
                raise FeedError(f"input {io.name!r} has {len(data)} bytes, expected {size} for shape "
                                f"{in_shapes[io.name]}")
        for i, buf, off in self.uploads:
            io = m.inputs[i]
            data = feeds[io.name]
            if not isinstance(data, DeviceTensor) and len(data):   # an empty tensor has nothing to upload
                d.write_buffer(buf, off, data)
        if copies:
            await d.copy(copies)
        if self.params:
            words = b"".join(int(regs[k]).to_bytes(4, "little", signed=True) for k in range(len(m.symbols)))
            for buf in self.params:
                d.write_buffer(buf, 0, words)
        out_shapes = {io.name: F.shape_of(io, regs) for io in m.outputs}
        self.last_shapes = {**in_shapes, **out_shapes}
        items, readbacks, size = self._plan(frozenset(index[n] for n in wanted if n not in keep))
        if self.dynamic:  # the same sizes get the same items (the driver reuses what it encoded for them)
            key = (id(items), tuple(regs))
            sized = self._sized.get(key)
            if sized is None or sized[0] is not items:
                if len(self._sized) >= 16:
                    self._sized.clear()
                sized = self._sized[key] = (items, self._at_run_size(items, readbacks, regs, out_shapes))
            items, readbacks, size = sized[1]
        times = await d.submit(items, profile)
        out = {}
        if keep:
            kept = []
            for n in keep:
                io = m.outputs[index[n]]
                nbytes = 4 * _numel(out_shapes[n])
                t = DeviceTensor(self, d.create_buffer(max(_round4(nbytes), 4), "storage", f"kept {n}"), io,
                                 out_shapes[n])
                self._resident[id(t)] = t
                out[n] = t
                if nbytes:
                    kept.append((self.buffers[io.buffer], io.offset, t.buffer, 0, _round4(nbytes)))
            if kept:
                await d.copy(kept)
        if readbacks:
            raw = memoryview(await d.read_buffer(self.readback, 0, max(size, 4)))
            for i, _, _, dst, n in readbacks:
                out[m.outputs[i].name] = bytes(raw[dst:dst + n])
        return out, times

    def _at_run_size(self, items, readbacks, regs, out_shapes):
        """A dynamic module's items with this run's workgroup counts (from the registers) and
        its readbacks cut to the outputs' sizes in this run, packed from the readback buffer's
        start so only those bytes are mapped (a count of 0 skips the dispatch). Returns (items,
        readbacks, bytes to read back)."""
        m = self.m
        sized, moved, at = [], {}, 0
        for i, _, _, dst, _ in readbacks:
            moved[dst] = (i, at)
            at += _round4(4 * _numel(out_shapes[m.outputs[i].name]))
        for it in items:
            if it[0] == "dispatch_dyn":
                grid = tuple(regs[r] for r in it[3])
                if min(grid) > 0:
                    sized.append(("dispatch", it[1], it[2], grid))
            elif it[0] == "copy" and it[3] is self.readback:
                i, dst = moved[it[4]]
                n = _round4(4 * _numel(out_shapes[m.outputs[i].name]))
                if n:
                    sized.append(it[:4] + (dst, n))
            else:
                sized.append(it)
        readbacks = [(i, buf, off, moved[dst][1], 4 * _numel(out_shapes[m.outputs[i].name]))
                     for i, buf, off, dst, _ in readbacks]
        return sized, readbacks, at

    async def read_tensor(self, t: DeviceTensor) -> bytes:
        """Read a device tensor back through a staging buffer of its size."""
        d = self.driver
        if not t.size:
            return b""
        staging = d.create_buffer(_round4(t.size), "readback", f"read {t.name}")
        try:
            await d.copy([(t.buffer, 0, staging, 0, _round4(t.size))])
            raw = await d.read_buffer(staging, 0, _round4(t.size))
        finally:
            d.destroy_buffer(staging)
        return bytes(memoryview(raw)[:t.size])

    async def run(self, feeds: dict, profile: bool = False, keep=()):
        """feeds: name -> (data, onnx_type or None[, shape]) or a DeviceTensor (a dynamic module's
        inputs need their shape). Returns {name: (array.array, onnx_type)}, with a DeviceTensor for
        each output named in keep; `last_shapes` holds this run's shapes."""
        enc, shapes = {}, {}
        by_name = {io.name: io for io in self.m.inputs}
        for name, value in feeds.items():
            if name not in by_name:
                raise FeedError(f"unknown input name {name!r}", hint=f"the model's inputs are {self.input_names()}")
            if isinstance(value, DeviceTensor):
                enc[name] = value
                continue
            data, onnx_type, *shape = value if isinstance(value, tuple) else (value, None)
            if shape:
                shapes[name] = tuple(shape[0])
            enc[name] = encode_input(by_name[name], data, onnx_type, shapes.get(name))
        raw, _ = await self.run_raw(enc, profile, keep, shapes=shapes)
        return {io.name: raw[io.name] if isinstance(raw[io.name], DeviceTensor) else decode_output(io, raw[io.name])
                for io in self.m.outputs}
