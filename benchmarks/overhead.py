"""Where one inference's host-to-host time goes (upload, encode, submit, wait, map, decode).

    python benchmarks/overhead.py BUILD_DIR INPUTS.npz [--runs 50]
"""

import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
import webiree  # noqa: E402
from webiree.hal_webgpu import wgpu_driver  # noqa: E402

build, inputs = sys.argv[1], sys.argv[2]
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 50
sess = webiree.InferenceSession(build)
feeds = dict(np.load(inputs))
for _ in range(10):
    sess.run(None, feeds)
d, it = sess.driver, sess.interp
libf, ffi = wgpu_driver._libf, wgpu_driver._ffi
enc_feeds = {io.name: sess._encode(io, feeds[io.name]) for io in sess.module.inputs}
T = {}
import wgpu  # noqa: E402
for _ in range(runs):
    t = [time.perf_counter()]
    for index, buf, off in it.uploads:
        d.write_buffer(buf, off, enc_feeds[sess.module.inputs[index].name])
    t.append(time.perf_counter())
    enc = d.device.create_command_encoder()
    d._submit_raw(enc, it.items)
    t.append(time.perf_counter())
    libf.wgpuDevicePoll(d.device._internal, True, ffi.NULL)
    t.append(time.perf_counter())
    it.readback.map_sync(wgpu.MapMode.READ, 0, max(it.readback_size, 4))
    data = bytes(it.readback.read_mapped(0, max(it.readback_size, 4)))
    it.readback.unmap()
    t.append(time.perf_counter())
    for k, a, b in zip(["upload", "encode+submit", "wait (GPU)", "map+copy"], t, t[1:]):
        T.setdefault(k, []).append((b - a) * 1e3)
for k, v in T.items():
    print(f"  {k:<14} median {np.median(v):7.3f} ms  min {np.min(v):7.3f} ms")
ts = []
for _ in range(runs):
    t0 = time.perf_counter()
    sess.run(None, feeds)
    ts.append((time.perf_counter() - t0) * 1e3)
print(f"  session.run    median {np.median(ts):7.3f} ms  min {np.min(ts):7.3f} ms")
# back-to-back submits without waiting: GPU throughput bound
t0 = time.perf_counter()
for _ in range(runs):
    enc = d.device.create_command_encoder()
    d._submit_raw(enc, it.items)
libf.wgpuDevicePoll(d.device._internal, True, ffi.NULL)
print(f"  pipelined      {(time.perf_counter() - t0) / runs * 1e3:7.3f} ms per inference (no readback wait)")
# the same inference submitted in chunks of C dispatches: the GPU starts on the first chunk while
# the host encodes the next (an experiment: sessions submit once per inference)
for chunk in (16, 64):
    parts = [it.items[i:i + chunk] for i in range(0, len(it.items), chunk)]
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for index, buf, off in it.uploads:
            d.write_buffer(buf, off, enc_feeds[sess.module.inputs[index].name])
        for p in parts:
            d._submit_raw(d.device.create_command_encoder(), p)
        libf.wgpuDevicePoll(d.device._internal, True, ffi.NULL)
        it.readback.map_sync(wgpu.MapMode.READ, 0, max(it.readback_size, 4))
        data = bytes(it.readback.read_mapped(0, max(it.readback_size, 4)))
        it.readback.unmap()
        ts.append((time.perf_counter() - t0) * 1e3)
    print(f"  chunks of {chunk:<3d}  median {np.median(ts):7.3f} ms  min {np.min(ts):7.3f} ms (host to host, {len(parts)} submits)")
