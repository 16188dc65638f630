"""The compiler pipeline, stage by stage (DESIGN.md: data flows one way).

    import -> lower (fold constants, canonical ops) -> fold_pad_into_conv -> dce -> fuse -> dce
           -> pack constants (narrow storage, ir/packing.py) -> plan memory -> kernels (config + kernel IR; per target: legalize the
              kernel for the renderer -> WGSL text / SPIR-V words, validated)
           -> schedule module + weights blob

Legalization (wgsl_codegen/legalize.py) runs here, once per kernel and target,
between building the kernel IR and rendering it: the renderers only print.

`compile_model` returns every stage's product in a `CompileResult`;
`--dump-after STAGE` prints one of them.
"""

from __future__ import annotations

from ..ir.program import numel

import dataclasses
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import CompilerBug, LimitsError, UnsupportedOpError, WebireeError
from ..module import format as F
from ..target import Target
from ..wgsl_codegen import config as C
from ..wgsl_codegen import kernels as K
from ..ir import kir, packing, ranges
from ..ir import program as P
from ..wgsl_codegen import wgsl
from ..wgsl_codegen.legalize import legalize
from ..wgsl_codegen.tuning import Table
from . import half_storage, memory, passes
from .generation import add_generation_head, head_top_k, vocab_top_k
from .importer import import_model, open_model
from ..ir.mapped import release
from ..module.generation import TOP_K_INFO
from .lowering import lower
from .registers import Registers
from ..ir.sym import Dim, SymbolicDimError, is_static, upper, upper_shape

STAGES = ("import", "lower", "fuse", "memory", "kernels")


@dataclass
class CompileResult:
    module: F.Module
    weights: bytes
    shaders: list[tuple[str, str]]      # (file name, WGSL) one per executable
    dispatches: list[K.Dispatch]
    plan: memory.MemoryPlan
    program: object
    graph: object
    limits: dict
    dumps: dict = field(default_factory=dict)
    spirv: list = field(default_factory=list)   # (file name, SPIR-V bytes) one per executable, when targeted
    variants: dict = field(default_factory=dict)   # a build with kernel variants: name -> its own CompileResult


def check_dispatch_limits(dispatches, lim: dict) -> None:
    """No dispatch may exceed the limits it was built for (a kernel builder that does not fold its
    grid or sizes its workgroup too large is caught here, as a LimitsError naming the limit)."""
    cap = lim["max_compute_workgroups_per_dimension"]
    for d in dispatches:
        if any(upper(g) > cap for g in d.grid):
            raise LimitsError(f"dispatch {d.name} needs a grid of {tuple(upper(g) for g in d.grid)} workgroups, above the "
                              f"maxComputeWorkgroupsPerDimension of {cap}", hint="use a smaller input shape")
        wg = tuple(d.kernel.workgroup_size) + (1,) * (3 - len(d.kernel.workgroup_size))
        inv = wg[0] * wg[1] * wg[2]
        over = [(k, v, lim[k]) for k, v in (("max_compute_invocations_per_workgroup", inv),
                                             ("max_compute_workgroup_size_x", wg[0]),
                                             ("max_compute_workgroup_size_y", wg[1]),
                                             ("max_compute_workgroup_size_z", wg[2]),
                                             ("max_compute_workgroup_storage_size", shared_bytes(d.kernel)))
                if k in lim and v > lim[k]]
        if over:
            k, v, cap_k = over[0]
            raise CompilerBug(f"dispatch {d.name} was built with {k} = {v}, above the target's {cap_k}",
                              hint="the kernel configuration ignored a limit; please report this")


def shared_bytes(kernel) -> int:
    """Workgroup memory a kernel declares (kernels/common.py arrays_bytes)."""
    return K.arrays_bytes(kernel.shared)


def _choose(op, prog, lim):
    try:
        return C.choose(op, prog, lim)
    except SymbolicDimError as e:
        raise UnsupportedOpError(f"dispatch {op.name} (nodes {op.nodes[:4]}) cannot take a symbolic size yet: {e}",
                                 hint="pin the dim it depends on (--input-shape, or --dim NAME=N)") from e


