"""`webiree bench`: latency of webiree against onnxruntime (and IREE) in one run.

Measures median host-to-host latency (inputs on the host -> outputs on the
host, warm-up excluded) of:

- webiree native (wgpu-py on the local WebGPU adapter),
- onnxruntime CPU (the reference; every output is checked against it),
- with `dynamic` (`--dynamic seq=1..512`): the same model built once for a range of sizes
  (issue #16), run at the pinned build's shape: the cost of reading sizes at run time,
- IREE, when `iree-base-compiler` and `iree-base-runtime` are installed
  (`pip install -e .[iree]`): `vulkan-spirv` on the same Vulkan device, and
  `llvm-cpu`.

Prints ratios, achieved GFLOP/s of the matmul and conv dispatches (GPU
timestamps), and GPU memory (weights + arena vs. weights + largest live set).
A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


# seconds of GPU work before a profiled run (hold_clocks): on the H200 the SM clock fell to 345 MHz
# within 2 s of idling; after 1 s of the spin a profiled 4096^3 product ran at 1,980 MHz's speed
HOLD_S = 1.0


def _median_ms(fn, runs: int, warmup: int, warm_seconds: float = 1.0) -> tuple[float, list]:
    """Median wall time of `fn` after `warmup` calls and at least `warm_seconds` of calls
    (GPUs raise their clocks only under sustained load). Host to host: where the runs keep the GPU
    busy only a small part of the time (a 4096^3 product behind its 64 MB upload and readback),
    the GPU runs them at its idle clock, as it would for a user; the profiled run's per-dispatch
    times are taken at a busy GPU's clock instead (bench, hold_clocks)."""
    out = None
    t_end = time.perf_counter() + warm_seconds
    n = 0
    while n < warmup or time.perf_counter() < t_end:
        out = fn()
        n += 1
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def alternating_medians(sessions, feeds, runs: int, warmup: int, block: int = 10) -> list[float]:
    """Median ms of each session, run in alternating turns of `block` runs (each turn after its own
    warm-up runs): the same adapter, feeds and moment, so clock and load drift hit all alike (a
    turn per run would measure the switch between them)."""
    times = [[] for _ in sessions]
    for _ in range(max(1, runs // block)):
        for s, t in zip(sessions, times):
            for i in range(warmup + block):
                t0 = time.perf_counter()
                s.run(None, feeds)
                if i >= warmup:
                    t.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(t) for t in times]


def _max_rel_err(outs, refs) -> float:
    """The worst output's error; inf when the output counts differ (a result that cannot be right)."""
    outs, refs = list(outs), list(refs)
    if len(outs) != len(refs):
        return float("inf")
    return max((_rel_err(g, r) for g, r in zip(outs, refs)), default=0.0)


FP32_TOL = 1e-4
F16_TOL = 4 * 2.0 ** -10       # four float16 steps of the output's scale


def wrong_results(report: dict) -> list[str]:
    """Names of webiree's results above the model's tolerance (report["tolerance"]; NaN too)."""
    tol = report.get("tolerance", FP32_TOL)
    return [name for name, v in report["results"].items()
            if name.startswith("webiree") and "error" not in v and not v["rel_err"] <= tol]


def model_tolerance(model, model_path, feeds, ref) -> tuple[float, str]:
    """(tolerance, why) for comparing with onnxruntime: the fp32 tolerance; four float16 steps for a
    model holding float16 values (each op rounds its result; onnxruntime rounds elsewhere); and no
    tighter than 4x the model's own noise, onnxruntime's result with its graph optimizations off vs
    on (a quantized model's rounding boundaries move with the order of operations)."""
    import onnxruntime as ort
    from onnx import TensorProto

    f16 = any(t.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16) for t in model.graph.initializer) or any(
        v.type.tensor_type.elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16)
        for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    noise = _max_rel_err(plain, ref)
    tol, why = (F16_TOL, "float16 values") if f16 else (FP32_TOL, "float32")
    if 4 * noise > tol:
        tol, why = 4 * noise, f"4x onnxruntime's own optimizations-off/on difference {noise:.1e}"
    return tol, why


