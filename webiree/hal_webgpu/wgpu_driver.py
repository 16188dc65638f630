"""The native HAL driver over wgpu-py (Vulkan, Metal, D3D12; lavapipe on CPUs).

One process-wide device is shared by every session (creating a device per
session is slow on software drivers); it is requested with the adapter's own
limits so any module built within them runs.
"""

from __future__ import annotations

import os
import time
import threading

from ..errors import CompilerBug, DeviceError
from .hal import Driver, Ready
from .requirements import PACKED_4X8

try:  # wgpu-py's cffi handles: encoding through them costs ~2 us a dispatch instead of ~25 us
    from wgpu.backends.wgpu_native._api import ffi as _ffi
    from wgpu.backends.wgpu_native._api import lib as _lib, libf as _libf
except Exception:  # another wgpu-py version: the public API works too, only slower
    _ffi = _lib = _libf = None

_LOCK = threading.Lock()
_SHARED = None

# wgpu-py limit names (hyphenated) we request at the adapter's maximum
_LIMIT_KEYS = ("max-buffer-size", "max-storage-buffer-binding-size", "max-storage-buffers-per-shader-stage",
               "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
               "max-compute-workgroup-size-x", "max-compute-workgroup-size-y", "max-compute-workgroup-size-z",
               "max-compute-workgroups-per-dimension", "max-bindings-per-bind-group")

NO_ADAPTER_HINT = ("install a Vulkan driver: on Debian/Ubuntu `apt-get install mesa-vulkan-drivers` "
                   "(lavapipe runs WebGPU on the CPU); see README.md")


def _import_wgpu():
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    try:
        import wgpu  # noqa: F401
    except Exception as e:  # wgpu missing or its native library failed to load
        raise DeviceError(f"wgpu-py is not usable: {e}", hint="pip install wgpu (see pyproject.toml)") from None
    return wgpu


def request_device():
    """(adapter, device) shared by the process; DeviceError if there is no adapter."""
    global _SHARED
    with _LOCK:
        if _SHARED is not None:
            return _SHARED
        wgpu = _import_wgpu()
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        except Exception as e:
            raise DeviceError(f"no WebGPU adapter found ({str(e).splitlines()[0][:160]})", hint=NO_ADAPTER_HINT) from None
        if adapter is None:
            raise DeviceError("no WebGPU adapter found", hint=NO_ADAPTER_HINT)
        limits = {k: adapter.limits[k] for k in _LIMIT_KEYS if k in adapter.limits}
        features = [f for f in ("timestamp-query", "subgroup", "shader-f16") if f in adapter.features]
        try:
            device = adapter.request_device_sync(required_limits=limits, required_features=features)
        except Exception as e:
            raise DeviceError(f"the WebGPU adapter refused a device: {str(e)[:200]}", hint=NO_ADAPTER_HINT) from None
        _SHARED = (adapter, device)
        return _SHARED


def adapter_limits() -> dict:
    """The shared adapter's limits under snake_case names, plus `subgroup_size` where the device
    runs a workgroup of that many invocations as exactly one subgroup (see subgroup_size()),
    `shader_f16: 1` where the device has that feature, and `packed_4x8_integer_dot_product: 1`."""
    adapter, _ = request_device()
    out = {k.replace("-", "_"): v for k, v in adapter.limits.items() if isinstance(v, int)}
    if "shader-f16" in request_device()[1].features:
        out["shader_f16"] = 1       # halves in storage (compiler/half_storage.py)
    # naga, wgpu-native's shader compiler, has pack4xI8 and dot4I8Packed (wgpu-py reports no WGSL
    # language features): integer products run here
    out[PACKED_4X8] = 1
    size = subgroup_size()
    if size:
        out["subgroup_size"] = size
    return out