def _build_kernel(op, prog, lim, cfg=None):
    try:
        return K.build(op, prog, C.choose(op, prog, lim) if cfg is None else cfg, lim)
    except SymbolicDimError as e:
        raise UnsupportedOpError(f"dispatch {op.name} (nodes {op.nodes[:4]}) cannot take a symbolic size yet: {e}",
                                 hint="pin the dim it depends on (--input-shape, or --dim NAME=N)") from e


def _file_name(i: int, name: str) -> str:
    return f"{i:03d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)[:60]}.wgsl"


TARGETS = ("wgsl", "spirv")


def parse_targets(targets) -> tuple:
    """'wgsl' | 'spirv' | 'wgsl,spirv' | a sequence of those -> a tuple; the first is the format the
    schedule module's executables use, every one is written to shaders/ (.wgsl / .spv)."""
    if targets is None:   # WEBIREE_TARGETS lets a whole test run use another target (e.g. spirv)
        import os
        targets = os.environ.get("WEBIREE_TARGETS") or "wgsl"
    if isinstance(targets, str):
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    out = tuple(dict.fromkeys(targets))
    bad = [t for t in out if t not in TARGETS]
    if bad or not out:
        raise WebireeError(f"unknown target {', '.join(bad) or '(none)'}", hint="targets are wgsl and spirv")
    return out


VARIANTS = ("gpu", "cpu")     # device classes a build can carry kernels for (Target.device_class)
SUBGROUP_SIZES = (4, 8, 16)   # 'cpu-sg8': the cpu kernels, matmuls broadcasting within subgroups of 8
HALF_SUFFIX = "-f16"          # 'gpu-f16': float16 activations stored as halves (compiler/half_storage.py)
START_SUFFIX = "-start"       # 'cpu-sg4-start': the start tier of 'cpu-sg4' (F.variant_rule, webiree.js)


def variant_target(name: str, target: Target) -> Target:
    """The target a kernel variant is compiled for: `target`'s limits with the variant's device class,
    for a name 'CLASS-sgN' subgroups of exactly N invocations, for a name ending in '-f16' the
    shader-f16 feature, for one ending in '-start' the start tier (small register blocks that
    compile fast: config.py START_BLOCK) (F.variant_rule says the same)."""
    start = name.endswith(START_SUFFIX)
    name = name.removesuffix(START_SUFFIX)
    half = name.endswith(HALF_SUFFIX)
    cls, _, sg = name.removesuffix(HALF_SUFFIX).partition("-sg")
    features = target.features | {half_storage.FEATURE} if half else target.features - {half_storage.FEATURE}
    return dataclasses.replace(target, device_class=cls, subgroup_size=int(sg) if sg else 0, features=features,
                               tier="start" if start else "")


def parse_variants(variants, target: Target) -> tuple:
    """None | 'gpu,cpu' | a sequence of variant names -> a tuple (empty: one set of kernels, as the
    target says). A name is a device class, optionally with '-sgN' (the kernels that broadcast within
    a subgroup of N invocations, picked only on an adapter that runs such subgroups: N in 4, 8, 16),
    then optionally '-f16' (float16 activations stored as halves, picked only on an adapter with
    shader-f16; a build whose model has none drops it), then optionally '-start': the start tier of
    the variant named without it, which must be carried too (small kernels that compile fast: a
    page runs them while its variant's pipelines compile, then switches). Variants are compiled at
    the target's limits, so it must name neither a class nor a subgroup size."""
    if variants is None:
        return ()
    if isinstance(variants, str):
        variants = [v.strip() for v in variants.split(",") if v.strip()]
    out = tuple(variants)
    ok = {*VARIANTS, *(f"{c}-sg{n}" for c in VARIANTS for n in SUBGROUP_SIZES)}
    ok |= {v + HALF_SUFFIX for v in ok}
    ok |= {v + START_SUFFIX for v in ok}
    bad = [v for v in out if v not in ok]
    if bad or not out or len(set(out)) != len(out):
        raise LimitsError(f"variants must be distinct names among {', '.join(VARIANTS)} (each optionally with "
                          f"-sg{'/'.join(map(str, SUBGROUP_SIZES))}, then optionally {HALF_SUFFIX}, then optionally "
                          f"{START_SUFFIX}), not {out}", hint="e.g. --variants gpu,cpu,cpu-sg8,gpu-f16,cpu-sg4,cpu-sg4-start")
    alone = [v for v in out if v.endswith(START_SUFFIX) and v.removesuffix(START_SUFFIX) not in out[:out.index(v)]]
    if alone:
        raise LimitsError(f"a start tier is carried after the variant it starts: {alone[0]} needs "
                          f"{alone[0].removesuffix(START_SUFFIX)} before it in the list",
                          hint="e.g. --variants gpu,cpu-sg4,cpu-sg4-start")
    if target.device_class or target.subgroup_size:
        raise LimitsError(f"kernel variants need a target of no device class and no subgroup size; this one is for "
                          f"{target.device_class or 'any'} adapters" +
                          (f" with subgroups of {target.subgroup_size}" if target.subgroup_size else ""),
                          hint="build with the default limits (or a limits dict without device_class / subgroup_size)")
    return out


