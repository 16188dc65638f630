"""Tuning tables: kernel configurations measured on an adapter, by problem shape (issue #20 item 3).

The planner (`config.py`) picks every dispatch's KernelConfig by a heuristic. `webiree tune MODEL
--out TABLE` (webiree/tune.py) times, for each dispatch, the candidates this module lists on the
local adapter and writes the fastest per *problem key* (the op kind and the sizes a kernel's speed
depends on: `problem_key`); `webiree build --tuning TABLE` takes a table's configuration wherever
a dispatch's key is in it and the configuration suits the target (`Table.config_for`), and the
heuristic's everywhere else. A build is a function of the model, the target and the table: the
same table gives the same module.

The table, JSON (`FORMAT`):

    {"format": "webiree-tuning/1",
     "adapter": {"device": ..., "vendor": ..., "backend_type": ..., "device_class": "gpu" | "cpu",
                 "subgroup_size": N (0: none)},
     "limits": {... the limits the candidates were built for},
     "entries": {"<problem key>": {"config": KernelConfig.as_dict(), "ms": the best's GPU time,
                                   "heuristic_ms": the heuristic's, "dispatches": how many shared the key,
                                   "candidates": [[config, ms], ...] fastest first}}}

A table applies to the targets of its adapter's device class (so, in a default build, to the
kernel variants of that class), and a configuration that broadcasts within subgroups only where
the target's subgroup size is the table's. An entry whose configuration the target cannot run
(its limits, the strategy's prerequisites) is skipped, and counted in the module's info.
"""

from __future__ import annotations

import json

from ..errors import WebireeError
from ..ir import program as P
from ..ir.program import numel
from .config import SERIAL_LOOP_ITERATIONS, _row_passes, choose, depthwise_shared, planning_view
from .kernels import check
from .kernels.common import ConvTile, DepthwiseTile, KernelConfig, RowBlockTile
from .kernels.common import Strategy as S
from .kernels.matmul import matmul_vec4_ok
from .kernels.matmul_int8 import range_unroll

FORMAT = "webiree-tuning/1"


def problem_key(op: P.Op) -> str | None:
    """What a kernel's speed depends on, as text (None: the op is not tuned)."""
    v = planning_view(op)
    if isinstance(v, P.MatMul):
        from .config import _costly_b
        return (f"matmul b{max(1, numel(v.batch))} m{v.m} n{v.n} k{v.k} ta{int(v.trans_a)} tb{int(v.trans_b)} "
                f"bb{int(bool(v.b_batch))} v{int(matmul_vec4_ok(v))} q{int(_costly_b(v))} pa{int(v.a in v.prologues)}"
                + (" i8" if v.int8 else ""))
    if isinstance(v, P.Conv):
        return (f"conv x{'x'.join(map(str, v.x_shape))} w{'x'.join(map(str, v.w_shape))} "
                f"s{'x'.join(map(str, v.strides))} d{'x'.join(map(str, v.dilations))} "
                f"p{'x'.join(map(str, v.pads))} g{v.group}")
    if isinstance(v, (P.Softmax, P.LayerNorm, P.Reduce)):
        mode = f" {v.mode}" if isinstance(v, P.Reduce) else ""
        return f"{v.kind}{mode} o{v.outer} r{v.r} i{getattr(v, 'inner', 1)}"
    if isinstance(v, P.QuantizeWords):
        return f"quantizewords n{v.n}"
    if isinstance(v, P.MatMulChain):
        return f"matmulchain m{v.m} k{v.k} h{v.h} n{v.n}"
    if isinstance(v, P.Attention):
        return f"attention b{max(1, numel(v.batch))} m{v.m} d{v.d} s{v.s} dv{v.dv}"
    if isinstance(v, P.Pool):
        return f"pool {v.mode} x{'x'.join(map(str, v.x_shape))} k{'x'.join(map(str, v.kernel))} " \
               f"s{'x'.join(map(str, v.strides))}"
    if isinstance(v, P.Generic):
        return None     # one invocation per element: nothing a table would change much
    return None


