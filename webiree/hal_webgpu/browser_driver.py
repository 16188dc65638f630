"""The browser HAL driver: navigator.gpu reached from Pyodide through `pyodide.ffi`.

It implements the same `Driver` interface as `wgpu_driver.WgpuDriver` and is
driven by the same `Interpreter` (no second copy of the schedule logic). Every
method that waits for the GPU returns an awaitable that suspends for real
here (a JS promise), so the interpreter's coroutines run under Pyodide's
event loop (`await` from `runPythonAsync`).

* `await BrowserDriver.create(needed_limits)` requests an adapter, checks the
  module's limits against it (the runtime core's `check_requirements`: a clear
  LimitsError), then requests a device with exactly the module's `max_*`
  limits (and timestamp-query when offered).
* `create_pipeline` starts `createComputePipelineAsync` at once and returns a
  coroutine that awaits it, so `Interpreter.prepare` (which creates every
  pending pipeline before awaiting any) compiles them concurrently.
* `submit` records the prepared item list into one command encoder
  (consecutive dispatches in one compute pass, copies between passes) and
  submits it once. The item list is built once per session by
  `Interpreter.prepare`; the driver converts it to a JS array on first use
  and records it with a small JS loop afterwards, so an inference crosses the
  Python/JS boundary a handful of times instead of three times per dispatch.
* `read_buffer` maps the readback buffer (mapAsync + getMappedRange) and
  copies the bytes out.

Every GPU promise is raced against a timeout and against `device.lost`; a
rejection becomes a `DeviceError` naming what was being waited for. Pipeline
creation times out when no pipeline has finished for that long (they queue
behind each other on software GPUs).
Standard library + Pyodide only: this file ships in the Pyodide runtime wheel.
"""

from __future__ import annotations

import time

from ..errors import DeviceError, ModelError
from .hal import Driver, Ready
from .requirements import CHECKED_LIMITS, PACKED_4X8, check_requirements

TIMEOUT_MS = 30000
NO_WEBGPU_HINT = ("use a recent Chrome/Edge (or Firefox/Safari with WebGPU enabled) over https or localhost; "
                  "headless Chromium needs --enable-unsafe-webgpu")
_ALIGN = ("min_storage_buffer_offset_alignment", "min_uniform_buffer_offset_alignment")