def compile_model(model, input_shapes=None, target=None, validate=None, dump_after=(),
                  targets=None, dims=None, generation=None, variants=None, tuning=None) -> CompileResult:
    """Compile; every failure is a WebireeError. One that no check anticipated is a CompilerBug
    naming the stage, with the original exception chained (`--debug` shows its traceback).
    target: a Target (webiree/target.py), or what Target.resolve takes ('default', 'gpu', 'cpu',
    a dict of limits). validate: None, or a function
    validate(dispatch name, format, code) called on every executable's code in every target
    format (the bundler hands in naga through wgpu and spirv-val; a failure raises).
    targets: see parse_targets (default WGSL only, or $WEBIREE_TARGETS).
    input_shapes: {input: [dims]}, each an int or a range (lo, hi) / "lo..hi"; dims: {symbolic dim
    name: int or range} wherever the name appears (a range makes a dynamic build, ir/sym.py).
    generation: True or a top-k limit (an int; 0: greedy only) appends the generation head to a
    decoder with a KV cache (compiler/generation.py, module/generation.py), so that runtimes'
    generate() picks each token on the GPU.
    variants: kernel variants ('gpu,cpu,cpu-sg8', see parse_variants) to carry: the program goes
    through the front of the pipeline once (import to memory plan: it depends on the limits only),
    its kernels are chosen and built per variant (a kernel two variants of one device class choose
    alike is built once) and the modules merged (merge_variants); the runtimes pick one by the
    adapter at load. None: one set of kernels.
    tuning: a tuning table (wgsl_codegen/tuning.py: a Table, or a path to one): its kernel
    configurations replace the heuristic's where a dispatch's problem key is in it and the target
    (each variant) can run them; module.info['tuning'] says how many were used and skipped."""
    stage = ["import"]
    if isinstance(tuning, (str, os.PathLike)):
        tuning = Table.load(tuning)
    targets = parse_targets(targets)
    target = Target.resolve(target)
    names = parse_variants(variants, target)
    try:
        if not names:
            return _compile(stage, model, input_shapes, target, validate, dump_after, targets, dims, generation,
                            tuning)
        validate = _once(validate)
        front = _front(stage, model, input_shapes, target, dump_after, targets, dims, generation)
        cache: dict = {}
        results = [_back(stage, front, variant_target(n, target), validate, dump_after, targets, cache, tuning)
                   for n in names]
        stage[0] = "variants"
        return merge_variants(names, results)
    except WebireeError:
        raise
    except Exception as e:
        raise CompilerBug(f"internal error in the {stage[0]} stage ({type(e).__name__}: {str(e)[:300]})",
                          hint="this is a webiree bug; please report it with the model "
                               "(webiree --debug shows the traceback)") from e


def kernel_rounds(model, input_shapes=None, target=None, dims=None):
    """(program, build): the front of the pipeline run once, and `build(tuning)` -> CompileResult
    making the kernels with that tuning table (None: the heuristic's), WGSL, unvalidated; kernels
    that another call already made are reused. `webiree tune` builds a model once per round so."""
    target = Target.resolve(target)
    stage = ["import"]
    front = _front(stage, model, input_shapes, target, (), ("wgsl",), dims, None)
    cache: dict = {}
    return front.prog, lambda tuning: _back(stage, front, target, None, (), ("wgsl",), cache, tuning)


