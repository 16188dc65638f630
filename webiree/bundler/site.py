"""Write a build folder: the schedule module, weights, shaders and manifest
(and, as later stages land, the browser runtime and demo page).

Output layout (stable; see docs/schedule-module.md):

    DIR/manifest.json      model name, inputs, outputs, sizes, content hashes, build options, version
    DIR/model.wrm          the schedule module
    DIR/weights.bin        the weights blob
    DIR/shaders/*.wgsl     every executable, for reading (the module embeds them)
    DIR/shaders/*.spv      the same executables as SPIR-V 1.3 (when the targets include spirv)
    DIR/tokenizer.json     the Hugging Face tokenizer given with --tokenizer, byte for byte
    DIR/index.html ...     the page and the runtime (bundler/web.py); the page is the task's

The manifest's "task" says what the page is for (bundler/tasks.py): {"name": "text-embedding" |
"text-generation" | "image-classification" | "image-segmentation" | "generic", ...what its page needs},
named with --task or picked from the model's inputs and outputs.

Builds are reproducible: no timestamps, stable ordering, same bytes twice.

Content hashes (for webiree.js, which verifies what it downloads and caches the
weights under their hash):

    "hashes": {"module": "sha256-<hex>", "weights": "sha256-<hex>"}   whole files
    "weight_pages": [{"offset", "size", "sha256"}, ...]   weights.bin cut at the
        start of every weight page (the module's buffers of kind 'weights'): the
        ranges tile the whole file, so checking each range checks every byte, and
        the runtime can verify and upload one page while the next one streams in.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..compiler.driver import compile_model
from ..dtypes import name_of
from ..target import Target
from ..module import write_module
from ..module.format import variant_counts
from ..module.folder import MANIFEST_FILE, MODULE_FILE, SHADER_DIR, TOKENIZER_FILE, WEIGHTS_FILE
from ..version import __version__



def sha256_tag(data: bytes) -> str:
    """The manifest's hash notation (as in Subresource Integrity, but hex): 'sha256-<hex>'."""
    return "sha256-" + hashlib.sha256(data).hexdigest()


def weight_ranges(module, weights) -> list[dict]:
    """weights.bin cut at the start of every weight page: contiguous ranges covering the whole
    file (padding goes with the page before it), each with its SHA-256."""
    weights = memoryview(weights)
    cuts = sorted({0, len(weights)} | {b.blob_offset for b in module.buffers
                                       if b.kind == "weights" and b.size and b.blob_offset < len(weights)})
    return [{"offset": a, "size": b - a, "sha256": sha256_tag(weights[a:b])} for a, b in zip(cuts, cuts[1:])]