_SUBGROUP_PROBE = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(WG)
fn main(@builtin(subgroup_size) size: u32, @builtin(subgroup_invocation_id) sid: u32,
        @builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  out[wid.x * WGu + li] = size * 65536u + sid * 256u + li;
}
"""
_SUBGROUP_SIZE = None


def subgroup_size() -> int:
    """The subgroup size S for which a workgroup of S invocations is exactly one subgroup whose
    invocation ids equal the local invocation indices (kernels that broadcast within a workgroup
    rely on it), measured once by running a probe; 0 without the subgroups feature or if the
    device does not behave so. Adapters report only a min..max range, hence the probe."""
    global _SUBGROUP_SIZE
    if _SUBGROUP_SIZE is not None:
        return _SUBGROUP_SIZE
    _SUBGROUP_SIZE = 0
    _, device = request_device()
    if "subgroup" not in device.features:
        return 0
    import numpy as np
    w = _import_wgpu()

    def run(wg: int, groups: int):
        code = _SUBGROUP_PROBE.replace("WGu", f"{wg}u").replace("WG", str(wg))
        pipe = device.create_compute_pipeline(layout="auto", compute={
            "module": device.create_shader_module(code=code), "entry_point": "main"})
        buf = device.create_buffer(size=4 * wg * groups, usage=w.BufferUsage.STORAGE | w.BufferUsage.COPY_SRC)
        bg = device.create_bind_group(layout=pipe.get_bind_group_layout(0),
                                      entries=[{"binding": 0, "resource": {"buffer": buf}}])
        enc = device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(groups)
        cp.end()
        device.queue.submit([enc.finish()])
        got = np.frombuffer(device.queue.read_buffer(buf), np.uint32)
        buf.destroy()
        return got >> 16, (got >> 8) & 255, got & 255

    try:
        sizes, _, _ = run(64, 1)
        size = int(sizes[0])
        if size not in (4, 8, 16, 32, 64) or (sizes != size).any():
            return 0
        sizes, sids, lis = run(size, 8)
        if (sizes == size).all() and (sids == lis).all():
            _SUBGROUP_SIZE = size
    except Exception:   # a driver without working subgroups: the kernels that need them are not used
        _SUBGROUP_SIZE = 0
    return _SUBGROUP_SIZE


def adapter_info() -> dict:
    adapter, _ = request_device()
    info = adapter.info
    return {k: info[k] for k in ("vendor", "device", "description", "adapter_type", "backend_type") if k in info}


def validate_wgsl(name: str, code: str) -> None:
    """Let naga validate a shader; a failure is a compiler bug naming the dispatch."""
    _, device = request_device()
    try:
        device.create_shader_module(label=name, code=code)
    except Exception as e:
        raise CompilerBug(f"naga rejected the WGSL of dispatch {name}: {str(e)[:2000]}",
                          hint="this is a webiree bug; please report it with the model") from None


# Dispatches per submit on a discrete GPU: the GPU starts on the first part while the host encodes
# the rest (0.67x to 0.94x the latency on the H200's seed models, docs/performance.md). Other
# adapters (integrated GPUs, CPU renderers such as lavapipe) run one submit per inference.
DISCRETE_GPU_SUBMIT_CHUNK = 16


# A GPU idles at a fraction of its clock and raises it only under a high duty cycle: measured on the
# H200 (nvidia-smi, 3 Dec 2026), the SM clock fell from 1,980 to 345 MHz within 2 s of idling, and
# profiled 4096^3 products each behind a 64 MB upload (10-25 % busy) kept it there: 22.8 ms a
# product instead of 4.0 ms; MiniLM's runs (60-85 % busy) raised it to 1,980 MHz within 0.3-0.5 s,
# and after 1 s of hold_clocks' spinning the product's profiled run took 3.96 ms. Benchmarks call
# hold_clocks() before a profiled run, so its per-dispatch times are the kernels' at the clock of a
# busy GPU, as PyTorch's timing loops measure theirs.
_SPIN = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x = f32(g.x & 255u);
  for (var i = 0u; i < 4096u; i++) { x = fma(x, 0.99991, 0.00013); }
  out[g.x & 255u] = x;
}"""
_SPIN_STATE = None


def hold_clocks(seconds: float = 0.3) -> float:
    """Keep a GPU adapter busy for about `seconds` (a spinning kernel, its own buffer) so its
    clocks are at their sustained level when a benchmark times next; returns the seconds spent.
    Does nothing on a CPU adapter (lavapipe, SwiftShader: no clocks to raise)."""
    global _SPIN_STATE
    adapter, device = request_device()
    if _adapter_kind(adapter.info.get("adapter_type", "")) not in ("discretegpu", "integratedgpu"):
        return 0.0
    w = _import_wgpu()
    if _SPIN_STATE is None:
        pipe = device.create_compute_pipeline(layout="auto", compute={
            "module": device.create_shader_module(code=_SPIN), "entry_point": "main"})
        buf = device.create_buffer(size=1024, usage=w.BufferUsage.STORAGE | w.BufferUsage.COPY_SRC)
        bg = device.create_bind_group(layout=pipe.get_bind_group_layout(0),
                                      entries=[{"binding": 0, "resource": {"buffer": buf}}])
        _SPIN_STATE = (pipe, bg, buf)
    pipe, bg, buf = _SPIN_STATE
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        enc = device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        for _ in range(8):
            cp.dispatch_workgroups(8192)
        cp.end()
        device.queue.submit([enc.finish()])
        k += 1
        if k % 4 == 0:     # a few submissions in flight keep the GPU busy between waits
            device.queue.read_buffer(buf, 0, 4)
    device.queue.read_buffer(buf, 0, 4)
    return time.perf_counter() - t0