@dataclass
class _Front:
    """What the front of the pipeline makes (import -> memory plan): it depends on the target's
    limits only, so the kernel variants of one build share it."""
    prog: object
    plan: memory.MemoryPlan
    graph: object
    dumps: dict
    top_k: object
    weights: bytearray          # weights.bin (weights_blob): one for every kernel variant
    page_offset: dict           # weight page -> its offset in weights.bin


def _compile(stage, model, input_shapes, target: Target, validate, dump_after, targets=("wgsl",),
             dims=None, generation=None, tuning=None) -> CompileResult:
    front = _front(stage, model, input_shapes, target, dump_after, targets, dims, generation)
    return _back(stage, front, target, validate, dump_after, targets, tuning=tuning)


def _front(stage, model, input_shapes, target: Target, dump_after, targets, dims, generation) -> _Front:
    lim = target.as_limits()
    dumps = {}
    top_k = head_top_k(generation)
    proto, base = open_model(model)     # a file's weights stay in it (compiler/onnx_file.py)
    if top_k is not None:
        proto = add_generation_head(proto, top_k)
        top_k = vocab_top_k(proto)
    graph = import_model(proto, input_shapes, dims, base=base)
    del proto
    if "import" in dump_after:
        dumps["import"] = graph.summary()
    stage[0] = "lower"
    prog = lower(graph)
    if prog.symbols and "spirv" in targets:
        raise WebireeError("SPIR-V executables of a dynamic build (sizes in ranges) are not supported yet",
                           hint="build the dynamic module for WGSL (the default), or pin every dim for SPIR-V")
    passes.sink_zero_pads(prog)
    passes.fold_pad_into_conv(prog)
    passes.dce(prog)
    passes.split_large_constants(prog, lim["max_storage_buffer_binding_size"])
    passes.combine_parallel_matmuls(prog, lim["max_storage_buffer_binding_size"])
    if "lower" in dump_after:
        dumps["lower"] = prog.summary()
    stage[0] = "fuse"
    passes.fuse(prog, max_bindings=lim["max_storage_buffers_per_shader_stage"],
                table_below=int(lim.get("min_storage_buffer_offset_alignment", 256)))
    passes.fuse_matmul_chains(prog, max_bindings=lim["max_storage_buffers_per_shader_stage"],
                              table_below=int(lim.get("min_storage_buffer_offset_alignment", 256)),
                              shared_bytes=lim["max_compute_workgroup_storage_size"])
    if lim.get("device_class") != "cpu" or lim.get("subgroup_size", 0) in (4, 8, 16):   # see fuse_attention
        passes.fuse_attention(prog, max_bindings=lim["max_storage_buffers_per_shader_stage"],
                              table_below=int(lim.get("min_storage_buffer_offset_alignment", 256)),
                              max_groups=lim["max_compute_workgroups_per_dimension"])
    passes.dce(prog)
    passes.ranges_from_producers(prog)      # (before lift_literals: a kernel that records a range is another kernel)
    passes.lift_literals(prog, max_bindings=lim["max_storage_buffers_per_shader_stage"],
                         table_below=int(lim.get("min_storage_buffer_offset_alignment", 256)))
    passes.pack_constants(prog)
    passes.pack_in_products(prog, max_bindings=lim["max_storage_buffers_per_shader_stage"],
                            table_below=int(lim.get("min_storage_buffer_offset_alignment", 256)))
    if "fuse" in dump_after:
        dumps["fuse"] = prog.summary()
    stage[0] = "memory"
    plan = memory.plan_memory(prog, lim)
    if "memory" in dump_after:
        dumps["memory"] = plan.summary() + "\n" + "\n".join(
            f"  {n:<40} buffer {p.buffer} offset {p.offset} size {p.size}" for n, p in plan.placement.items())
    weights, page_offset = weights_blob(prog, plan)
    return _Front(prog, plan, graph, dumps, top_k, weights, page_offset)


