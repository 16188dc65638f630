"""Where one inference's host-to-host time goes (upload, encode, submit, wait, map).

    python benchmarks/overhead.py BUILD_DIR INPUTS.npz [--runs 50]

All on one build and one adapter, medians of --runs runs after 10 warm-up runs:
- upload, encode+submit, wait (GPU), map+copy: the steps of session.run's one submit,
  timed one by one (they leave out encoding the inputs and decoding the outputs, which
  session.run includes, so they sum to less than it); map+copy is the driver's read_buffer
  (wgpu-native's C API), and on alternate runs "map (wgpu-py)" times wgpu-py's map_sync +
  read_mapped + unmap of the same buffer for comparison;
- session.run: the reference, host to host: with the command buffer encoded in the run, and
  pre-encoded (the default on GPUs: the driver encodes the next run's commands while the GPU
  runs this one's, so a repeated run only submits them);
- pipelined: back-to-back submits with no upload and no readback wait (GPU-bound rate);
- chunks of C: the same build in InferenceSession(BUILD, submit_chunk=C, pre_encode off),
  session.run host to host; its outputs must equal the one-submit outputs to
  1e-4 relative (else the script exits 1).

A/B against an older checkout (docs/perf/h200/overhead-ab.txt): copy this file into that
checkout's benchmarks/ and run it there; it imports the webiree beside it, and encode_submit
below falls back to the driver before pre-encoding.
"""

import sys
import time

import numpy as np

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
import webiree  # noqa: E402
from webiree.hal_webgpu import wgpu_driver  # noqa: E402


def rel_err(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return float("inf")
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)) if ref.size else 0.0


build, inputs = sys.argv[1], sys.argv[2]
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 50
sess = webiree.InferenceSession(build)
feeds = dict(np.load(inputs))
print(f"{build}: {len(sess.module.info['dispatches'])} dispatches; adapter "
      f"{wgpu_driver.adapter_info().get('device', '?')}; medians of {runs} runs after 10 warm-up runs")
for _ in range(10):
    sess.run(None, feeds)
d, it = sess.driver, sess.interp
libf, ffi = wgpu_driver._libf, wgpu_driver._ffi
enc_feeds = {io.name: sess._encode(io, feeds[io.name]) for io in sess.module.inputs}
T = {}
import wgpu  # noqa: E402


def encode_submit():
    """Encode the schedule's commands and submit them (no pre-encoded command buffer)."""
    if hasattr(d, "_encode_raw"):
        d.device.queue.submit([d._encode_raw(it.items)])
    else:  # the driver before pre-encoding (an older checkout, for A/B runs)
        d._submit_raw(d.device.create_command_encoder(), it.items)


for _ in range(runs):
    t = [time.perf_counter()]
    for index, buf, off in it.uploads:
        d.write_buffer(buf, off, enc_feeds[sess.module.inputs[index].name])
    t.append(time.perf_counter())
    encode_submit()
    t.append(time.perf_counter())
    libf.wgpuDevicePoll(d.device._internal, True, ffi.NULL)
    t.append(time.perf_counter())
    size = max(it.readback_size, 4)
    if len(T.get("map+copy", ())) <= len(T.get("map (wgpu-py)", ())):
        step = "map+copy"
        data = d.read_buffer(it.readback, 0, size).value
    else:
        step = "map (wgpu-py)"
        it.readback.map_sync(wgpu.MapMode.READ, 0, size)
        data = bytes(it.readback.read_mapped(0, size))
        it.readback.unmap()
    t.append(time.perf_counter())
    for k, a, b in zip(["upload", "encode+submit", "wait (GPU)", step], t, t[1:]):
        T.setdefault(k, []).append((b - a) * 1e3)
for k, v in T.items():
    print(f"  {k:<14} median {np.median(v):7.3f} ms  min {np.min(v):7.3f} ms")
def run_times(session, warmup: int) -> list:
    """Host-to-host ms of `runs` session.run calls after `warmup` untimed ones."""
    for _ in range(warmup):
        session.run(None, feeds)
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feeds)
        ts.append((time.perf_counter() - t0) * 1e3)
    return ts


for pre in ([False, True] if hasattr(d, "pre_encode") else [None]):
    if pre is not None:
        d.pre_encode = pre
    ts = run_times(sess, 3)
    what = {None: "", False: " (encoded in the run)", True: " (pre-encoded; the default on GPUs)"}[pre]
    print(f"  session.run    median {np.median(ts):7.3f} ms  min {np.min(ts):7.3f} ms{what}")
# back-to-back submits without waiting: GPU throughput bound
t0 = time.perf_counter()
for _ in range(runs):
    encode_submit()
libf.wgpuDevicePoll(d.device._internal, True, ffi.NULL)
print(f"  pipelined      {(time.perf_counter() - t0) / runs * 1e3:7.3f} ms per inference (no readback wait)")
# the same build submitted every C dispatches (InferenceSession(submit_chunk=C), `webiree bench
# --submit-chunk C`): the GPU starts on the first part while the host encodes the rest
ref = sess.run(None, feeds)
n_disp = len(sess.module.info["dispatches"])
for chunk in (16, 64):
    chunked = webiree.InferenceSession(build, submit_chunk=chunk)
    chunked.driver.pre_encode = False  # chunks only matter where the run encodes its commands
    err = max(rel_err(g, r) for g, r in zip(chunked.run(None, feeds), ref))
    if not err <= 1e-4:  # NaN fails too
        sys.exit(f"FAILED: chunks of {chunk}: outputs differ from the one-submit session's by {err:.1e} > 1e-4")
    ts = run_times(chunked, 10)
    chunked.close()
    print(f"  chunks of {chunk:<3d}  median {np.median(ts):7.3f} ms  min {np.min(ts):7.3f} ms "
          f"(session.run, {-(-n_disp // chunk)} submits; outputs = one submit's to {err:.0e})")
