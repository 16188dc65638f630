"""The HAL interface: what the schedule interpreter needs from a WebGPU device.

Two drivers implement it: `wgpu_driver.WgpuDriver` (native, wgpu-py) and
`browser_driver.BrowserDriver` (navigator.gpu from Pyodide). Methods that
wait for the GPU return awaitables; the native driver's complete at once,
so the same interpreter coroutine runs synchronously there (`run_sync`).
Standard library only: this file ships in the Pyodide runtime wheel.
"""

from __future__ import annotations


class Ready:
    """An awaitable that is already complete (what a synchronous driver returns)."""

    __slots__ = ("value",)

    def __init__(self, value=None):
        self.value = value

    def __await__(self):
        return self.value
        yield  # noqa: unreachable; makes this a generator


def run_sync(coro):
    """Run an interpreter coroutine whose awaits all complete immediately."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("the HAL driver suspended a synchronous call; use the async API with this driver")


class Driver:
    """A WebGPU device as the interpreter sees it."""

    def limits(self) -> dict:
        """Adapter limits under snake_case WebGPU names (max_buffer_size, ...)."""
        raise NotImplementedError

    def adapter_info(self) -> dict:
        """What the adapter says it is: vendor, architecture, device, description (strings), and
        adapter_type ('CPU', ...) or is_fallback_adapter where known (requirements.adapter_class)."""
        return {}

    def create_buffer(self, size: int, kind: str, label: str = ""):
        """kind 'storage' (STORAGE | COPY_SRC | COPY_DST) or 'readback' (MAP_READ | COPY_DST)."""
        raise NotImplementedError

    def write_buffer(self, buffer, offset: int, data) -> None:
        raise NotImplementedError

    def create_pipeline(self, name: str, fmt: str, code: bytes, entry: str, bindings: list):
        """An awaitable compute pipeline; bindings = [(slot, writes)]."""
        raise NotImplementedError

    def create_bind_group(self, pipeline, entries: list):
        """entries = [(slot, buffer, offset, size)]."""
        raise NotImplementedError

    def submit(self, items: list, profile: bool = False):
        """Record `items` in order into one command encoder and submit it once.
        Items: ('dispatch', pipeline, bind_group, (gx, gy, gz)) and
        ('copy', src, src_offset, dst, dst_offset, size). Consecutive dispatches
        share one compute pass. Returns per-dispatch GPU ns when `profile` and the
        device has timestamp queries, else None (awaitable)."""
        raise NotImplementedError

    def copy(self, copies: list):
        """Submit buffer-to-buffer copies [(src, src_offset, dst, dst_offset, size)] (sizes and
        offsets multiples of 4) in one command buffer, after everything submitted before;
        awaitable. Drivers may do it more directly than this."""
        return self.submit([("copy", *c) for c in copies])

    def read_buffer(self, buffer, offset: int, size: int):
        """Awaitable bytes of a 'readback' buffer after the last submit."""
        raise NotImplementedError

    def destroy_buffer(self, buffer) -> None:
        raise NotImplementedError
