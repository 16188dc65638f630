"""Time every matmul kernel variant the config can choose, on this machine's adapter.

    python benchmarks/matmul_variants.py [M,K,N ...] [--runs 20] [--chain R] [--limits default]

For each problem shape it builds a one-MatMul model with the heuristic's own choice
(the reference) and once per candidate KernelConfig (overriding `config.choose`), checks
every result against numpy (fp64) to 1e-4 relative, warms each up (at least 3 runs and
1 s, as `webiree bench` does), and prints the median time, GFLOP/s and the ratio to the
heuristic's time measured in the same run; the candidate equal to the heuristic's choice
is marked '*'. Each line says what its time is: 'GPU' (timestamp queries around the one
dispatch, in its own pass) or 'host' (perf_counter around a whole run, inputs on the host
to outputs on the host: where the adapter has no timestamp queries, and with --chain).
Exits 1 if any variant is WRONG. This is the measurement a tuning table is made from.

One dispatch timed alone (its own pass between timestamps) can mislead for small products,
whose time is mostly latency. `--chain R` times instead a model of R pairs of products,
[M,K] x [K,N] then [M,N] x [N,K] (a transformer's FFN), as one submit, host time per pair.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, __file__.rsplit("/benchmarks/", 1)[0])
import webiree  # noqa: E402
from webiree.hal_webgpu.wgpu_driver import hold_clocks  # noqa: E402
from webiree.ir import program as P  # noqa: E402
from webiree.wgsl_codegen import config as C  # noqa: E402
from webiree.testing.models import make_model  # noqa: E402
from webiree.wgsl_codegen.tuning import matmul_candidates  # noqa: E402

TOLERANCE = 1e-4  # max |y - ref| / max |ref|, ref in fp64


def warm_up(fn, runs: int = 3, seconds: float = 1.0):
    """At least `runs` calls and `seconds` of calls (GPUs raise their clocks only under load)."""
    t_end = time.perf_counter() + seconds
    n = 0
    while n < runs or time.perf_counter() < t_end:
        fn()
        n += 1


def time_config(m, k, n, cfg, limits, runs, tmp, chain=0):
    """(median seconds, rel. error, the config the build used, 'GPU' or 'host') of `cfg`
    (None: the heuristic's choice)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    if chain:
        w2 = (rng.standard_normal((n, k)) / np.sqrt(n)).astype(np.float32)
        nodes, x = [], "a"
        for i in range(chain):
            nodes += [helper.make_node("MatMul", [x, "w"], [f"h{i}"]), helper.make_node("MatMul", [f"h{i}", "w2"], [f"x{i}"])]
            x = f"x{i}"
        nodes.append(helper.make_node("Identity", [x], ["y"]))
        model = make_model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, k])], {"w": w, "w2": w2}, name="mm")
    else:
        model = make_model([helper.make_node("MatMul", ["a", "w"], ["y"])],
                           [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], {"w": w}, name="mm")
    original = C.choose
    chosen = original
    if cfg is not None:
        C.choose = lambda op, prog, lim: cfg if isinstance(op, P.MatMul) else original(op, prog, lim)  # noqa: E731
    try:
        res = webiree.compile(model, tmp, limits=limits)
    finally:
        C.choose = chosen
    sess = webiree.InferenceSession(tmp)
    y = sess.run(None, {"a": a})[0]
    ref = a.astype(np.float64)
    for _ in range(max(chain, 1)):
        ref = ref @ w
        if chain:
            ref = ref @ w2
    err = float(np.abs(y - ref).max() / np.abs(ref).max())
    used = res.module.info["dispatches"][0]["config"]
    times = []
    if chain:
        warm_up(lambda: sess.run(None, {"a": a}))
        for _ in range(runs):
            t0 = time.perf_counter()
            sess.run(None, {"a": a})
            times.append((time.perf_counter() - t0) / chain)
        return float(np.median(times)), err, used, "host"
    warm_up(lambda: sess.run(None, {"a": a}, profile=True))
    hold_clocks(1.0)    # a large product behind its upload leaves a GPU at its idle clock
    clocks = set()
    for _ in range(runs):
        hold_clocks(0.1)    # and kept up
        t0 = time.perf_counter()
        sess.run(None, {"a": a}, profile=True)
        host = time.perf_counter() - t0
        prof = sess.last_profile
        times.append(prof[0] / 1e9 if prof else host)
        clocks.add("GPU" if prof else "host")
    return float(np.median(times)), err, used, "/".join(sorted(clocks))


def main(argv):
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", help="M,K,N")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--chain", type=int, default=0)
    ap.add_argument("--limits", default="adapter", help="'default' tries the GPU variants on any adapter")
    args = ap.parse_args(argv)
    runs, chain, which = args.runs, args.chain, args.limits
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] or [
        (4096, 4096, 4096), (128, 512, 128), (128, 384, 1536), (3136, 144, 24)]
    from webiree.bundler.site import resolve_target
    limits = resolve_target(which).as_limits()
    print(f"adapter class {limits.get('device_class')}, subgroup size {limits.get('subgroup_size', 0)}")
    wrong = []
    with tempfile.TemporaryDirectory() as tmp:
        for m, k, n in shapes:
            flops = 2.0 * m * k * n * (2 if chain else 1)

            def line(mark, name, tile, t, err, clock, ref_t):
                ok = "ok" if err <= TOLERANCE else f"WRONG {err:.1e}"  # NaN is WRONG too
                if not err <= TOLERANCE:
                    wrong.append(f"M={m} K={k} N={n} {name} {tile}")
                print(f"  {mark} {name:28s} {tile:12s} {t * 1e3:9.3f} ms {clock:4s} {flops / t / 1e9:9.1f} GFLOP/s "
                      f"{t / ref_t:6.2f}x heuristic  {ok}")

            what = f"{chain} pairs as one submit, host time per pair" if chain else "one dispatch"
            h_t, h_err, heuristic, h_clock = time_config(m, k, n, None, limits, runs, Path(tmp) / "h", chain)
            print(f"M={m} K={k} N={n} ({what}; median of {runs} runs after warm-up; limits {which}):")
            line("h", f"heuristic: {heuristic['strategy']}", str(tuple(heuristic["tile"])), h_t, h_err, h_clock, h_t)
            for cfg in matmul_candidates(m, k, n, limits):   # the candidates `webiree tune` times
                try:
                    t, err, used, clock = time_config(m, k, n, cfg, limits, runs, Path(tmp) / "b", chain)
                except Exception as e:  # noqa: BLE001  (a variant that does not apply is reported)
                    print(f"    {cfg.strategy.value:20s} {str(tuple(cfg.tile)):12s} not built: {str(e).splitlines()[0][:100]}")
                    continue
                mark = "*" if (used["strategy"], list(used["tile"])) == (heuristic["strategy"], list(heuristic["tile"])) else " "
                name = f"{cfg.strategy.value} {'x'.join(map(str, cfg.workgroup_size))}"
                line(mark, name, str(tuple(cfg.tile)), t, err, clock, h_t)
    if wrong:
        print(f"FAILED: {len(wrong)} result(s) differ from numpy by more than {TOLERANCE:.0e}: {wrong}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