def write_build(result, out_dir, options: dict, pyodide: bool = False, tokenizer: bytes | None = None,
                task: dict | None = None) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shader_dir = out / SHADER_DIR
    if shader_dir.exists():
        shutil.rmtree(shader_dir)
    shader_dir.mkdir()
    module_bytes = write_module(result.module)
    (out / MODULE_FILE).write_bytes(module_bytes)
    (out / WEIGHTS_FILE).write_bytes(result.weights)
    for name, text in result.shaders:
        (shader_dir / name).write_text(text)
    for name, code in getattr(result, "spirv", None) or []:
        (shader_dir / name).write_bytes(code)
    files = {"module": MODULE_FILE, "weights": WEIGHTS_FILE, "shaders": [n for n, _ in result.shaders]
             + [n for n, _ in getattr(result, "spirv", None) or []]}
    if tokenizer is not None:
        (out / TOKENIZER_FILE).write_bytes(tokenizer)
        files["tokenizer"] = TOKENIZER_FILE
    elif (out / TOKENIZER_FILE).exists():
        (out / TOKENIZER_FILE).unlink()     # a rebuild without --tokenizer leaves no stale tokenizer behind
    m = result.module
    manifest = {
        "format": "webiree-site",
        "webiree_version": __version__,
        "model": m.info.get("model", "model"),
        "inputs": [{"name": io.name, "shape": list(io.shape), "type": name_of(io.onnx_type)} for io in m.inputs],
        "outputs": [{"name": io.name, "shape": list(io.shape), "type": name_of(io.onnx_type)} for io in m.outputs],
        "files": files,
        "sizes": {"module_bytes": len(module_bytes), "weights_bytes": len(result.weights),
                  "arena_bytes": result.plan.arena_peak},
        "hashes": {"module": sha256_tag(module_bytes), "weights": sha256_tag(result.weights)},
        "weight_pages": weight_ranges(m, result.weights),
        "dispatches": len(result.dispatches),
        "executables": len(m.executables),
        "variants": variant_counts(m),
        "build_options": options,
        "limits": m.limits,
        "task": task or {"name": "generic"},
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    from .web import write_site  # the browser runtime, demo page and a seeded sample input
    write_site(out, result, pyodide=pyodide, task=manifest["task"])
    return manifest


def resolve_target(limits) -> Target:
    """The compiler's Target: 'adapter' reads this machine's adapter (limits, subgroup size, type
    and shader-f16) through wgpu; presets ('default', 'gpu', 'cpu') and dicts go to Target.resolve."""
    if limits == "adapter":
        from ..hal_webgpu.wgpu_driver import adapter_info, adapter_limits
        have = adapter_limits()
        return Target.from_adapter(have, adapter_info().get("adapter_type", ""), have.get("subgroup_size", 0),
                                   features=("shader_f16",) if have.get("shader_f16") else ())
    return Target.resolve(limits)


def shader_validator(name: str, fmt: str, code) -> None:
    """Validate one executable: WGSL with naga (through wgpu-py), SPIR-V with spirv-val where it is
    installed. A rejection is a CompilerBug naming the dispatch."""
    if fmt == "wgsl":
        from ..hal_webgpu.wgpu_driver import validate_wgsl
        validate_wgsl(name, code)
    else:
        from ..wgsl_codegen.spirv import validate_spirv
        validate_spirv(name, code)


def _read_tokenizer(path) -> bytes:
    """The tokenizer file's bytes, checked to be a JSON object with a model section (read before
    compiling, so a wrong path fails fast)."""
    from ..errors import ModelError
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read the tokenizer {os.fspath(path)}: {e.strerror or e}",
                         hint="give --tokenizer a Hugging Face tokenizer.json") from None
    try:
        spec = json.loads(raw.decode("utf-8"))
    except ValueError:
        spec = None
    if not isinstance(spec, dict) or "model" not in spec:
        raise ModelError(f"{os.fspath(path)} is not a Hugging Face tokenizer.json (a JSON object with a model)",
                         hint="give --tokenizer the tokenizer.json saved by the tokenizers library")
    return raw


# What a default build carries: GPU-class kernels, CPU-class ones, and CPU-class ones whose matmuls
# broadcast within subgroups of 8 (lavapipe on AVX2) or 4 (SwiftShader): picked where the adapter
# runs exactly such subgroups (docs/performance.md, "Kernels chosen at load"); and the start tier of
# the SwiftShader kernels, which webiree.js runs while those compile (config.py START_ROWS).
DEFAULT_VARIANTS = "gpu,cpu,cpu-sg8,cpu-sg4,cpu-sg4-start"


def default_variants(target: Target, variants):
    """The kernel variants a build carries: as given, else DEFAULT_VARIANTS for a target that names
    no device class and no subgroup size (the default limits: it may meet any adapter), else one
    set (the target's)."""
    if variants is not None:
        return variants
    return DEFAULT_VARIANTS if not target.device_class and not target.subgroup_size else None