def _back(stage, front: _Front, target: Target, validate, dump_after, targets, cache=None,
          tuning=None) -> CompileResult:
    """Kernels, their code and the schedule for one device class (and subgroup size). `cache`, shared
    by the variants of one build, maps (op index, device class, kernel config) to the rendered
    kernel, so a variant that chooses the same config for a dispatch as another reuses its kernel.
    `tuning`: a tuning table whose configurations replace the heuristic's where they apply."""
    prog, plan, lim = front.prog, front.plan, target.as_limits()
    dumps = dict(front.dumps)
    stage[0] = "kernels"
    cache = {} if cache is None else cache
    halves = half_storage.half_tensors(prog) if half_storage.FEATURE in target.features else frozenset()
    dispatches, rendered = [], []
    tuned, tuned_ops = {"used": 0, "unfit": 0, "absent": 0, "other class": 0}, []   # what the table did
    for i, op in enumerate(prog.ops):
        cfg = None
        if tuning is not None:
            cfg, how = tuning.config_for(op, lim)
            tuned[how] += 1
            if cfg is not None:
                tuned_ops.append(i)
        cfg = cfg or _choose(op, prog, lim)
        key = (i, target.device_class, repr(cfg.as_dict()))
        if key not in cache:
            cache[key] = _render(_build_kernel(op, prog, lim, cfg), targets)
        if halves and (key, "f16") not in cache:
            d = cache[key][0]
            kernel = half_storage.store_halves(d.kernel, d.tensors, prog, halves)
            cache[key, "f16"] = cache[key] if kernel is d.kernel else \
                _render(dataclasses.replace(d, kernel=kernel), targets)
        d, text, spv = cache[(key, "f16") if halves else key]
        dispatches.append(d)
        rendered.append((text, spv))
    # a packer whose product computes its words itself (kernels/matmul_int8.py packed_here) runs no dispatch
    dropped = {id(q) for op, d in zip(prog.ops, dispatches) for q in K.matmul_int8.packed_here(op, d)}
    kept = [i for i, op in enumerate(prog.ops) if id(op) not in dropped]
    ops = [prog.ops[i] for i in kept]
    dispatches, rendered = [dispatches[i] for i in kept], [rendered[i] for i in kept]
    tuned_ops = [kept.index(i) for i in tuned_ops if i in kept]
    check_dispatch_limits(dispatches, lim)
    sources: dict[str, int] = {}
    executables, shaders, exec_of, spv_files = [], [], [], []
    for d, (text, spv_code) in zip(dispatches, rendered):
        # the first line names the kernel; identical bodies share one executable
        body = text.split("\n", 1)[1]
        if body not in sources:
            sources[body] = len(executables)
            fname = _file_name(len(executables), d.name)
            code = text.encode("utf-8")
            if spv_code is not None:
                spv_files.append((fname[:-len(".wgsl")] + ".spv", spv_code))
                if targets[0] == "spirv":
                    code = spv_code
            executables.append(F.Executable(d.name, targets[0], code, "main", d.kernel.workgroup_size,
                                            [(b.slot, F.BIND_UNIFORM if b.uniform else int(b.writes))
                                             for b in d.kernel.bindings]))
            shaders.append((fname, text))
        exec_of.append(sources[body])
    if validate:
        for ex, (fname, text) in zip(executables, shaders):
            validate(ex.name, "wgsl", text)
        for ex, (fname, code) in zip(executables, spv_files):
            validate(ex.name, "spirv", code)
    if "kernels" in dump_after:
        dumps["kernels"] = "\n".join(f"// ---- {f}\n{t}" for f, t in shaders)

    stage[0] = "schedule"
    module = _schedule(prog, ops, plan, dispatches, exec_of, executables, lim, front.page_offset)
    if tuning is not None:     # what the table did for this set of kernels (inspect shows it)
        for i in tuned_ops:
            module.info["dispatches"][i]["tuned"] = True
        module.info["tuning"] = {"table": tuning.source, "adapter": tuning.describe(), "used": tuned["used"],
                                 "unfit": tuned["unfit"], "not in the table": tuned["absent"],
                                 "for another device class": tuned["other class"]}
    if front.top_k is not None:
        module.info[TOP_K_INFO] = front.top_k
    return CompileResult(module, front.weights, shaders, dispatches, plan, prog, front.graph, lim, dumps, spv_files)


