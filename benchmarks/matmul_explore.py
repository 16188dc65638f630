#!/usr/bin/env python
"""Explore tile shapes for a large fp32 matmul outside the compiler: which design reaches how
many TFLOP/s on this adapter.

    python benchmarks/matmul_explore.py [--size 4096] [--runs 10] [--only NAME ...]
        [--wgsl SITE/shaders/000_MatMul_0.wgsl:GX,GY ...]

Each candidate is a hand-parameterized WGSL kernel of one family (the design of
kernels/matmul.py's tiled-shared-vec4: an RM x 4*RN block of outputs per invocation, A and B
tiles of BK values of K copied into workgroup memory, the next step's global loads in
registers while this one computes), varied along the axes the compiler does not yet offer:
K step, double-buffered workgroup memory (one barrier per step instead of two), tile shape,
workgroup shape, and A and B bound read_write as the compiler binds them. The size must be a
multiple of every tile (interior tiles only: no bounds checks, which the compiler's kernel has
and a production kernel would keep for edge tiles only). `--wgsl` adds kernels from files, such
as the compiler's own for the same product (`webiree build` of benchmarks/make_matmul.py's model,
its grid from `webiree inspect`; bindings 0, 1, 2 = A, B, C), timed the same way. Every kernel's
result is checked against numpy on 64 rows (fp64, 1e-4 relative; C filled with NaN before) before
it is timed; a wrong one is reported and not timed.

Timing: `--runs` dispatches of the kernel in one submission, host timed from submit to a 4-byte
readback (which waits for the queue), the median of 3 such submissions after a warm-up of at
least 1 s of dispatches (which raises a GPU's clock); the line prints ms per dispatch and TFLOP/s
(2 * size^3 per dispatch). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import NamedTuple

import numpy as np


class Cand(NamedTuple):
    name: str
    wx: int          # workgroup x: vec4 columns
    wy: int          # workgroup y: rows
    rm: int          # rows per invocation
    rn: int          # vec4 columns per invocation (strided by wx)
    bk: int          # K step
    dbuf: bool       # double-buffered workgroup memory
    rw: bool = False  # A and B bound read_write (as the compiler binds every storage buffer)


CANDIDATES = [
    Cand("base-128x128-k16", 16, 16, 8, 2, 16, False),      # the compiler's choice for 4096^3
    Cand("rw-base-128x128-k16", 16, 16, 8, 2, 16, False, True),
    Cand("rw-128x128-k32", 16, 16, 8, 2, 32, False, True),
    Cand("128x128-k8", 16, 16, 8, 2, 8, False),
    Cand("128x128-k32", 16, 16, 8, 2, 32, False),
    Cand("dbuf-128x128-k8", 16, 16, 8, 2, 8, True),
    Cand("dbuf-128x128-k16", 16, 16, 8, 2, 16, True),
    Cand("128x256-k8", 16, 16, 8, 4, 8, False),
    Cand("dbuf-128x256-k8", 16, 16, 8, 4, 8, True),
    Cand("64x128-k16", 16, 16, 4, 2, 16, False),
    Cand("dbuf-64x128-k16", 16, 16, 4, 2, 16, True),
    Cand("128x128-t128-k16", 16, 8, 16, 2, 16, False),       # 128 invocations, 16 x 8 each
    Cand("dbuf-128x128-t128-k16", 16, 8, 16, 2, 16, True),
    Cand("64x64-t64-k16", 8, 8, 8, 2, 16, False),
    Cand("dbuf-64x64-t64-k16", 8, 8, 8, 2, 16, True),
    Cand("dbuf-128x64-t128-k16", 8, 16, 8, 2, 16, True),
    Cand("dbuf-256x128-k8", 16, 32, 8, 2, 8, True),          # 512 invocations
]


def shared_bytes(c: Cand) -> int:
    tm, tn4 = c.wy * c.rm, c.wx * c.rn
    return (2 if c.dbuf else 1) * 16 * (tm * c.bk // 4 + c.bk * tn4)


def kernel(c: Cand, size: int) -> str:
    M = N = K = size
    K4, N4, BK4 = K // 4, N // 4, c.bk // 4
    tm, tn4 = c.wy * c.rm, c.wx * c.rn
    nt = c.wx * c.wy
    a_words, b_words = tm * BK4, c.bk * tn4           # vec4s per buffer
    a_steps, b_steps = -(-a_words // nt), -(-b_words // nt)
    L = []
    w = L.append
    access = "read_write" if c.rw else "read"
    w(f"@group(0) @binding(0) var<storage, {access}> A: array<vec4<f32>>;")
    w(f"@group(0) @binding(1) var<storage, {access}> B: array<vec4<f32>>;")
    w("@group(0) @binding(2) var<storage, read_write> C: array<vec4<f32>>;")
    nb = 2 if c.dbuf else 1
    w(f"var<workgroup> As: array<vec4<f32>, {nb * a_words}>;")
    w(f"var<workgroup> Bs: array<vec4<f32>, {nb * b_words}>;")
    w(f"@compute @workgroup_size({c.wx}, {c.wy})")
    w("fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,"
      " @builtin(local_invocation_index) li: u32) {")
    w(f"  let m0 = wid.y * {tm}u; let n04 = wid.x * {tn4}u; let tx = lid.x; let ty = lid.y;")
    for i in range(c.rm):
        for j in range(c.rn):
            w(f"  var acc{i}_{j} = vec4<f32>(0.0);")
    # the invocation's share of each tile copy: (register, global index at k0, shared index)
    copies = []
    for s in range(a_steps):
        idx = f"(li + {s * nt}u)"
        guard = (s + 1) * nt > a_words
        copies.append((f"pa{s}", f"A[(m0 + {idx} / {BK4}u) * {K4}u + k0 / 4u + {idx} % {BK4}u]", f"{idx}", "As", a_words, guard))
    for s in range(b_steps):
        idx = f"(li + {s * nt}u)"
        guard = (s + 1) * nt > b_words
        copies.append((f"pb{s}", f"B[(k0 + {idx} / {tn4}u) * {N4}u + n04 + {idx} % {tn4}u]", f"{idx}", "Bs", b_words, guard))
    w("  var k0 = 0u;")
    for reg, src, idx, arr, words, guard in copies:
        cond = f"select(0u, {idx}, {idx} < {words}u)" if guard else idx
        w(f"  var {reg} = {src.replace(idx, cond)};")
    w(f"  for (var step = 0u; step < {K // c.bk}u; step++) {{")
    w(f"    k0 = step * {c.bk}u;")
    base_a = f"(step & 1u) * {a_words}u + " if c.dbuf else ""
    base_b = f"(step & 1u) * {b_words}u + " if c.dbuf else ""
    for reg, src, idx, arr, words, guard in copies:
        base = base_a if arr == "As" else base_b
        st = f"{arr}[{base}{idx}] = {reg};"
        w(f"    if ({idx} < {words}u) {{ {st} }}" if guard else f"    {st}")
    w("    workgroupBarrier();")
    w(f"    k0 = min(k0 + {c.bk}u, {K - c.bk}u);")
    for reg, src, idx, arr, words, guard in copies:
        cond = f"select(0u, {idx}, {idx} < {words}u)" if guard else idx
        w(f"    {reg} = {src.replace(idx, cond)};")
    for kk4 in range(BK4):
        for i in range(c.rm):
            w(f"    let a{kk4}_{i} = As[{base_a}(ty * {c.rm}u + {i}u) * {BK4}u + {kk4}u];")
        for q in range(4):
            for j in range(c.rn):
                w(f"    let b{kk4}_{q}_{j} = Bs[{base_b}{kk4 * 4 + q}u * {tn4}u + tx + {j * c.wx}u];")
            for i in range(c.rm):
                for j in range(c.rn):
                    w(f"    acc{i}_{j} = fma(vec4<f32>(a{kk4}_{i}[{q}]), b{kk4}_{q}_{j}, acc{i}_{j});")
    if not c.dbuf:
        w("    workgroupBarrier();")
    w("  }")
    for i in range(c.rm):
        for j in range(c.rn):
            w(f"  C[(m0 + ty * {c.rm}u + {i}u) * {N4}u + n04 + tx + {j * c.wx}u] = acc{i}_{j};")
    w("}")
    return "\n".join(L)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--only", nargs="*", default=None)
    p.add_argument("--wgsl", nargs="*", default=[], metavar="FILE:GX,GY",
                   help="also time these kernels (bindings 0, 1, 2 = A, B, C; grid GX x GY)")
    args = p.parse_args(argv)
    import wgpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    limit = adapter.limits["max-compute-workgroup-storage-size"]
    device = adapter.request_device_sync(required_limits={
        "max-compute-workgroup-storage-size": limit,
        "max-compute-invocations-per-workgroup": adapter.limits["max-compute-invocations-per-workgroup"],
        "max-storage-buffer-binding-size": adapter.limits["max-storage-buffer-binding-size"],
        "max-buffer-size": adapter.limits["max-buffer-size"]})
    info = adapter.info
    print(f"adapter: {info.get('device', '?')} ({info.get('backend_type', '?')}), workgroup storage {limit} B")
    n = args.size
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = (rng.standard_normal((n, n), dtype=np.float32) / np.sqrt(n)).astype(np.float32)
    ref = a[:64].astype(np.float64) @ b.astype(np.float64)
    U = wgpu.BufferUsage
    ba = device.create_buffer_with_data(data=a, usage=U.STORAGE)
    bb = device.create_buffer_with_data(data=b, usage=U.STORAGE)
    bc = device.create_buffer(size=n * n * 4, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    flop = 2.0 * n ** 3
    jobs = []
    for c in CANDIDATES:
        if args.only and c.name not in args.only:
            continue
        tm, tn = c.wy * c.rm, c.wx * c.rn * 4
        if n % tm or n % tn or n % c.bk or shared_bytes(c) > limit or c.wx * c.wy > adapter.limits["max-compute-invocations-per-workgroup"]:
            print(f"{c.name:26s} does not fit (tile {tm}x{tn}, {shared_bytes(c)} B of workgroup memory)")
            continue
        jobs.append((c.name, kernel(c, n), (n // tn, n // tm, 1),
                     f"tile {tm:3d}x{tn:3d} k{c.bk:2d} {'dbuf' if c.dbuf else '    '} {c.wx * c.wy:4d} inv  {shared_bytes(c):6d} B"))
    for spec in args.wgsl:
        path, _, grid = spec.partition(":")
        gx, gy = (int(v) for v in grid.split(","))
        jobs.append((path.rsplit("/", 1)[-1], open(path).read(), (gx, gy, 1), f"grid {gx}x{gy}".ljust(42)))
    for name, code, groups, desc in jobs:
        try:
            module = device.create_shader_module(code=code)
            pipe = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        except Exception as e:
            print(f"{name:26s} failed to build: {str(e).splitlines()[0][:200]}")
            continue
        bg = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": buf}} for i, buf in enumerate((ba, bb, bc))])

        def run(k):
            enc = device.create_command_encoder()
            cp = enc.begin_compute_pass()
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, bg)
            for _ in range(k):
                cp.dispatch_workgroups(*groups)
            cp.end()
            t0 = time.perf_counter()
            device.queue.submit([enc.finish()])
            device.queue.read_buffer(bc, 0, 4)   # waits for the queue
            return time.perf_counter() - t0

        device.queue.write_buffer(bc, 0, np.full(64 * n, np.nan, np.float32))   # no earlier candidate's result
        run(1)
        got = np.frombuffer(device.queue.read_buffer(bc, 0, 64 * n * 4), np.float32).reshape(64, n)
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        if not err <= 1e-4:
            print(f"{name:26s} WRONG (rel. error {err:.2e})")
            continue
        t_end = time.perf_counter() + 1.0
        while time.perf_counter() < t_end:
            run(3)
        times = [run(args.runs) / args.runs for _ in range(3)]
        t = statistics.median(times)
        print(f"{name:26s} {desc}  {t * 1e3:8.3f} ms  {flop / t / 1e12:6.2f} TFLOP/s  "
              f"(err {err:.1e})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