# The JS half of the driver: promise timeouts, device-lost and error bookkeeping,
# and the recorder of a prepared item list. Evaluated once per Pyodide instance.
_HELPERS_JS = r"""
(() => {
  const named = (name, message) => { const e = new Error(message); e.name = name; return e; };
  function withTimeout(promise, ms, what, lost) {
    let timer;
    const limit = new Promise((_, reject) => {
      timer = setTimeout(() => reject(named('WebireeTimeout', `${what} did not finish within ${ms} ms`)), ms);
    });
    const p = Promise.race(lost ? [promise, limit, lost] : [promise, limit]).finally(() => clearTimeout(timer));
    p.catch(() => {});  // a caller that gave up early must not leave an unhandled rejection
    return p;
  }
  class DeviceState {
    constructor(device, ms) {
      this.device = device;
      this.ms = ms;
      this.lostMessage = null;
      this.errors = [];
      this.scope = null;
      this.query = null;
      this.lost = device.lost.then((info) => {
        this.lostMessage = `the WebGPU device was lost (${info.reason}): ${info.message}`;
        throw named('WebireeDeviceLost', this.lostMessage);
      });
      this.lost.catch(() => {});
      device.addEventListener?.('uncapturederror', (ev) => this.errors.push(ev.error?.message ?? String(ev.error)));
    }
    wait(promise, what) { return withTimeout(promise, this.ms, what, this.lost); }
    // Pipelines compile concurrently and may queue behind each other (software GPUs take
    // seconds each), so their timeout is a stall detector: one fails only when no
    // pipeline at all has finished for `ms`.
    waitPipeline(promise, what) {
      if (!this.compiling) this.progressAt = performance.now();
      this.compiling = (this.compiling ?? 0) + 1;
      let timer;
      const stalled = new Promise((_, reject) => {
        const check = () => {
          const idle = performance.now() - this.progressAt;
          if (idle >= this.ms) reject(named('WebireeTimeout', `${what} did not finish within ${this.ms} ms`));
          else timer = setTimeout(check, this.ms - idle + 1);
        };
        timer = setTimeout(check, this.ms);
      });
      // Chain only onto Promise.race(...): a .then()/.finally() directly on a promise handed
      // over from Python is a fatal error in Pyodide 314 under Chromium (JSPI).
      const p = Promise.race([promise, stalled, this.lost]).finally(() => {
        clearTimeout(timer);
        this.progressAt = performance.now();
        this.compiling--;
      });
      p.catch(() => {});
      return p;
    }
    takeErrors() { return this.errors.splice(0).join('; '); }
    pushScopes() { this.device.pushErrorScope('out-of-memory'); this.device.pushErrorScope('validation'); }
    async popScopes(what) {
      const errors = [await this.wait(this.device.popErrorScope(), 'popErrorScope()'),
                      await this.wait(this.device.popErrorScope(), 'popErrorScope()')];
      const e = errors.find(Boolean);
      if (e) throw named('WebireeGPUError', `WebGPU rejected the model while ${what}: ${e.message}`);
    }
    // items: [[0, pipeline, bindGroup, gx, gy, gz] | [1, src, srcOffset, dst, dstOffset, size], ...]
    submit(items, profile) {
      const d = this.device;
      const n = items.reduce((k, it) => k + (it[0] === 0 ? 1 : 0), 0);
      profile = profile && n > 0;
      if (profile && (!this.query || this.queryCount !== n)) {
        this.query?.destroy(); this.resolve?.destroy(); this.times?.destroy();
        this.query = d.createQuerySet({type: 'timestamp', count: 2 * n});
        this.resolve = d.createBuffer({size: 16 * n, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC});
        this.times = d.createBuffer({size: 16 * n, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
        this.queryCount = n;
      }
      d.pushErrorScope('validation');
      const enc = d.createCommandEncoder();
      let pass = null, k = 0;
      for (const it of items) {
        if (it[0] === 0) {
          if (profile) {
            pass?.end();
            pass = enc.beginComputePass({timestampWrites: {querySet: this.query,
              beginningOfPassWriteIndex: 2 * k, endOfPassWriteIndex: 2 * k + 1}});
          } else if (!pass) {
            pass = enc.beginComputePass();
          }
          pass.setPipeline(it[1]);
          pass.setBindGroup(0, it[2]);
          pass.dispatchWorkgroups(it[3], it[4], it[5]);
          k++;
        } else {
          pass?.end();
          pass = null;
          enc.copyBufferToBuffer(it[1], it[2], it[3], it[4], it[5]);
        }
      }
      pass?.end();
      if (profile) {
        enc.resolveQuerySet(this.query, 0, 2 * n, this.resolve, 0);
        enc.copyBufferToBuffer(this.resolve, 0, this.times, 0, 16 * n);
      }
      d.queue.submit([enc.finish()]);
      this.scope = this.wait(d.popErrorScope(), 'popErrorScope()');
      if (!profile) return null;
      return this.wait(this.times.mapAsync(GPUMapMode.READ), 'reading the timestamps (mapAsync)').then(() => {
        const ts = new BigInt64Array(this.times.getMappedRange().slice(0));
        this.times.unmap();
        return Array.from({length: n}, (_, i) => Number(ts[2 * i + 1] - ts[2 * i]));
      });
    }
    async read(buffer, offset, size) {
      const [error] = await Promise.all([this.scope, this.wait(buffer.mapAsync(GPUMapMode.READ, offset, size),
        'reading the results (mapAsync)')]);
      this.scope = null;
      const out = new Uint8Array(buffer.getMappedRange(offset, size).slice(0));
      buffer.unmap();
      if (error) throw named('WebireeGPUError', `WebGPU rejected a command: ${error.message}`);
      return out;
    }
    release() {
      this.query?.destroy(); this.resolve?.destroy(); this.times?.destroy();
    }
  }
  return {withTimeout, DeviceState};
})()
"""

_helpers = None