def _adapter_kind(adapter_type: str) -> str:
    """wgpu's adapter type ('DiscreteGPU', 'Cpu', ...) as one spelling: 'discretegpu', 'cpu', ..."""
    return adapter_type.lower().replace(" ", "")


def default_submit_chunk(adapter_type: str) -> int:
    """The submission strategy for an adapter of this type, as wgpu reports it."""
    return DISCRETE_GPU_SUBMIT_CHUNK if _adapter_kind(adapter_type) == "discretegpu" else 0


class WgpuDriver(Driver):
    """live_buffers: GPU buffers this driver created and has not destroyed yet;
    WgpuDriver.process_live_buffers(): the same over every driver of the process (the leak check)."""

    _process_live = 0

    def __init__(self, submit_chunk: int | None = None, pre_encode: bool | None = None):
        """submit_chunk: 0 submits an inference as one command buffer; N > 0 submits every N
        dispatches, so the GPU starts while the host still encodes the rest (docs/performance.md);
        None chooses by the adapter (default_submit_chunk). pre_encode: after each submit, encode
        the same schedule's next command buffer while the GPU runs this one, so that the next
        inference only submits it (a schedule's commands are fixed: the inputs and shape words
        are written into its buffers, which the queue orders before the submit); None: on GPUs,
        not on CPU renderers (where the GPU's work is the CPU's, so there is nothing to overlap)."""
        self._chunks = (None, None)
        self.adapter, self.device = request_device()
        if submit_chunk is None:
            submit_chunk = default_submit_chunk(self.adapter.info.get("adapter_type", ""))
        self.submit_chunk = submit_chunk
        self.wgpu = _import_wgpu()
        self._limits = adapter_limits()
        self.live_buffers = 0
        self.has_timestamps = "timestamp-query" in self.device.features
        self.last_spans = None          # [(begin_ns, end_ns)] per dispatch of the last profiled submit
        self._raw_cache = {}
        if pre_encode is None:
            pre_encode = _adapter_kind(self.adapter.info.get("adapter_type", "")) != "cpu"
        self.pre_encode = pre_encode and _libf is not None
        self.pre_encoded_submits = 0    # submits of a command buffer encoded during the run before
        self._encoded = {}              # id(items) -> (items, a finished command buffer not yet submitted)
        self._last = None               # the items of the last submit

    @classmethod
    def process_live_buffers(cls) -> int:
        return cls._process_live

    def _count(self, delta: int) -> None:
        with _LOCK:
            self.live_buffers += delta
            WgpuDriver._process_live += delta

    def limits(self):
        return self._limits

    def adapter_info(self):
        return {k: v for k, v in dict(self.adapter.info).items() if isinstance(v, str)}

    def create_buffer(self, size, kind, label=""):
        U = self.wgpu.BufferUsage
        usage = {"storage": U.STORAGE | U.COPY_SRC | U.COPY_DST, "uniform": U.UNIFORM | U.COPY_DST}.get(
            kind, U.MAP_READ | U.COPY_DST)
        try:
            buf = self.device.create_buffer(label=label, size=size, usage=usage)
        except Exception as e:
            raise DeviceError(f"cannot allocate a {size}-byte GPU buffer: {str(e)[:200]}") from None
        self._count(+1)
        return buf

    def destroy_buffer(self, buffer):
        buffer.destroy()
        self._count(-1)

    def write_buffer(self, buffer, offset, data):
        self.device.queue.write_buffer(buffer, offset, data)

    def create_pipeline(self, name, fmt, code, entry, bindings):
        w = self.wgpu
        try:
            if fmt == "wgsl":
                sm = self.device.create_shader_module(label=name, code=code.decode("utf-8"))
            else:
                sm = self.device.create_shader_module(label=name, code=bytes(code))
            bgl = self.device.create_bind_group_layout(entries=[
                {"binding": slot, "visibility": w.ShaderStage.COMPUTE,
                 "buffer": {"type": w.BufferBindingType.uniform if kind == 2 else
                            w.BufferBindingType.storage}} for slot, kind in bindings])
            layout = self.device.create_pipeline_layout(bind_group_layouts=[bgl])
            pipe = self.device.create_compute_pipeline(label=name, layout=layout,
                                                       compute={"module": sm, "entry_point": entry})
        except Exception as e:
            raise DeviceError(f"cannot create the pipeline of dispatch {name}: {str(e)[:1500]}",
                              hint="the module may have been built for another webiree version; rebuild it") from None
        return Ready((pipe, bgl))

    def create_bind_group(self, pipeline, entries):
        _, bgl = pipeline
        try:
            return self.device.create_bind_group(layout=bgl, entries=[
                {"binding": slot, "resource": {"buffer": buf, "offset": off, "size": size}}
                for slot, buf, off, size in entries])
        except Exception as e:
            raise DeviceError(f"cannot bind the buffers of a dispatch: {str(e)[:600]}",
                              hint="the module does not fit this adapter (binding alignment or size); "
                                   "rebuild it with --limits adapter") from None

    def submit(self, items, profile=False):
        query, n_disp = None, sum(1 for it in items if it[0] == "dispatch")
        if profile and self.has_timestamps and n_disp:
            query = self.device.create_query_set(type="timestamp", count=2 * n_disp)
        if query is None and _libf is not None:
            ready = self._encoded.pop(id(items), None)
            if ready is not None and ready[0] is items:
                self.device.queue.submit([ready[1]])
                self.pre_encoded_submits += 1
            elif self.submit_chunk and n_disp > self.submit_chunk:
                for part in self._parts(items):
                    self.device.queue.submit([self._encode_raw(part)])
            else:
                self.device.queue.submit([self._encode_raw(items)])
            if self.pre_encode and (ready is not None or self._last is items):  # submitted twice in a row
                if len(self._encoded) >= 4:    # a few schedules (e.g. a decoder's prefill and step)
                    self._encoded.clear()
                self._encoded[id(items)] = (items, self._encode_raw(items))
            self._last = items
            return Ready(None)
        enc = self.device.create_command_encoder()
        cpass, k = None, 0
        for it in items:
            if it[0] == "dispatch":
                if query is not None:
                    if cpass is not None:
                        cpass.end()
                    cpass = enc.begin_compute_pass(timestamp_writes={
                        "query_set": query, "beginning_of_pass_write_index": 2 * k,
                        "end_of_pass_write_index": 2 * k + 1})
                elif cpass is None:
                    cpass = enc.begin_compute_pass()
                _, (pipe, _), bg, (gx, gy, gz) = it
                cpass.set_pipeline(pipe)
                cpass.set_bind_group(0, bg)
                cpass.dispatch_workgroups(gx, gy, gz)
                k += 1
            else:
                if cpass is not None:
                    cpass.end()
                    cpass = None
                _, src, so, dst, do, size = it
                enc.copy_buffer_to_buffer(src, so, dst, do, size)
        if cpass is not None:
            cpass.end()
        times = None
        if query is not None:
            U = self.wgpu.BufferUsage
            resolve = self.device.create_buffer(size=16 * n_disp, usage=U.QUERY_RESOLVE | U.COPY_SRC)
            enc.resolve_query_set(query, 0, 2 * n_disp, resolve, 0)
            self.device.queue.submit([enc.finish()])
            raw = self.device.queue.read_buffer(resolve)
            import struct
            ts = struct.unpack(f"<{2 * n_disp}Q", raw)
            times = [ts[2 * i + 1] - ts[2 * i] for i in range(n_disp)]
            self.last_spans = [(ts[2 * i], ts[2 * i + 1]) for i in range(n_disp)]
            resolve.destroy()
            query.destroy()
        else:
            self.device.queue.submit([enc.finish()])
        return Ready(times)

    def copy(self, copies):
        """copyBufferToBuffer for each (src, src_offset, dst, dst_offset, size), one submit."""
        enc = self.device.create_command_encoder()
        for src, so, dst, do, size in copies:
            enc.copy_buffer_to_buffer(src, so, dst, do, size)
        self.device.queue.submit([enc.finish()])
        return Ready(None)

    def _parts(self, items):
        """`items` cut after every submit_chunk dispatches (computed once per schedule)."""
        if self._chunks[0] is not items:
            parts, cur, n = [], [], 0
            for it in items:
                cur.append(it)
                n += it[0] == "dispatch"
                if n == self.submit_chunk:
                    parts.append(cur)
                    cur, n = [], 0
            if cur:
                parts.append(cur)
            self._chunks = (items, parts)
        return self._chunks[1]

    def _encode_raw(self, items):
        """`items` as a finished command buffer, encoded through wgpu-native's C functions
        directly (the commands submit()'s wgpu-py path records, with less Python)."""
        enc = self.device.create_command_encoder()
        raw = self._raw_cache.get(id(items))
        if raw is None or raw[0] is not items:
            steps, prev = [], None
            for it in items:
                if it[0] == "dispatch":
                    _, (pipe, _), bg, (gx, gy, gz) = it
                    ph = pipe._internal  # set once for a run of dispatches of the same pipeline
                    steps.append((None if ph == prev else ph, bg._internal, gx, gy, gz))
                    prev = ph
                else:
                    steps.append(it)
                    prev = None  # a copy ends the pass; the next one starts with no pipeline set
            raw = (items, steps)
            if len(self._raw_cache) >= 256:     # one entry per submitted part of the schedule
                self._raw_cache.clear()
            self._raw_cache[id(items)] = raw
        # the unchecked C calls: a pass records its errors and the checked finish() below raises them
        set_pipeline = _lib.wgpuComputePassEncoderSetPipeline
        set_bind_group = _lib.wgpuComputePassEncoderSetBindGroup
        dispatch = _lib.wgpuComputePassEncoderDispatchWorkgroups
        null = _ffi.NULL
        cpass = None
        for st in raw[1]:
            if st[0] == "copy":
                if cpass is not None:
                    cpass.end()
                    cpass = None
                _, src, so, dst, do, size = st
                enc.copy_buffer_to_buffer(src, so, dst, do, size)
                continue
            if cpass is None:
                cpass = enc.begin_compute_pass()
                h = cpass._internal
            if st[0] is not None:
                set_pipeline(h, st[0])
            set_bind_group(h, 0, st[1], 0, null)
            dispatch(h, st[2], st[3], st[4])
        if cpass is not None:
            cpass.end()
        return enc.finish()

    def read_buffer(self, buffer, offset, size):
        try:
            if _libf is not None:
                data = _read_raw(self.device._internal, buffer._internal, offset, size)
            else:
                buffer.map_sync(self.wgpu.MapMode.READ, offset, size)
                data = bytes(buffer.read_mapped(offset, size))
                buffer.unmap()
        except Exception as e:
            raise DeviceError(f"reading results from the GPU failed: {str(e)[:300]}",
                              hint="the device may have been lost; create a new session") from None
        return Ready(data)