def compile(model, out_dir, input_shapes=None, *, limits="default", validate=True, dump_after=(), pyodide=False,
            targets=None, tokenizer=None, dims=None, generation=None, task=None, variants=None, tuning=None):
    """Compile an ONNX model (path, bytes or ModelProto) into `out_dir`.

    input_shapes: {input name: [dims]}: each dim an int or a range (min, max) / "min..max".
    dims: {symbolic dim name: int or range}, wherever the name appears. A range makes a dynamic
      build: one module serves every size in it (ir/sym.py, docs/schedule-module.md).
    limits: 'default' (WebGPU defaults; runs anywhere), 'gpu' / 'cpu' (the same limits, one class of
      adapter's kernels), 'adapter', or a dict.
    variants: the kernel variants the build carries ('gpu,cpu,cpu-sg8', 'gpu', a list; a device
      class, optionally '-sgN' for its matmuls broadcasting within subgroups of N): the runtimes
      pick one by the adapter when a session starts (docs/schedule-module.md, VARS). None:
      DEFAULT_VARIANTS for a target naming no device class (the default), else the target's one set.
    tuning: a tuning table (`webiree tune` writes one; a path or wgsl_codegen.tuning.Table): its measured
      kernel configurations replace the heuristic's where they apply (recorded in the manifest).
    pyodide: also copy Pyodide into out_dir/pyodide/ so python.html works offline.
    targets: 'wgsl' (default), 'spirv' (the module's executables are SPIR-V: native runtime only) or
      'wgsl,spirv' (a WGSL module); with spirv, shaders/ holds .spv files beside the .wgsl ones.
      None: $WEBIREE_TARGETS, else wgsl.
    tokenizer: a Hugging Face tokenizer.json, copied into the build as tokenizer.json and named in the
      manifest's files (webiree.text and webiree.js read it).
    generation: True, or a top-k limit (int; 0: greedy only), for a decoder with a KV cache: appends
      the generation head so the runtimes' generate() picks each token on the GPU (docs/generation.md).
    task: what the site's page is for (bundler/tasks.py): 'text-embedding', 'text-generation',
      'image-classification', 'image-segmentation' or 'generic'; None picks it from the model's inputs
      and outputs (and the tokenizer). A named task that does not fit is a ModelError. Recorded in the
      manifest as "task".
    Returns the CompileResult (dispatches, memory plan, module, ...).
    """
    from ..compiler.importer import parse_dim
    from .tasks import check_task_options, pick_task
    check_task_options(task, tokenizer is not None, generation is not None and generation is not False)
    shapes = {k: [parse_dim(d, f"input_shapes[{k!r}]") for d in v] for k, v in (input_shapes or {}).items()}
    dims = {k: parse_dim(v, f"dims[{k!r}]") for k, v in (dims or {}).items()}
    tokenizer_bytes = None if tokenizer is None else _read_tokenizer(tokenizer)
    target = resolve_target(limits)
    variants = default_variants(target, variants)
    result = compile_model(model, shapes, target, validate=shader_validator if validate else None,
                           dump_after=dump_after, targets=targets, dims=dims, generation=generation,
                           variants=variants, tuning=tuning)
    options = {"input_shapes": {k: [list(d) if isinstance(d, tuple) else d for d in v] for k, v in shapes.items()},
               "limits": limits if isinstance(limits, str) else "custom",
               **({"dims": {k: list(v) if isinstance(v, tuple) else v for k, v in dims.items()}} if dims else {}),
               "model_file": os.path.basename(os.fspath(model)) if isinstance(model, (str, os.PathLike)) else None}
    if result.module.variants:
        options["variants"] = [v.name for v in result.module.variants]
    if tuning is not None:
        options["tuning"] = os.path.basename(os.fspath(tuning)) if isinstance(tuning, (str, os.PathLike)) \
            else getattr(tuning, "source", "table")
    if "generation_top_k" in result.module.info:
        options["generation"] = {"top_k": result.module.info["generation_top_k"]}
    task_info = pick_task(result.module, task, tokenizer is not None)
    if result.spirv:   # recorded only when not the default (WGSL only)
        fmt = result.module.executables[0].format if result.module.executables else "wgsl"
        options["targets"] = "spirv" if fmt == "spirv" else "wgsl,spirv"
    try:
        result.manifest = write_build(result, out_dir, options, pyodide=pyodide, tokenizer=tokenizer_bytes,
                                      task=task_info)
    except OSError as e:
        from ..errors import WebireeError
        raise WebireeError(f"cannot write the build to {os.fspath(out_dir)}: {e.strerror or e}",
                           hint="give --out a folder path that can be created and written") from None
    return result