def _ffi():
    """(js, pyodide.ffi, helpers) — only importable under Pyodide."""
    global _helpers
    try:
        import js
        import pyodide.ffi as ffi
        from pyodide.code import run_js
    except ImportError:
        raise DeviceError("the browser driver needs Pyodide (the js and pyodide modules)",
                          hint="natively, use webiree.InferenceSession (wgpu-py)") from None
    if _helpers is None:
        _helpers = run_js(_HELPERS_JS)
    return js, ffi, _helpers


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def _missing(x) -> bool:
    return x is None or type(x).__name__ in ("JsNull", "JsUndefined")


def _limits_of(js_limits) -> dict:
    """A GPUSupportedLimits under snake_case names (its getters live on the prototype)."""
    out = {}
    for key in CHECKED_LIMITS + _ALIGN + ("max_bind_groups", "max_bindings_per_bind_group"):
        v = getattr(js_limits, _camel(key), None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[key] = int(v)
    return out


def _subgroup_size(adapter) -> int:
    """N where the adapter guarantees subgroups of exactly N invocations (subgroupMinSize ==
    subgroupMaxSize), else 0 (webiree.js adapterFacts says the same)."""
    info = getattr(adapter, "info", None)
    lo, hi = (None, None) if _missing(info) else (getattr(info, "subgroupMinSize", None),
                                                   getattr(info, "subgroupMaxSize", None))
    return int(lo) if isinstance(lo, (int, float)) and lo == hi and lo > 0 else 0


def _gpu_error(e, what: str) -> DeviceError:
    """A JsException from a GPU promise as a DeviceError."""
    name = getattr(e, "name", "")
    message = getattr(e, "message", None) or str(e)
    if name == "WebireeTimeout":
        return DeviceError(message, hint="the GPU may be hung or overloaded; reload the page")
    if name == "WebireeDeviceLost":
        return DeviceError(message, hint="create a new session")
    if name == "WebireeGPUError":
        return DeviceError(message)
    return DeviceError(f"{what} failed: {message}")


class BrowserDriver(Driver):
    """A WebGPU device from navigator.gpu. Create with `await BrowserDriver.create(limits)`."""

    def __init__(self, adapter, device, timeout_ms: int = TIMEOUT_MS):
        js, ffi, helpers = _ffi()
        self._js, self._ffi = js, ffi
        self.adapter = adapter
        self.device = device
        self.timeout_ms = timeout_ms
        self._state = helpers.DeviceState.new(device, timeout_ms)
        self._limits = _limits_of(device.limits)
        self.has_timestamps = bool(device.features.has("timestamp-query"))
        self._usage = js.GPUBufferUsage
        self._buffers = []
        self._recorded = None      # (items list, its JS array)
        self.gpu_wait_ms = 0.0     # time the last read_buffer spent awaiting the GPU
        self.released = False

    @classmethod
    async def create(cls, needed_limits: dict | None = None, *, timeout_ms: int = TIMEOUT_MS,
                     power_preference: str = "high-performance"):
        js, ffi, helpers = _ffi()
        gpu = getattr(js.navigator, "gpu", None)
        if _missing(gpu):
            raise DeviceError("WebGPU is not available in this browser (navigator.gpu is missing)", hint=NO_WEBGPU_HINT)
        obj = _obj_converter(js, ffi)
        what = "navigator.gpu.requestAdapter()"
        try:
            adapter = await helpers.withTimeout(gpu.requestAdapter(obj({"powerPreference": power_preference})),
                                                timeout_ms, what, None)
        except ffi.JsException as e:
            raise _gpu_error(e, what) from None
        if _missing(adapter):
            raise DeviceError("WebGPU is present but no GPU adapter is available",
                              hint="enable hardware acceleration, or try another browser")
        needed = dict(needed_limits or {})
        have = _limits_of(adapter.limits)
        if adapter.features.has("shader-f16"):
            have["shader_f16"] = 1
        wgsl = getattr(gpu, "wgslLanguageFeatures", None)
        if not _missing(wgsl) and wgsl.has(PACKED_4X8):
            have[PACKED_4X8] = 1
        check_requirements(needed, have)   # the same LimitsError as the native driver
        required = {_camel(k): needed[k] for k in CHECKED_LIMITS if k in needed and k in have}
        features = [f for f in ("timestamp-query", "subgroups", "shader-f16") if adapter.features.has(f)]
        what = "adapter.requestDevice()"
        try:
            device = await helpers.withTimeout(
                adapter.requestDevice(obj({"requiredLimits": required, "requiredFeatures": features})),
                timeout_ms, what, None)
        except ffi.JsException as e:
            raise DeviceError(f"the WebGPU adapter refused a device: {getattr(e, 'message', e)}") from None
        drv = cls(adapter, device, timeout_ms)
        if "shader-f16" in features:
            drv._limits["shader_f16"] = 1     # halves in storage (compiler/half_storage.py)
        if have.get(PACKED_4X8):
            drv._limits[PACKED_4X8] = 1       # integer products (wgsl_codegen/kernels/matmul_int8.py)
        size = _subgroup_size(adapter) if "subgroups" in features else 0
        if size:
            drv._limits["subgroup_size"] = size
        return drv

    # ------------------------------------------------------------ helpers
    def _obj(self, d):
        return self._ffi.to_js(d, dict_converter=self._js.Object.fromEntries)

    async def _wait(self, promise, what: str):
        try:
            return await promise
        except self._ffi.JsException as e:
            raise _gpu_error(e, what) from None

    def _check_alive(self):
        if self.released:
            raise DeviceError("the session was released", hint="create a new session")
        lost = self._state.lostMessage
        if not _missing(lost):
            raise DeviceError(str(lost), hint="create a new session")
        errors = self._state.takeErrors()
        if errors:
            raise DeviceError(f"WebGPU reported an error: {errors}")

    def push_error_scopes(self):
        """Collect validation and out-of-memory errors until `pop_error_scopes` (around prepare)."""
        self._state.pushScopes()

    async def pop_error_scopes(self, what: str = "preparing it"):
        await self._wait(self._state.popScopes(what), "popErrorScope()")

    # ------------------------------------------------------------ the HAL
    def limits(self):
        return self._limits

    def adapter_info(self):
        info, out = getattr(self.adapter, "info", None), {}
        for key in ("vendor", "architecture", "device", "description"):
            v = None if _missing(info) else getattr(info, key, None)
            if isinstance(v, str):
                out[key] = v
        fallback = [None if _missing(x) else getattr(x, "isFallbackAdapter", None) for x in (info, self.adapter)]
        if True in fallback:
            out["is_fallback_adapter"] = True
        return out

    def create_buffer(self, size, kind, label=""):
        U = self._usage
        usage = {"storage": U.STORAGE | U.COPY_SRC | U.COPY_DST, "uniform": U.UNIFORM | U.COPY_DST}.get(
            kind, U.MAP_READ | U.COPY_DST)
        try:
            buf = self.device.createBuffer(self._obj({"label": label, "size": size, "usage": usage}))
        except self._ffi.JsException as e:
            raise DeviceError(f"cannot allocate a {size}-byte GPU buffer: {getattr(e, 'message', e)}") from None
        self._buffers.append(buf)
        return buf

    def destroy_buffer(self, buffer):
        buffer.destroy()
        for i, b in enumerate(self._buffers):   # device tensors come and go: do not hold them
            if b is buffer or b == buffer:
                del self._buffers[i]
                break

    def write_buffer(self, buffer, offset, data):
        self.device.queue.writeBuffer(buffer, offset, self._ffi.to_js(memoryview(data).cast("B")))

    def create_pipeline(self, name, fmt, code, entry, bindings):
        if fmt != "wgsl":
            raise ModelError(f"executable {name} is SPIR-V; browsers take WGSL only", hint="rebuild the model for WebGPU")
        d = self.device
        visibility = self._js.GPUShaderStage.COMPUTE
        layout = d.createBindGroupLayout(self._obj({"label": name, "entries": [
            {"binding": slot, "visibility": visibility, "buffer": {"type": "uniform" if kind == 2 else "storage"}}
            for slot, kind in bindings]}))
        text = bytes(code).decode("utf-8")
        if "subgroupBroadcast(" in text:   # naga (the build's validator) takes subgroup builtins without it; Tint does not
            text = "enable subgroups;\n" + text
        shader = d.createShaderModule(self._obj({"label": name, "code": text}))
        pipeline_layout = d.createPipelineLayout(self._obj({"bindGroupLayouts": [layout]}))
        what = f"creating the pipeline of dispatch {name}"
        promise = self._state.waitPipeline(d.createComputePipelineAsync(self._obj({
            "label": name, "layout": pipeline_layout, "compute": {"module": shader, "entryPoint": entry}})), what)
        return self._pipeline(name, promise, shader, layout)   # started now, awaited by prepare

    async def _pipeline(self, name, promise, shader, layout):
        try:
            pipe = await promise
        except self._ffi.JsException as e:
            if getattr(e, "name", "") in ("WebireeTimeout", "WebireeDeviceLost"):
                raise _gpu_error(e, name) from None
            notes = []
            try:
                info = await shader.getCompilationInfo()
                notes = [f"{m.lineNum}:{m.linePos}: {m.message}" for m in info.messages if m.type == "error"]
            except Exception:  # noqa: BLE001 - the notes are a courtesy
                pass
            raise DeviceError(f"cannot create the pipeline of dispatch {name}: "
                              f"{'; '.join(notes) if notes else getattr(e, 'message', e)}",
                              hint="this is a webiree bug: the browser rejected WGSL it emitted; "
                                   "please report it with the model") from None
        return pipe, layout

    def create_bind_group(self, pipeline, entries):
        _, layout = pipeline
        return self.device.createBindGroup(self._obj({"layout": layout, "entries": [
            {"binding": slot, "resource": {"buffer": buf, "offset": off, "size": size}}
            for slot, buf, off, size in entries]}))

    def _js_items(self, items):
        if self._recorded is None or self._recorded[0] is not items:
            rows = []
            for it in items:
                if it[0] == "dispatch":
                    _, (pipe, _), bg, (gx, gy, gz) = it
                    rows.append([0, pipe, bg, gx, gy, gz])
                else:
                    _, src, so, dst, do, size = it
                    rows.append([1, src, so, dst, do, size])
            self._recorded = (items, self._ffi.to_js(rows))
        return self._recorded[1]

    def submit(self, items, profile=False):
        self._check_alive()
        try:
            times = self._state.submit(self._js_items(items), bool(profile and self.has_timestamps))
        except self._ffi.JsException as e:
            raise DeviceError(f"recording the commands failed: {getattr(e, 'message', e)}") from None
        if _missing(times):
            return Ready(None)
        return self._times(times)

    def copy(self, copies):
        """copyBufferToBuffer for each (src, src_offset, dst, dst_offset, size), one submit
        (outside the recorded item list, so the schedule's JS array is not rebuilt)."""
        self._check_alive()
        try:
            enc = self.device.createCommandEncoder()
            for src, so, dst, do, size in copies:
                enc.copyBufferToBuffer(src, so, dst, do, size)
            self.device.queue.submit(self._ffi.to_js([enc.finish()]))
        except self._ffi.JsException as e:
            raise DeviceError(f"copying a device tensor failed: {getattr(e, 'message', e)}") from None
        return Ready(None)

    async def _times(self, promise):
        times = await self._wait(promise, "reading the timestamps")
        return [int(t) for t in times]

    def read_buffer(self, buffer, offset, size):
        return self._read(buffer, offset, size)

    async def _read(self, buffer, offset, size):
        t0 = time.perf_counter()
        data = await self._wait(self._state.read(buffer, offset, size), "reading the results")
        self.gpu_wait_ms = (time.perf_counter() - t0) * 1e3
        return data.to_bytes()

    async def release(self):
        """Destroy every buffer and the device (waits for submitted work first)."""
        if self.released:
            return
        if _missing(self._state.lostMessage):
            try:
                await self._state.wait(self.device.queue.onSubmittedWorkDone(), "onSubmittedWorkDone()")
            except self._ffi.JsException:
                pass
        self.released = True
        for b in self._buffers:
            b.destroy()
        self._buffers.clear()
        self._recorded = None
        self._state.release()
        self.device.destroy()


def _obj_converter(js, ffi):
    return lambda d: ffi.to_js(d, dict_converter=js.Object.fromEntries)
