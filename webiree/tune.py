"""`webiree tune MODEL --out TABLE`: measure each dispatch's candidate kernels on this machine's
adapter and write the fastest per problem shape (issue #20 item 3; the table's format and how a
build uses it: wgsl_codegen/tuning.py).

How it measures. The model goes through the front of the compiler once; its kernels are built
once per *round* (compiler/driver.py kernel_rounds), and round r gives every dispatch its r-th
candidate (`tuning.candidates`: round 0 is the heuristic's choice, and a dispatch with fewer
candidates keeps it). Each round's site runs natively: its outputs must match round 0's within
the model's tolerance, then `runs` profiled runs (after `warmup`) give every dispatch's GPU time
from timestamp queries, so the dispatches of one round are timed side by side without disturbing
each other. A round whose outputs are wrong is split in halves until the candidates that broke it
are found; they are reported and left out (a kernel bug to fix, never a table entry). Dispatches
that share a problem key (a BERT's layers) add their times; the table keeps each key's fastest
configuration, the heuristic's time beside it and every candidate's.

Last, the model is built with the new table and without, and both run in alternating turns: the
printed ratio is the whole model's host-to-host median, tuned over heuristic, same adapter, same
feeds, same run.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from .errors import DeviceError, WebireeError
from .wgsl_codegen.tuning import FORMAT, Table, candidates, problem_key


WARM_SECONDS = 1.0     # busy time before a round is timed (as `webiree bench` warms up)


class _Round:
    """A stand-in tuning table: op name -> the configuration this round gives it."""

    def __init__(self, configs: dict):
        self.configs, self.source = configs, "tune round"

    def config_for(self, op, limits):
        cfg = self.configs.get(op.name)
        return (cfg, "used") if cfg is not None else (None, "absent")

    def describe(self) -> str:
        return "tune round"


def tune(model_path, out_path, input_shapes=None, runs: int = 10, warmup: int = 2, limits="adapter",
         inputs_path=None, dims=None, log=print, warm_seconds: float = WARM_SECONDS) -> dict:
    """Time the candidates, write the table to `out_path`, return it (see the module docstring)."""
    import onnx
    from .bench import HOLD_S, _feeds, _max_rel_err, alternating_medians, model_tolerance
    from .bundler.site import resolve_target
    from .compiler.driver import kernel_rounds
    from .hal_webgpu.wgpu_driver import adapter_info, hold_clocks
    from .session import InferenceSession

    model_path = Path(model_path)
    target = resolve_target(limits)
    lim = target.as_limits()
    prog, build = kernel_rounds(model_path, input_shapes, target, dims=dims)
    cands = {op.name: candidates(op, prog, lim) for op in prog.ops}
    keys = {op.name: problem_key(op) for op in prog.ops}
    tuned_ops = [op.name for op in prog.ops if len(cands[op.name]) > 1]
    rounds = max((len(cands[n]) for n in tuned_ops), default=1)
    log(f"webiree tune: {model_path.name} on {adapter_info().get('device', '?')}: {len(prog.ops)} dispatches, "
        f"{len(tuned_ops)} with candidates ({len({keys[n] for n in tuned_ops})} problem shapes), {rounds} rounds")
    times: dict = {n: {} for n in tuned_ops}      # op -> candidate index -> ms
    wrong: list = []
    state = {"ref": None, "tol": None, "feeds": None}

    def session(tuning):
        res = build(tuning)
        return InferenceSession.from_module(res.module, res.weights)

    def measure(configs: dict) -> tuple[bool, dict]:
        """Build with `configs` (op -> candidate index), check, time: (right, op -> ms)."""
        sess = session(_Round({n: cands[n][i] for n, i in configs.items()}))
        try:
            if state["feeds"] is None:
                state["feeds"] = _feeds(sess.module, inputs_path)
            outs = sess.run(None, state["feeds"])
            if state["ref"] is None:     # the heuristic's build: the reference, the tolerance
                state["ref"] = outs
                state["tol"] = model_tolerance(onnx.load(str(model_path), load_external_data=False),
                                               model_path, state["feeds"], outs)[0]
            if not _max_rel_err(outs, state["ref"]) <= state["tol"]:
                return False, {}
            # at least `warmup` runs and WARM_SECONDS of them: a GPU left idle while the round's
            # kernels were built runs at a lowered clock until it has been busy a while; without this the
            # first round, the heuristic's, was timed on the H200 at up to 5x its warm time
            t_end, n = time.perf_counter() + warm_seconds, 0
            while n < warmup or time.perf_counter() < t_end:
                sess.run(None, state["feeds"], profile=True)
                n += 1
            # then the clock held up (wgpu_driver.hold_clocks), and kept up before every timed run, for
            # runs that keep the GPU busy too little of the time to raise it themselves (a 4096^3 product)
            hold_clocks(HOLD_S)
            per_op = {op.name: [] for op in prog.ops}
            for _ in range(runs):
                hold_clocks(0.1)
                sess.run(None, state["feeds"], profile=True)
                prof = sess.last_profile
                if not prof:
                    raise DeviceError("webiree tune needs GPU timestamps, and this adapter has no "
                                      "timestamp-query feature", hint="tune on an adapter that has it")
                # by name: a packer whose product packs its words itself runs no dispatch (its time
                # is the product's: 0 here, whichever configuration)
                for d, ns in zip(sess.module.info["dispatches"], prof, strict=True):
                    per_op[d["name"]].append(ns / 1e6)
            return True, {n: statistics.median(v) if v else 0.0 for n, v in per_op.items()}
        finally:
            sess.close()

    def run_round(configs: dict) -> None:
        ok, ms = measure(configs)
        if ok:
            for n, i in configs.items():
                times[n][i] = ms[n]
            return
        if len(configs) == 1:
            (n, i), = configs.items()
            wrong.append((n, cands[n][i].as_dict()))
            log(f"  WRONG: {n} with {cands[n][i].as_dict()} (left out)")
            return
        items = list(configs.items())
        run_round(dict(items[:len(items) // 2]))
        run_round(dict(items[len(items) // 2:]))

    t0 = time.perf_counter()
    for r in range(rounds):
        run_round({n: r for n in tuned_ops if r < len(cands[n])} or {n: 0 for n in tuned_ops[:1]})
        log(f"  round {r + 1}/{rounds} done ({time.perf_counter() - t0:.0f} s)")
    # the heuristic's round again, last: how far the adapter's speed drifted while the rounds ran
    first = sum(times[n][0] for n in tuned_ops if 0 in times[n])
    again = measure({n: 0 for n in tuned_ops})[1] if tuned_ops else {}
    drift = sum(again[n] for n in tuned_ops if 0 in times[n]) / first if first and again else float("nan")
    log(f"  the heuristic's round timed again after the others: {drift:.2f}x its first time")

    entries = {}
    for key in sorted({keys[n] for n in tuned_ops}):
        ops = [n for n in tuned_ops if keys[n] == key]
        total = {}
        for i in range(len(cands[ops[0]])):
            if all(i in times[n] for n in ops):
                total[i] = sum(times[n][i] for n in ops)
        if 0 not in total:
            continue
        order = sorted(total, key=lambda i: (total[i], i))
        cfg = lambda i: cands[ops[0]][i].as_dict()   # noqa: E731
        entries[key] = {"config": cfg(order[0]), "ms": round(total[order[0]], 5), "heuristic": cfg(0),
                        "heuristic_ms": round(total[0], 5), "dispatches": len(ops),
                        "candidates": [[cfg(i), round(total[i], 5)] for i in order]}
    info = adapter_info()
    table = {"format": FORMAT,
             "adapter": {"device": info.get("device", ""), "vendor": info.get("vendor", ""),
                         "backend_type": info.get("backend_type", ""), "adapter_type": info.get("adapter_type", ""),
                         "device_class": lim.get("device_class", "gpu"), "subgroup_size": lim.get("subgroup_size", 0)},
             "limits": {k: v for k, v in lim.items() if isinstance(v, int) and not isinstance(v, bool)},
             "model": model_path.name, "runs": runs, "warm_seconds": warm_seconds, "drift": round(drift, 4) if drift == drift else None,
             "wrong": wrong, "entries": entries}
    table = json.loads(json.dumps(table))       # as it reads back (lists, not tuples)
    Path(out_path).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    gpu_h = sum(e["heuristic_ms"] for e in entries.values())
    gpu_t = sum(e["ms"] for e in entries.values())
    changed = sum(1 for e in entries.values() if e["config"] != e["heuristic"])
    log(f"  {len(entries)} problem shapes, {changed} with a faster kernel than the heuristic's; their GPU time "
        f"{gpu_h:.3f} ms -> {gpu_t:.3f} ms; {len(wrong)} wrong candidates left out; table: {out_path}")

    # the whole model, tuned vs heuristic, in alternating turns
    sessions = [session(None), session(Table(table, str(out_path)))]
    try:
        err = _max_rel_err(sessions[1].run(None, state["feeds"]), state["ref"])
        if not err <= state["tol"]:
            raise WebireeError(f"the tuned build's result differs from the heuristic's by {err:.2e} "
                               f"(tolerance {state['tol']:.1e})", hint="a kernel bug: please report it")
        h_ms, t_ms = alternating_medians(sessions, state["feeds"], max(runs, 10), warmup)
        gpu = [[], []]
        for _ in range(max(1, runs // 10)):
            for s, g in zip(sessions, gpu):
                for i in range(warmup + 10):
                    s.run(None, state["feeds"], profile=True)
                    if i >= warmup:
                        g.append(sum(s.last_profile) / 1e6)
        h_gpu, t_gpu = (statistics.median(g) for g in gpu)
    finally:
        for s in sessions:
            s.close()
    table["end_to_end"] = {"heuristic_ms": round(h_ms, 4), "tuned_ms": round(t_ms, 4),
                           "heuristic_gpu_ms": round(h_gpu, 4), "tuned_gpu_ms": round(t_gpu, 4)}
    Path(out_path).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    log(f"  end to end (medians, alternating turns): host to host heuristic {h_ms:.3f} ms, tuned {t_ms:.3f} ms "
        f"({t_ms / h_ms:.2f}x); GPU time heuristic {h_gpu:.3f} ms, tuned {t_gpu:.3f} ms ({t_gpu / h_gpu:.2f}x)")
    return table