def _render(d, targets) -> tuple:
    """(dispatch, WGSL text, SPIR-V words or None): the kernel's index math simplified on the ranges
    of its values (ir/ranges.py, for the largest grid it is dispatched with), then legalized and
    rendered per target (WGSL with f16 arithmetic where it binds halves: half_storage.half_arithmetic)."""
    kernel = ranges.simplify(d.kernel, tuple(upper(g) for g in d.grid))
    d = dataclasses.replace(d, kernel=kernel)
    if half_storage.uses_halves(kernel):     # a -f16 variant's kernel: halves' sums and products in f16
        kernel = half_storage.half_arithmetic(kernel)[0]
    text = wgsl.render(legalize(kernel, wgsl.SUPPORTS))
    spv = None
    if "spirv" in targets:   # from the same kernel IR (wgsl_codegen/spirv.py)
        from ..wgsl_codegen import spirv
        spv = spirv.emit(legalize(d.kernel, spirv.SUPPORTS))
    return d, text, spv


def _precision(op, prog, dispatch=None) -> str:
    """The dispatch's precision plan, as inspect shows it: what it computes and accumulates in, the
    storage forms of the weights it reads (ir/packing.py), the narrow type its result is rounded to
    and whether it reads or writes activations stored as halves (compiler/half_storage.py), and then
    computes sums and products of halves in f16 (half_storage.half_arithmetic); whether it records
    its result's range for a range-pack, or the range-pack reads it (kernels/quant_range.py); whether
    an integer product packs (or quantizes) an operand where it loads it (passes.pack_in_products)."""
    kernel = dispatch.kernel if dispatch is not None else None
    consts = [prog.tensors[prog.root(r)] for r in op.reads() if prog.tensors[prog.root(r)].kind == "const"]
    forms = sorted({t.pack or t.form for t in consts if t.pack or t.form})
    exprs = [getattr(op, "expr", None), getattr(op, "epilogue", None), getattr(op, "result", None)]
    rounded = sorted({n.op[len("round_"):] for e in exprs if e is not None for n in kir.walk(e)
                      if n.op in ("round_f16", "round_bf16")})
    plan = "f32" if prog.tensors[op.out].dtype == "f32" else prog.tensors[op.out].dtype
    if getattr(op, "int8", False):    # kernels/matmul_int8.py: exact integer products, then the epilogue
        plan = "int8 products in i32" + (f", result {plan}" if plan != "i32" else "")
    if forms:
        plan += ", weights " + "/".join(forms)
    if rounded:
        plan += ", result rounded to " + "/".join(rounded)
    if kernel is not None and half_storage.uses_halves(kernel):
        plan += ", activations stored as f16"
        if half_storage.half_arithmetic_ops(kernel):
            plan += ", sums and products of halves in f16"
    if kernel is not None and prog.tensors[prog.root(op.out)].ranges:     # kernels/quant_range.py
        plan += ", records its result's range" if K.quant_range.records(kernel) else ", records no range"
    if getattr(op, "partials", ""):
        plan += ", range from its producer"
    for q in K.matmul_int8.packed_here(op, dispatch) if dispatch is not None else ():
        plan += (", quantizes A in its loads (range from its producer)" if isinstance(q, P.QuantizeWords)
                 else f", packs {'A' if q is op.packer else 'B'} in its loads")
    return plan


def _once(validate):
    """validate, called once per distinct executable body (variants share most of theirs)."""
    if validate is None:
        return None
    seen = set()

    def once(name, fmt, code):
        key = (fmt, code.split("\n", 1)[-1] if isinstance(code, str) else bytes(code))
        if key not in seen:
            seen.add(key)
            validate(name, fmt, code)
    return once