def _fits_shared(cfg: KernelConfig, limits: dict) -> bool:
    """The workgroup memory a matmul configuration declares (as kernels/matmul.py sizes it)."""
    cap = limits["max_compute_workgroup_storage_size"]
    if cfg.strategy == S.TILED_SHARED_VEC4:
        rm, rn, bk = cfg.tile
        return 4 * bk * 16 * (rm + 4 * rn) <= cap
    if cfg.strategy == S.TILED_SHARED:
        wx, wy, _ = cfg.workgroup_size
        rm, rn, tk = cfg.tile
        return 4 * tk * (wy * rm + wx * rn) <= cap
    if cfg.strategy == S.SPLIT_K:
        wx, wy, ks = cfg.workgroup_size
        return 4 * ks * (cfg.tile[2] * (wx + wy) + wx * wy) <= cap
    return True


def _fits(cfg: KernelConfig, limits: dict) -> bool:
    x, y, z = (tuple(cfg.workgroup_size) + (1, 1, 1))[:3]
    return (x * y * z <= limits["max_compute_invocations_per_workgroup"]
            and x <= limits["max_compute_workgroup_size_x"] and y <= limits["max_compute_workgroup_size_y"]
            and z <= limits["max_compute_workgroup_size_z"] and _fits_shared(cfg, limits))