def _rel_err(got, ref) -> float:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return float("inf")
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-30)
    return float(np.abs(got - ref).max() / scale) if ref.size else 0.0


def _feeds(module, inputs_path, seed: int = 0):
    """The .npz's arrays, or seeded inputs of the built module's input shapes and types."""
    if inputs_path:
        return dict(np.load(inputs_path))
    from onnx import helper
    rng = np.random.default_rng(seed)
    feeds = {}
    for io in module.inputs:
        dt = helper.tensor_dtype_to_np_dtype(io.onnx_type)
        shape = tuple(io.shape)
        feeds[io.name] = (rng.standard_normal(shape).astype(dt) if dt.kind == "f" else
                          rng.integers(0, 2, shape).astype(bool) if dt == np.bool_ else
                          rng.integers(0, 2, shape).astype(dt))     # valid ids, masks and token types alike
    return feeds


def _aligned(a: np.ndarray, alignment: int = 4096) -> np.ndarray:
    """A copy of `a` whose data starts on `alignment` (IREE's Vulkan driver imports host memory)."""
    raw = np.empty(a.nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


class _NoHostImport:
    """IREE 3.13's DeviceArray.to_host imports a numpy array as a Vulkan host allocation when
    the driver says it can; lavapipe then refuses it (pointer and size must be 4096-aligned).
    With IMPORTABLE masked out, to_host takes IREE's own staging-buffer path. IREE only."""
    IMPORTABLE = 0


def _check_run(args):
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode:
        lines = [ln for ln in p.stderr.splitlines() if "error" in ln.lower()] or p.stderr.splitlines() or ["?"]
        raise RuntimeError(f"{Path(args[0]).name} failed: {lines[0][:240]}")


def _iree_run(onnx_path: Path, feeds: dict, backend: str, workdir: Path, runs: int, warmup: int,
              vulkan_target: str | None = None):
    """(median ms, outputs) of IREE on `backend` ('vulkan-spirv' or 'llvm-cpu')."""
    import iree.runtime as rt
    from iree.runtime import array_interop

    array_interop.BufferCompatibility = _NoHostImport
    bindir = Path(sys.executable).parent
    mlir = workdir / "model.mlir"
    if not mlir.exists():
        _check_run([str(bindir / "iree-import-onnx"), str(onnx_path), "-o", str(mlir)])
    vmfb = workdir / f"model_{backend}.vmfb"
    args = [str(bindir / "iree-compile"), str(mlir), f"--iree-hal-target-backends={backend}", "-o", str(vmfb)]
    if backend == "llvm-cpu":
        args.append("--iree-llvmcpu-target-cpu=host")
    elif vulkan_target:
        args.append(f"--iree-vulkan-target={vulkan_target}")
    _check_run(args)
    config = rt.Config("vulkan" if backend == "vulkan-spirv" else "local-task")
    ctx = rt.SystemContext(config=config)
    ctx.add_vm_module(rt.VmModule.mmap(ctx.instance, str(vmfb)))  # page-aligned: Vulkan imports it
    fn = ctx.modules.module["main_graph"]
    args_in = [_aligned(v) for v in feeds.values()]

    device = config.device

    def call():  # host -> device upload inside the timed call, like the others
        res = fn(*[rt.asdevicearray(device, a) for a in args_in])
        res = res if isinstance(res, (list, tuple)) else [res]
        return [np.asarray(r.to_host()) for r in res]
    return _median_ms(call, runs, warmup)


def bench(model_path, runs: int = 20, warmup: int = 3, limits: str = "adapter", inputs_path=None,
          iree: bool = False, input_shapes=None, json_out=None, log=print, iree_vulkan_target=None,
          spirv: bool = False, submit_chunk: int = 0, trace_out=None, dims=None, dynamic=None) -> dict:
    import onnx
    import onnxruntime as ort

    from .bundler.site import compile as build
    from .hal_webgpu.wgpu_driver import adapter_info, hold_clocks
    from .session import InferenceSession

    model_path = Path(model_path)
    report = {"model": model_path.name, "adapter": adapter_info(), "runs": runs, "warmup": warmup,
              "limits": limits, "iree_vulkan_target": iree_vulkan_target or "IREE's default", "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        build(model_path, tmp / "site", input_shapes, limits=limits, dims=dims)
        report["build_s"] = time.perf_counter() - t0
        sess = InferenceSession(tmp / "site")
        feeds = _feeds(sess.module, inputs_path)
        report["default_submit_chunk"] = sess.driver.submit_chunk    # chosen by the adapter's type
        report["pre_encode"] = sess.driver.pre_encode                 # likewise
        report["variant"] = sess.variant      # the kernel variant the adapter picked ("": the build has one)
        wi_ms, wi_out = _median_ms(lambda: sess.run(None, feeds), runs, warmup)

        so = ort.SessionOptions()
        so.log_severity_level = 3
        ref_sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
        ort_ms, ref = _median_ms(lambda: ref_sess.run(None, feeds), runs, warmup)
        report["results"]["onnxruntime-cpu"] = {"median_ms": ort_ms, "rel_err": 0.0}
        report["tolerance"], report["tolerance_why"] = model_tolerance(onnx.load(str(model_path), load_external_data=False),
                                                                       model_path, feeds, ref)
        report["results"]["webiree"] = {"median_ms": wi_ms,
                                        "rel_err": _max_rel_err(wi_out, ref)}
        if dynamic:   # one build for every size in the ranges, run at this build's shape
            build(model_path, tmp / "site-dynamic", input_shapes, limits=limits, dims={**(dims or {}), **dynamic})
            dyn = InferenceSession(tmp / "site-dynamic")
            ms, out = _median_ms(lambda: dyn.run(None, feeds), runs, warmup)
            ranges = ", ".join(f"{n} {lo}..{hi}" for n, lo, hi in dyn.module.symbols)
            report["results"]["webiree-dynamic"] = {"median_ms": ms, "rel_err": _max_rel_err(out, ref),
                                                    "ranges": ranges}
            report["dynamic_executables"] = [len(sess.module.executables), len(dyn.module.executables)]
            dyn.close()
        if submit_chunk:   # the same build, submitted every `submit_chunk` dispatches as each run encodes them
            chunked = InferenceSession(tmp / "site", submit_chunk=submit_chunk, pre_encode=False)
            ms, out = _median_ms(lambda: chunked.run(None, feeds), runs, warmup)
            report["results"][f"webiree-chunks-of-{submit_chunk}"] = {
                "median_ms": ms, "rel_err": _max_rel_err(out, ref)}
            chunked.close()
        if spirv:   # the same kernels as SPIR-V executables (wgsl_codegen/spirv.py)
            try:
                t0 = time.perf_counter()
                build(model_path, tmp / "site-spirv", input_shapes, limits=limits, targets="spirv", dims=dims)
                spirv_build_s = time.perf_counter() - t0
                spv_sess = InferenceSession(tmp / "site-spirv")
                ms, out = _median_ms(lambda: spv_sess.run(None, feeds), runs, warmup)
                report["results"]["webiree-spirv"] = {"median_ms": ms, "build_s": spirv_build_s,
                                                      "rel_err": _max_rel_err(out, ref)}
                del spv_sess
            except Exception as e:  # noqa: BLE001  (reported, like IREE's)
                report["results"]["webiree-spirv"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        if iree:
            for backend in ("vulkan-spirv", "llvm-cpu"):
                try:
                    ms, out = _iree_run(model_path, feeds, backend, tmp, runs, warmup, iree_vulkan_target)
                    report["results"][f"iree-{backend}"] = {
                        "median_ms": ms, "rel_err": _max_rel_err(out, ref)}
                except Exception as e:  # IREE is optional: report why it did not run
                    report["results"][f"iree-{backend}"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}

        # per-dispatch GPU time, where the adapter has timestamp queries, at a busy GPU's clocks
        hold_clocks(HOLD_S)
        sess.run(None, feeds, profile=True)
        times = sess.last_profile
        if trace_out:
            if sess.last_trace is None:
                log("  no trace written: the adapter has no timestamp queries")
            else:
                Path(trace_out).write_text(json.dumps(sess.last_trace, indent=1) + "\n")
                log(f"  trace of {len(times)} dispatches written to {trace_out} (open it in Perfetto or chrome://tracing)")
        info = sess.module.info["dispatches"]
        kinds = {}
        if times:
            for t, d in zip(times, info):
                k = kinds.setdefault(d["kind"], {"ms": 0.0, "flops": 0, "count": 0})
                k["ms"] += t / 1e6
                k["flops"] += d.get("flops", 0)
                k["count"] += 1
            report["gpu_ms_total"] = sum(times) / 1e6
            report["top_dispatches"] = [
                {"name": d["name"], "kind": d["kind"], "ms": t / 1e6,
                 "gflops": (d.get("flops", 0) / (t / 1e9) / 1e9) if t and d.get("flops") else None}
                for t, d in sorted(zip(times, info), key=lambda x: -x[0])[:5]]
        report["kinds"] = kinds
        mem = sess.module.info["memory"]
        report["memory"] = {"weights": mem["weights"], "arena": mem["arena_peak"], "max_live": mem["max_live"],
                            "ratio": (mem["weights"] + mem["arena_peak"]) / max(mem["weights"] + mem["max_live"], 1)}
        report["dispatches"] = len(info)
        del sess
    _print(report, log)
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def _submission(chunk: int, pre_encode: bool = False) -> str:
    return ((f"every {chunk} dispatches" if chunk else "one submit per inference")
            + (", a repeated run's commands encoded during the run before" if pre_encode else ""))


def _print(r: dict, log):
    a = r["adapter"]
    log(f"model {r['model']}: {r['dispatches']} dispatches, built in {r['build_s']:.1f} s; "
        f"adapter {a.get('device', '?')} ({a.get('backend_type', '?')}); webiree limits {r['limits']}"
        + (f" (kernel variant {r['variant']}, picked by the adapter)" if r.get("variant") else "")
        + (f", IREE vulkan target {r['iree_vulkan_target']}" if any(k.startswith("iree") for k in r["results"]) else "")
        + f"; default submission: {_submission(r.get('default_submit_chunk', 0), r.get('pre_encode', False))}; median of {r['runs']} runs")
    if "webiree-dynamic" in r["results"]:
        pinned, dyn = r["dynamic_executables"]
        log(f"  webiree-dynamic: one build for {r['results']['webiree-dynamic']['ranges']} run at the pinned "
            f"build's shape ({dyn} executables vs. {pinned} pinned)")
    log(f"  tolerance {r.get('tolerance', FP32_TOL):.1e} of each output's scale ({r.get('tolerance_why', 'float32')})")
    base = r["results"]["webiree"]["median_ms"]
    for name, v in r["results"].items():
        if "error" in v:
            log(f"  {name:<22} not run: {v['error']}")
            continue
        ok = "ok" if v["rel_err"] <= r.get("tolerance", FP32_TOL) else "WRONG"  # NaN compares False: WRONG too
        log(f"  {name:<22} {v['median_ms']:10.2f} ms   {v['median_ms'] / base:6.2f}x webiree   "
            f"rel.err {v['rel_err']:.1e} {ok}")
    for kind, k in sorted(r.get("kinds", {}).items(), key=lambda x: -x[1]["ms"]):
        g = f"{k['flops'] / (k['ms'] / 1e3) / 1e9:8.1f} GFLOP/s" if k["flops"] and k["ms"] else ""
        log(f"  gpu {kind:<10} {k['count']:4d} dispatches {k['ms']:9.2f} ms {g}")
    m = r["memory"]
    log(f"  memory: weights {m['weights']} B + arena {m['arena']} B = {(m['ratio']):.3f} x "
        f"(weights + largest live set {m['max_live']} B)")