def merge_variants(names, results) -> CompileResult:
    """One module of several compilations of one program, one per device class at the same limits:
    the union of their executables (an identical one stored once), one command stream per variant
    (VARS, docs/schedule-module.md; the first is also CMDS, which older readers run), everything
    else shared. Fusion and memory planning depend only on the limits, so the variants must agree
    on the weights blob, buffers, inputs, outputs and symbols: a difference is a CompilerBug."""
    base = results[0]
    m0 = base.module
    own = ("subgroup_size", half_storage.FEATURE, "tier")     # a variant's own, named by its rule
    limits = {k: v for k, v in m0.limits.items() if k not in own}
    for name, r in zip(names[1:], results[1:]):
        m = r.module
        for what, a, b in (("weights blob", r.weights, base.weights), ("buffers", m.buffers, m0.buffers),
                           ("inputs", m.inputs, m0.inputs), ("outputs", m.outputs, m0.outputs),
                           ("symbols", m.symbols, m0.symbols)):
            if a != b:
                raise CompilerBug(f"the {name} kernel variant's {what} differ from the {names[0]} variant's",
                                  hint="variants share one schedule and weights.bin; please report this")
        for k, v in m.limits.items():   # equal limits; a variant's subgroup size and features are its rule's
            if k not in own and limits.setdefault(k, v) != v:
                raise CompilerBug(f"the {name} kernel variant needs {k} = {v}, the {names[0]} variant {limits[k]}")
    executables, shaders, spirv, index, variants = [], [], [], {}, []
    for name, r in zip(names, results):
        remap = []
        for i, ex in enumerate(r.module.executables):
            text = r.shaders[i][1]
            key = (ex.format, ex.entry, tuple(ex.workgroup_size), tuple(map(tuple, ex.bindings)),
                   text.split("\n", 1)[-1])
            if key not in index:
                index[key] = len(executables)
                fname = _file_name(len(executables), ex.name)
                executables.append(ex)
                shaders.append((fname, text))
                if r.spirv:
                    spirv.append((fname[:-len(".wgsl")] + ".spv", r.spirv[i][1]))
            remap.append(index[key])
        commands = [(c[0], remap[c[1]], *c[2:]) if c[0] in (F.OP_DISPATCH, F.OP_DISPATCH_DYN) else c
                    for c in r.module.commands]
        dispatches = [{**d, "exec": remap[d["exec"]]} for d in r.module.info["dispatches"]]
        cls = name.split("-")[0]
        if any(v.name.split("-")[0] == cls and v.commands == commands for v in variants):
            continue    # a subgroup (or -f16) variant that uses no subgroups (no halves) repeats one: not carried
        if name.endswith(START_SUFFIX) and name.removesuffix(START_SUFFIX) not in {v.name for v in variants}:
            continue    # the start tier of a variant not carried (it repeated another)
        vinfo = {"dispatches": dispatches, **({"tuning": r.module.info["tuning"]} if "tuning" in r.module.info else {})}
        variants.append(F.Variant(name, F.variant_rule(name), commands, r.module.registers, vinfo))
    info = {**m0.info, "dispatches": variants[0].info["dispatches"],
            "variants": {v.name: {"rule": v.rule, **v.info} for v in variants}}
    module = F.Module(executables, m0.buffers, m0.inputs, m0.outputs, variants[0].commands, limits, info,
                      variants[0].registers, m0.symbols, variants)
    dumps = dict(base.dumps)
    if "kernels" in dumps:
        dumps["kernels"] = "\n".join(f"// ---- {f}\n{t}" for f, t in shaders)
    kept = {v.name for v in variants}
    return CompileResult(module, base.weights, shaders, base.dispatches, base.plan, base.program, base.graph,
                         base.limits, dumps, spirv, {n: r for n, r in zip(names, results) if n in kept})


def _weights_by_form(prog, plan) -> dict:
    """Stored bytes of the constants by storage form ('f32', 'i32', 'f16', 'i8', ...: ir/packing.py)."""
    out: dict = {}
    for name, _, _ in plan.weights:
        t = prog.tensors[name]
        form = t.pack or t.form or {"bool": "u32"}.get(t.dtype, t.dtype)
        out[form] = out.get(form, 0) + t.nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def weights_blob(prog, plan) -> tuple[bytearray, dict]:
    """weights.bin: the weight pages one after another, each 256-aligned in the file, and each
    page's offset in it. Made once per build, by the front (it depends on the program and the
    memory plan only), whatever the number of kernel variants; a bytearray, not copied into bytes
    (the blob of a 650 MB model is 650 MB)."""
    pages = [i for i, b in enumerate(plan.buffers) if b.kind == "weights"]
    page_offset, pos = {}, 0
    for i in pages:
        pos = memory.align(pos, 256)
        page_offset[i] = pos
        pos += plan.buffers[i].size
    blob = bytearray(pos)
    for name, page, off in plan.weights:
        t = prog.tensors[name]
        start = page_offset[page] + off
        packing.encode_into(t.data, t.pack, memoryview(blob)[start:start + packing.stored_bytes(t.data, t.pack)])
        release(t.data)
    return blob, page_offset