if _ffi is not None:
    @_ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
    def _on_mapped(status, _message, status_out, _unused):
        _ffi.cast("int *", status_out)[0] = status


def _read_raw(device, buffer, offset, size):
    """Map `buffer` for reading, copy `size` bytes out and unmap, through wgpu-native's C API.

    wgpu-py's map_sync submits an empty command buffer before every map, then waits on its
    poller thread: 0.23-0.46 ms a MobileNetV2 readback on the H200, where this takes 0.03-0.04
    (docs/performance.md): wait for the queue to go idle, map (the callback then fires on the
    next poll, in this thread), copy, unmap.
    """
    lib = _libf  # the checked calls: a wgpu error raises
    lib.wgpuDevicePoll(device, True, _ffi.NULL)
    status = _ffi.new("int *", -1)
    info = _ffi.new("WGPUBufferMapCallbackInfo *")
    info.mode = _lib.WGPUCallbackMode_AllowProcessEvents
    info.callback = _on_mapped
    info.userdata1 = status
    lib.wgpuBufferMapAsync(buffer, _lib.WGPUMapMode_Read, offset, size, info[0])
    for _ in range(1000):  # resolves on the first poll once the queue is idle
        lib.wgpuDevicePoll(device, True, _ffi.NULL)
        if status[0] != -1:
            break
    if status[0] != _lib.WGPUMapAsyncStatus_Success:
        if status[0] == -1:
            lib.wgpuBufferUnmap(buffer)  # cancels the pending map
        raise RuntimeError(f"could not map the readback buffer (WGPUMapAsyncStatus {status[0]})")
    data = _ffi.buffer(lib.wgpuBufferGetConstMappedRange(buffer, offset, size), size)[:]
    lib.wgpuBufferUnmap(buffer)
    return data
