#!/usr/bin/env python
"""How fast this adapter multiplies packed 8-bit integers against f32: dot4I8Packed vs fma.

Usage::

    python benchmarks/dot4_throughput.py [--iterations 4096] [--groups 2048]

Two kernels of the same shape run on the local adapter (wgpu-py): each invocation keeps 8
independent accumulators and, per iteration, adds to each one `dot4I8Packed(a, b)` (4 multiply-adds
of signed bytes, i32) or `fma(a, b, acc)` (1 multiply-add, f32), its operands changing every
iteration so nothing is hoisted. The printed ratio is multiply-adds per second, int8 / f32, from
the median of 5 timed submissions of each (alternating, after a warm-up), host timed with a
readback of 16 bytes. It says whether an int8 product's inner loop can beat an f32 one on this
adapter (the integer products of kernels/matmul_int8.py): a GPU with a native 4-way byte dot product
(NVIDIA's IDP4A) should give about 2 or more; a CPU renderer lowers dot4I8Packed to byte extracts
and multiplies. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

BODY = {
    "dot4i8": ("i32", 4, "acc{j} += dot4I8Packed(a{j}, b);"),
    "fma": ("f32", 1, "acc{j} = fma(bitcast<f32>(a{j} & 0x3f7fffffu), bitcast<f32>(b & 0x3f7fffffu), acc{j});"),
}


def kernel(kind: str, iterations: int) -> str:
    acc_t, _, line = BODY[kind]
    decl = "\n".join(f"  var acc{j}: {acc_t}; var a{j} = inp[(gid.x + {j}u) & 255u];" for j in range(8))
    body = "\n".join("    " + line.format(j=j) for j in range(8))
    total = " + ".join(f"acc{j}" for j in range(8))
    return f"""
@group(0) @binding(0) var<storage, read_write> out: array<{acc_t}>;
@group(0) @binding(1) var<storage, read> inp: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
{decl}
  var b = inp[gid.x & 255u];
  for (var i = 0u; i < {iterations}u; i++) {{
{body}
    b = b * 1664525u + 1013904223u;
  }}
  out[gid.x] = {total};
}}"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=4096)
    p.add_argument("--groups", type=int, default=2048, help="workgroups of 256 invocations")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync()
    n = args.groups * 256
    inp = device.create_buffer_with_data(
        data=(np.arange(256, dtype=np.uint64) * 2654435761 % (1 << 32)).astype(np.uint32), usage=wgpu.BufferUsage.STORAGE)
    runs = {}
    for kind in BODY:
        module = device.create_shader_module(code=kernel(kind, args.iterations))
        pipe = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        out = device.create_buffer(size=n * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        group = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": out}}, {"binding": 1, "resource": {"buffer": inp}}])
        runs[kind] = (pipe, group, out)

    def run(kind):
        pipe, group, out = runs[kind]
        enc = device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(args.groups)
        cp.end()
        t = time.perf_counter()
        device.queue.submit([enc.finish()])
        device.queue.read_buffer(out, 0, 16)
        return time.perf_counter() - t

    for kind in BODY:
        run(kind)
    times = {kind: [] for kind in BODY}
    for _ in range(args.runs):
        for kind in BODY:
            times[kind].append(run(kind))
    rate = {}
    print(f"adapter: {adapter.info.get('device', '?')} ({adapter.info.get('backend_type', '?')}); "
          f"{n} invocations x {args.iterations} iterations x 8 accumulators")
    for kind, (_, macs, _) in BODY.items():
        t = statistics.median(times[kind])
        rate[kind] = n * args.iterations * 8 * macs / t
        print(f"  {kind:7s} {t * 1e3:9.2f} ms   {rate[kind] / 1e12:7.3f} T multiply-adds/s")
    print(f"  int8 / f32 multiply-adds per second: {rate['dot4i8'] / rate['fma']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