def _matmul_candidates(v: P.MatMul, limits: dict):
    vec = 4 if matmul_vec4_ok(v) else 1
    sg = limits.get("subgroup_size", 0)
    if sg in (4, 8, 16) and -(-v.k // (4 * sg)) <= SERIAL_LOOP_ITERATIONS:
        for rm, rn in ((16, 2), (8, 2), (16, 1), (8, 4), (4, 4)):
            yield KernelConfig((sg, 1, 1), (rm, rn if vec == 4 else 4 * rn, 4 * sg), vec, S.SUBGROUP_BROADCAST)
    if -(-v.k // 4) <= SERIAL_LOOP_ITERATIONS:
        for rm, rn in (((4, 12), (8, 6), (16, 3), (8, 3), (4, 6)) if vec == 4 else ((4, 16), (8, 8), (16, 4))):
            yield KernelConfig((8, 1, 1), (rm, rn, 4 if v.k >= 4 else 1), vec, S.REGISTER_BLOCKED)
    for rm, rn, bk in ((8, 2, 8), (8, 2, 16), (4, 2, 8), (4, 1, 8), (2, 1, 8), (1, 1, 8), (1, 1, 16)):
        yield KernelConfig((16, 16, 1), (rm, rn, bk), 4, S.TILED_SHARED_VEC4)
    # an integer product moves words of 4 values of K: longer K steps for the same workgroup memory
    deep = ((4, 32), (2, 32), (1, 32), (2, 64), (1, 64)) if v.int8 else ()
    for r, tk in ((8, 8), (4, 16), (2, 16), (1, 16)) + deep:
        yield KernelConfig((16, 16, 1), (r, r, tk), 1, S.TILED_SHARED)
    for wg, tk in (((8, 8, 4), 16), ((8, 8, 4), 8), ((16, 8, 2), 16), ((8, 4, 8), 8)) + (
            (((8, 8, 4), 32), ((8, 8, 4), 64), ((16, 8, 2), 32)) if v.int8 else ()):
        yield KernelConfig(wg, (1, 1, tk), 1, S.SPLIT_K)


def matmul_candidates(m: int, k: int, n: int, limits: dict) -> list[KernelConfig]:
    """The configurations `candidates` times for a plain [m, k] x [k, n] product, every kernel family's
    that can build it within the limits (benchmarks/matmul_variants.py times them one by one)."""
    v = P.MatMul("mm", "y", [], a="a", b="w", m=m, n=n, k=k)
    return [c for c in _matmul_candidates(v, limits) if _fits(c, limits) and check(c.strategy, v, limits) is None]


def _conv_candidates(v: P.Conv, limits: dict):
    per_group = v.w_shape[0] // v.group
    for wg in (64, 128, 256):
        for cb in (1, 2, 4, 8):
            if per_group % cb == 0:
                yield KernelConfig((wg, 1, 1), ConvTile(cb), 1, S.DIRECT)
    if len(v.out_shape) == 4 and v.out_shape[3] >= 4:
        for wg in (32, 64, 128):
            for width in (2, 4, 8):
                yield KernelConfig((wg, 1, 1), RowBlockTile(1, width), 1, S.ROW_BLOCK)
    if len(v.out_shape) == 4 and v.w_shape[1] == 1:
        first = depthwise_shared(v, limits)
        if first is not None:
            yield first
        for tx, ty in ((16, 8), (8, 8), (32, 4), (16, 16), (8, 16)):
            for rows, width in ((1, 1), (2, 2), (1, 4), (2, 4), (4, 2)):
                yield KernelConfig((tx, ty, 1), DepthwiseTile(rows, width), 1, S.DEPTHWISE_SHARED)


def _rows_candidates(v, limits: dict):
    passes = _row_passes(v)
    if not isinstance(v, P.Reduce) and passes * v.r <= SERIAL_LOOP_ITERATIONS:
        for wg in (8, 32, 64):
            yield KernelConfig((wg, 1, 1), (), 1, S.ROW_PER_INVOCATION)
    for wg in (32, 64, 128, 256):
        if passes * -(-v.r // wg) <= SERIAL_LOOP_ITERATIONS:
            yield KernelConfig((wg, 1, 1), (), 1, S.WORKGROUP_TREE)


def _chain_candidates(v: P.MatMulChain, limits: dict):
    """GPU-like (many invocations, H split for the second product) and CPU-like (a subgroup-wide
    workgroup, register blocks) configurations; `check` keeps those the sizes allow."""
    for t in (64, 128, 256):
        for r in (1, 2, 4):
            for z in (1, 2, 4, 8):
                for u in (1, 4):
                    yield KernelConfig((t, 1, 1), (r, 1, z, u), 4, S.CHAIN_SHARED)
    sg = limits.get("subgroup_size", 0)
    for r in (2, 4, 8):
        for rn in (1, 2, 4):
            yield KernelConfig((8, 1, 1), (r, rn, 1, 1), 4, S.CHAIN_SHARED)
    if sg in (4, 8, 16):
        for r in (4, 8, 16):
            for rn in (1, 2, 4):
                for parts in (1, 2, 4, 8):
                    yield KernelConfig((sg, 1, 1), (r, rn, 1, 1, parts), 4, S.CHAIN_SUBGROUP)


def _attention_candidates(v: P.Attention, limits: dict):
    """Query rows a workgroup x keys a block; the subgroup kernel's keys a block where the adapter
    has subgroups; `check` keeps those workgroup memory allows."""
    for t in (8, 16, 32, 64, 128, 256):
        for z in (1, 2, 4, 8, 16):
            for keys in (2, 4, 8, 16, 32):
                if t % z == 0 and t // z >= 4:
                    yield KernelConfig((t, 1, 1), (keys, z), 1, S.ATTENTION_ONLINE)
    sg = limits.get("subgroup_size", 0)
    if sg in (4, 8, 16):
        for keys in (1, 2, 4, 8):
            yield KernelConfig((sg, 1, 1), (keys,), 1, S.ATTENTION_SUBGROUP)


def _range_pack_candidates(v: P.QuantizeWords, limits: dict):
    """Workgroup sizes x words per invocation: fewer, fuller workgroups re-read x less often."""
    n4 = v.n // 4
    for wg in (64, 128, 256, 512, 1024):
        for words in (1, 2, 4, 8, 16, 32, 64):
            if -(-n4 // (wg * range_unroll(limits))) + words <= SERIAL_LOOP_ITERATIONS and -(-n4 // (wg * words)) <= 256:
                yield KernelConfig((wg, 1, 1), (words,), 1, S.RANGE_PACK)


def candidates(op: P.Op, prog: P.Program, limits: dict) -> list[KernelConfig]:
    """The configurations `webiree tune` times for `op`: the heuristic's choice first, then every
    other one of the kernel families that can build it on this target (both device classes'),
    within the limits. Empty for an op that is not tuned."""
    if problem_key(op) is None:
        return []
    v = planning_view(op)
    if isinstance(v, P.MatMul):
        more = _matmul_candidates(v, limits)
    elif isinstance(v, P.Conv):
        more = _conv_candidates(v, limits)
    elif isinstance(v, (P.Softmax, P.LayerNorm, P.Reduce)):
        more = _rows_candidates(v, limits)
    elif isinstance(v, P.QuantizeWords):
        more = _range_pack_candidates(v, limits)
    elif isinstance(v, P.MatMulChain):
        more = _chain_candidates(v, limits)
    elif isinstance(v, P.Attention):
        more = _attention_candidates(v, limits)
    elif isinstance(v, P.Pool):
        more = (KernelConfig((wg, 1, 1), (), 1, S.WINDOW) for wg in (32, 64, 128, 256))
    else:
        more = ()
    out = [choose(op, prog, limits)]
    seen = {_config_key(out[0])}
    for cfg in more:
        key = _config_key(cfg)
        if key not in seen and _fits(cfg, limits) and check(cfg.strategy, v, limits, cfg) is None:
            seen.add(key)
            out.append(cfg)
    return out


def _config_key(cfg: KernelConfig) -> str:
    d = cfg.as_dict()
    d.pop("aligned", None)
    return json.dumps(d, sort_keys=True)


class TuningTableError(WebireeError):
    """A tuning table that cannot be read."""


class Table:
    """A tuning table (see the module docstring) as the compiler reads it."""

    def __init__(self, data: dict, source: str = "the tuning table"):
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            raise TuningTableError(f"{source} is not a webiree tuning table (format {FORMAT!r})",
                                   hint="make one with: webiree tune MODEL --out TABLE")
        self.data, self.source = data, source
        self.adapter = data.get("adapter", {})
        self.entries = {}
        for key, e in data["entries"].items():
            try:
                self.entries[key] = KernelConfig(**e["config"])
            except Exception as err:   # noqa: BLE001  (any malformed entry: one clear error)
                raise TuningTableError(f"{source}: entry {key!r} holds no kernel configuration ({err})") from None

    @classmethod
    def load(cls, path) -> "Table":
        try:
            data = json.loads(open(path, encoding="utf-8").read())
        except (OSError, ValueError) as e:
            raise TuningTableError(f"cannot read the tuning table {path}: {e}") from None
        return cls(data, str(path))

    def applies_to(self, limits: dict) -> bool:
        """Whether the table's adapter is of the target's device class (a default target's variants
        each have one)."""
        return limits.get("device_class", "gpu") == self.adapter.get("device_class", "gpu")

    def config_for(self, op: P.Op, limits: dict) -> tuple[KernelConfig | None, str]:
        """(the table's configuration for `op`, 'used'), or (None, why not: 'absent' | 'other class' |
        'unfit': the target cannot run it)."""
        if not self.applies_to(limits):
            return None, "other class"
        key = problem_key(op)
        cfg = self.entries.get(key) if key else None
        if cfg is None:
            return None, "absent"
        v = planning_view(op)
        subgroups_differ = cfg.strategy in (S.SUBGROUP_BROADCAST, S.CHAIN_SUBGROUP, S.ATTENTION_SUBGROUP) and \
            limits.get("subgroup_size", 0) != cfg.workgroup_size[0]
        if subgroups_differ or not _fits(cfg, limits) or check(cfg.strategy, v, limits, cfg) is not None:
            return None, "unfit"
        return KernelConfig(**cfg.as_dict()), "used"

    def describe(self) -> str:
        a = self.adapter
        return f"{a.get('device') or a.get('description') or '?'} ({a.get('device_class', '?')})"