def _schedule(prog, ops, plan, dispatches, exec_of, executables, lim, page_offset):
    """The module of one variant: `ops` are the program's ops that run a dispatch (`dispatches`, in
    order; a packer whose integer product packs its words itself runs none)."""
    buffers = [F.BufferInfo(b.kind, b.size, page_offset.get(i, 0), b.name) for i, b in enumerate(plan.buffers)]

    regs = Registers(prog.symbols, [(i, prog.tensors[n].shape) for i, n in enumerate(prog.inputs)]) \
        if prog.symbols else None

    def io(tensor_name, shown_name):
        root = prog.root(tensor_name)
        t, p = prog.tensors[tensor_name], plan.placement[root]
        dyn = () if is_static(t.shape) else tuple(regs.of(d) if isinstance(d, Dim) else None for d in t.shape)
        return F.IOInfo(shown_name, prog.tensors[root].dtype, int(prog.io_types[tensor_name]), upper_shape(t.shape),
                        p.buffer, p.offset, 4 * upper(numel(t.shape)), dyn)

    inputs = [io(n, n) for n in prog.inputs]
    outputs = [io(n, shown) for n, shown in zip(prog.outputs, prog.output_names)]
    commands = [(F.OP_UPLOAD_INPUT, i) for i in range(len(inputs))]
    info_dispatches = []
    from ..ir.program import op_flops
    for d, ex, op in zip(dispatches, exec_of, ops, strict=True):
        binds = []
        for slot, tensor in enumerate(d.tensors):
            p = plan.placement[prog.root(tensor)]
            binds.append((slot, p.buffer, p.offset, p.size))
        if is_static(d.grid):
            commands.append((F.OP_DISPATCH, ex, *d.grid, binds))
        else:
            commands.append((F.OP_DISPATCH_DYN, ex, *(regs.of(g) for g in d.grid), binds))
        info_dispatches.append({"name": d.name, "kind": d.kind, "nodes": d.nodes, "grid": [str(g) for g in d.grid]
                                if not is_static(d.grid) else list(d.grid),
                                "exec": ex, "config": d.config.as_dict(), "tensors": d.tensors,
                                "flops": op_flops(op), "precision": _precision(op, prog, d)})
    commands += [(F.OP_READBACK, i) for i in range(len(outputs))]
    symbols = []
    if regs is not None:
        for a, b, what in prog.constraints:     # sizes the graph needs equal, where no bound proves it
            regs.commands.append((F.OP_ASSERT_EQ, regs.of(a), regs.of(b), what))
        commands = regs.commands + commands     # registers first: assigned once per run
        symbols = [(s.name, s.lo, s.hi) for s in prog.symbols]
    info = {
        "model": prog.name,
        "dispatches": info_dispatches,
        "memory": {"arena_peak": plan.arena_peak, "intermediates_sum": plan.intermediates_sum,
                   "max_live": plan.max_live, "weights": sum(b.size for b in plan.buffers if b.kind == "weights"),
                   "weights_by_form": _weights_by_form(prog, plan)},
        "views": sorted(n for n, t in prog.tensors.items() if t.alias_of is not None),
    }
    if prog.symbols:   # the symbolic shapes of the boundary, for inspect
        info["shapes"] = {shown: [str(d) for d in prog.tensors[n].shape]
                          for n, shown in list(zip(prog.inputs, prog.inputs)) + list(zip(prog.outputs, prog.output_names))}
    limits = {k: int(v) for k, v in lim.items() if isinstance(v, int) and not isinstance(v, bool)}
    if not any(kir.uses_subgroups(d.kernel) for d in dispatches):
        limits.pop("subgroup_size", None)    # recorded only where a kernel relies on it
    if any(half_storage.uses_halves(d.kernel) for d in dispatches):
        limits[half_storage.FEATURE] = 1     # likewise the feature: the runtimes request it
    if any(kir.uses_packed_4x8(d.kernel) for d in dispatches):
        limits[kir.PACKED_4X8] = 1           # integer products (kernels/matmul_int8.py): a WGSL language feature
    return F.Module(executables, buffers, inputs, outputs, commands, limits, info,
                    regs.count if regs is not None else 0, symbols)
