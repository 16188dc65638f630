"""The schedule interpreter: runs a schedule module on any HAL driver.

Written once, as coroutines, for both drivers (DESIGN.md contract 6).
`prepare()` does everything that can be done once per session: buffers,
weight upload, every pipeline (created concurrently where the driver can),
bind groups, and the recorded list of dispatches. `run()` then only writes
the inputs, submits that list in one command encoder and reads all outputs
back with one copy into one readback buffer.
"""

from __future__ import annotations

from ..errors import DeviceError, FeedError, LimitsError, ModelError
from ..module import format as F
from .feeds import decode_output, encode_input
from .requirements import check_requirements

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

    async def prepare(self):
        try:
            return await self._prepare()
        except BaseException:
            self.release()      # a failed session holds no GPU buffers
            raise

    def release(self) -> None:
        """Destroy every GPU buffer this interpreter created (idempotent)."""
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
            buf = d.create_buffer(max(b.size, 4), "storage", b.name or f"{b.kind}{i}")
            self.buffers.append(buf)
            if b.kind == "weights":
                d.write_buffer(buf, 0, self.weights[b.blob_offset:b.blob_offset + b.size])
        pending = [d.create_pipeline(e.name, e.format, e.code, e.entry, e.bindings) for e in m.executables]
        pipelines = [await p for p in pending]
        regs = [0] * max(m.registers, 1)
        for cmd in m.commands:
            op = cmd[0]
            if op == F.OP_UPLOAD_INPUT:
                io = m.inputs[cmd[1]]
                self.uploads.append((cmd[1], self.buffers[io.buffer], io.offset))
            elif op in (F.OP_DISPATCH, F.OP_DISPATCH_DYN):
                _, ex, gx, gy, gz, binds = cmd
                if op == F.OP_DISPATCH_DYN:
                    gx, gy, gz = regs[gx], regs[gy], regs[gz]
                entries = [(slot, self.buffers[buf], off, size) for slot, buf, off, size in binds]
                bg = d.create_bind_group(pipelines[ex], entries)
                self.items.append(("dispatch", pipelines[ex], bg, (gx, gy, gz)))
            elif op == F.OP_READBACK:
                io = m.outputs[cmd[1]]
                self.readbacks.append((cmd[1], io.buffer, io.offset, self.readback_size, io.size))
                self.readback_size += (io.size + 3) // 4 * 4
            elif op == F.OP_SET_REG:
                regs[cmd[1]] = cmd[2]
            elif op == F.OP_LOAD_DIM:
                regs[cmd[1]] = m.inputs[cmd[2]].shape[cmd[3]]
            elif op == F.OP_ARITH:
                _, aop, dst, a, b = cmd
                regs[dst] = _arith(F.ARITH_OPS[aop], regs[a], regs[b])
        self.readback = d.create_buffer(max(self.readback_size, 4), "readback", "readback")
        for _, buf, off, dst, size in self.readbacks:
            self.items.append(("copy", self.buffers[buf], off, self.readback, dst, (size + 3) // 4 * 4))
        self.prepared = True
        return self

    def input_names(self):
        return [io.name for io in self.m.inputs]

    def output_names(self):
        return [io.name for io in self.m.outputs]

    async def run_raw(self, feeds: dict, profile: bool = False):
        """feeds: name -> storage bytes. Returns ({name: storage bytes}, per-dispatch ns or None)."""
        m, d = self.m, self.driver
        if not self.prepared:
            raise DeviceError("this session is closed (or was never prepared)", hint="create a new session")
        missing = [io.name for io in m.inputs if io.name not in feeds]
        if missing:
            raise FeedError(f"missing input(s) {missing}", hint=f"the model's inputs are {self.input_names()}")
        extra = sorted(set(feeds) - {io.name for io in m.inputs})
        if extra:
            raise FeedError(f"unknown input name(s) {extra}", hint=f"the model's inputs are {self.input_names()}")
        for index, buf, off in self.uploads:
            io = m.inputs[index]
            data = feeds[io.name]
            if len(data) != io.size:
                raise FeedError(f"input {io.name!r} has {len(data)} bytes, expected {io.size}")
            if len(data):   # an empty tensor has nothing to upload
                d.write_buffer(buf, off, data)
        times = await d.submit(self.items, profile)
        raw = await d.read_buffer(self.readback, 0, max(self.readback_size, 4))
        raw = memoryview(raw)
        out = {m.outputs[i].name: bytes(raw[dst:dst + size]) for i, _, _, dst, size in self.readbacks}
        return out, times

    async def run(self, feeds: dict, profile: bool = False):
        """feeds: name -> (data, onnx_type or None). Returns {name: (array.array, onnx_type)}."""
        enc = {}
        by_name = {io.name: io for io in self.m.inputs}
        for name, value in feeds.items():
            if name not in by_name:
                raise FeedError(f"unknown input name {name!r}", hint=f"the model's inputs are {self.input_names()}")
            data, onnx_type = value if isinstance(value, tuple) else (value, None)
            enc[name] = encode_input(by_name[name], data, onnx_type)
        raw, _ = await self.run_raw(enc, profile)
        return {io.name: decode_output(io, raw[io.name]) for io in self.m.outputs}


def _arith(op: str, a: int, b: int) -> int:
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div_floor":
        return a // b
    if op == "div_ceil":
        return -(-a // b)
    if op == "min":
        return min(a, b)
    return max(a, b)
