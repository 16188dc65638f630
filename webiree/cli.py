"""The `webiree` command: build, run, inspect, serve, demo.

Every user error ends in one line `webiree: error: ...` (plus a hint line)
and a non-zero exit; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .errors import FeedError, ShapeError, WebireeError

EXIT_USER_ERROR = 2
EXIT_INTERNAL = 3


def _parse_shapes(items) -> dict:
    """--input-shape NAME=D0,D1,...: each dim a size or a range MIN..MAX."""
    from .compiler.importer import parse_dim
    shapes = {}
    for item in items or []:
        name, sep, dims = item.rpartition("=")
        if not sep or not name:
            raise ShapeError(f"--input-shape {item!r} is not NAME=D0,D1,...",
                             hint="e.g. --input-shape input_ids=1,128 or input_ids=1,1..512")
        parts = [d.strip() for d in dims.replace("x", ",").split(",") if d.strip()]
        shapes[name] = [parse_dim(d, f"--input-shape {item!r}") for d in parts]
        if any(d == 0 for d in shapes[name]):
            raise ShapeError(f"--input-shape {item!r}: dims must be positive")
    return shapes


def _parse_dims(items) -> dict:
    """--dim NAME=N or NAME=MIN..MAX: bound a named symbolic dim wherever it appears."""
    from .compiler.importer import parse_dim
    out = {}
    for item in items or []:
        name, sep, spec = item.partition("=")
        if not sep or not name.strip():
            raise ShapeError(f"--dim {item!r} is not NAME=MIN..MAX", hint="e.g. --dim seq=1..512")
        out[name.strip()] = parse_dim(spec, f"--dim {name.strip()}")
    return out


def cmd_build(args) -> int:
    from .bundler.site import compile as build

    t0 = time.perf_counter()
    dump = tuple(args.dump_after or ())
    res = build(args.model, args.out, _parse_shapes(args.input_shape), limits=args.limits,
                validate=not args.no_validate, dump_after=dump, pyodide=args.pyodide, targets=args.target,
                tokenizer=args.tokenizer, dims=_parse_dims(args.dim), generation=args.generation, task=args.task,
                variants=args.variants, tuning=args.tuning)
    for stage in dump:
        print(f"// ---- after {stage}\n{res.dumps.get(stage, '')}")
    m = res.manifest
    print(f"webiree: built {m['model']} -> {args.out} in {time.perf_counter() - t0:.2f} s: "
          f"{m['dispatches']} dispatches, {m['executables']} executables, "
          f"module {m['sizes']['module_bytes']} B, weights {m['sizes']['weights_bytes']} B, "
          f"arena {m['sizes']['arena_bytes']} B; page: {m['task']['name']}" +
          (f"; kernel variants {', '.join(v['name'] for v in m['variants'])} (picked by the adapter at load)"
           if m["variants"] else ""))
    return 0


def _load_input(spec: str):
    import numpy as np

    name, sep, path = spec.partition("=")
    if not sep:
        raise FeedError(f"--input {spec!r} is not NAME=FILE.npy")
    p = Path(path)
    if not p.exists():
        raise FeedError(f"--input {name}: no such file {path}")
    try:
        return name, np.load(p, allow_pickle=False)
    except Exception as e:
        raise FeedError(f"--input {name}: {path} is not a .npy file ({type(e).__name__})") from None


def _summary(a) -> str:
    import numpy as np

    if a.size == 0:
        return "empty"
    if a.dtype == np.bool_:
        return f"{int(a.sum())} true of {a.size}"
    f = a.astype(np.float64)
    text = f"min {f.min():.6g} max {f.max():.6g} mean {f.mean():.6g}"
    if a.ndim >= 1 and a.shape[-1] > 1 and a.size == a.shape[-1]:
        text += f" argmax {int(f.argmax())}"
    return text


def cmd_run(args) -> int:
    import numpy as np

    from .session import InferenceSession

    sess = InferenceSession(args.dir)
    feeds = dict(_load_input(s) for s in args.input or [])
    if not feeds and args.random:
        rng = np.random.default_rng(0)
        from .session import NUMPY_OF_ONNX
        for io in sess.module.inputs:
            dt = NUMPY_OF_ONNX[io.onnx_type]
            feeds[io.name] = (rng.standard_normal(io.shape).astype(dt) if np.dtype(dt).kind == "f"
                              else rng.integers(0, 2, io.shape).astype(dt))
    t0 = time.perf_counter()
    outs = sess.run(None, feeds)
    ms = (time.perf_counter() - t0) * 1e3
    for io, a in zip(sess.module.outputs, outs):
        print(f"{io.name}: shape {list(a.shape)} {a.dtype} {_summary(a)}")
        if args.output_dir:
            try:
                Path(args.output_dir).mkdir(parents=True, exist_ok=True)
                np.save(Path(args.output_dir) / f"{io.name.replace('/', '_')}.npy", a)
            except OSError as e:
                raise WebireeError(f"cannot write {io.name} to {args.output_dir}: {e.strerror or e}",
                                   hint="give --output-dir a folder that can be created and written") from None
    print(f"latency {ms:.2f} ms")
    return 0


def cmd_inspect(args) -> int:
    from .module.dump import describe_build

    print(describe_build(args.dir))
    return 0


def cmd_serve(args) -> int:
    from .bundler.server import serve

    try:
        serve(args.dir, host=args.host, port=args.port, isolate=args.isolate)
    except ValueError as e:
        raise WebireeError(str(e), hint="give the folder written by `webiree build`") from None
    return 0


def cmd_bench(args) -> int:
    from .bench import bench, wrong_results
    from .errors import ModelError

    if not Path(args.model).is_file():
        raise ModelError(f"no such file: {args.model}", hint="give an .onnx model")
    report = bench(args.model, args.runs, args.warmup, args.limits, args.inputs, args.iree,
          _parse_shapes(args.input_shape), args.json, iree_vulkan_target=args.iree_vulkan_target,
          spirv=args.spirv, submit_chunk=args.submit_chunk, trace_out=args.trace,
          dims=_parse_dims(args.dim), dynamic=_parse_dims(args.dynamic))
    wrong = wrong_results(report)
    if wrong:
        print(f"webiree bench: {', '.join(wrong)} differ from onnxruntime by more than "
              f"{report.get('tolerance', 1e-4):.1e} of the output's scale: the timings above are of wrong results", file=sys.stderr)
        return 1
    return 0


def cmd_tune(args) -> int:
    from .errors import ModelError
    from .tune import tune

    if not Path(args.model).is_file():
        raise ModelError(f"no such file: {args.model}", hint="give an .onnx model")
    tune(args.model, args.out, _parse_shapes(args.input_shape), runs=args.runs, warmup=args.warmup,
         limits=args.limits, inputs_path=args.inputs, dims=_parse_dims(args.dim))
    return 0


def cmd_demo(args) -> int:
    from .demo_model import run_demo

    return run_demo(args.out)


def build_parser() -> argparse.ArgumentParser:
    from .bundler.tasks import TASKS

    p = argparse.ArgumentParser(prog="webiree", description="Compile ONNX models to WebGPU and run them.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="compile MODEL.onnx into a site folder")
    b.add_argument("model")
    b.add_argument("--out", required=True, help="output folder")
    b.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...",
                   help="an input's shape: each dim a size or a range MIN..MAX (e.g. input_ids=1,1..512)")
    b.add_argument("--dim", action="append", metavar="NAME=MIN..MAX",
                   help="bound (or pin, NAME=N) a named symbolic dim wherever it appears, e.g. seq=1..512")
    b.add_argument("--limits", default="default", choices=["default", "gpu", "cpu", "adapter"],
                   help="the target: WebGPU's default limits (runs anywhere, with kernels for GPU- and CPU-class "
                        "adapters both, picked at load; 'gpu' / 'cpu': only that class's kernels) or this "
                        "machine's adapter")
    b.add_argument("--variants", metavar="gpu,cpu,cpu-sg8", default=None,
                   help="the kernel variants the build carries: adapter classes gpu / cpu, each optionally with "
                        "-sg4/-sg8/-sg16 (matmuls broadcasting within subgroups of that size), then optionally -f16 "
                        "(float16 activations stored as halves, for adapters with shader-f16), then optionally "
                        "-start (that variant's start tier: small kernels webiree.js runs while its pipelines "
                        "compile); default: gpu,cpu,cpu-sg8,cpu-sg4,cpu-sg4-start with the default limits, else "
                        "the target's one set; the runtimes pick one by the adapter at load")
    b.add_argument("--tuning", metavar="TABLE", default=None,
                   help="a tuning table (webiree tune writes one): its measured kernel configurations replace "
                        "the heuristic's where they apply to the target")
    b.add_argument("--no-validate", action="store_true", help="skip naga validation (no GPU adapter needed)")
    b.add_argument("--target", "--targets", dest="target", default=None, metavar="wgsl|spirv|wgsl,spirv",
                   help="shader targets: the first is the module's executable format (default wgsl; spirv "
                        "runs natively only), every one is written to shaders/")
    b.add_argument("--pyodide", action="store_true",
                   help="copy Pyodide into the site (pyodide/, 13 MB) so python.html runs offline")
    b.add_argument("--tokenizer", metavar="tokenizer.json",
                   help="copy a Hugging Face tokenizer.json into the site (named in the manifest)")
    b.add_argument("--generation", nargs="?", const=True, default=None, type=int, metavar="TOP_K",
                   help="a decoder with a KV cache: append the generation head (each token picked on the GPU; "
                        "top-k sampling up to TOP_K, default 64, 0: greedy only); see docs/generation.md")
    b.add_argument("--task", choices=list(TASKS), default=None,
                   help="what the site's page is for (default: picked from the model's inputs and outputs): "
                        "text-embedding (an encoder + --tokenizer: two sentences, their embeddings' cosine "
                        "similarity), text-generation (a decoder built with --generation + --tokenizer: tokens "
                        "streamed into the page), image-classification, image-segmentation, generic")
    b.add_argument("--dump-after", action="append", choices=["import", "lower", "fuse", "memory", "kernels"],
                   help="print a stage's product")
    b.set_defaults(fn=cmd_build)

    r = sub.add_parser("run", help="run a built model natively (wgpu-py)")
    r.add_argument("dir")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    r.add_argument("--random", action="store_true", help="feed seeded random inputs when none are given")
    r.add_argument("--output-dir", help="write OUT/<output name>.npy")
    r.set_defaults(fn=cmd_run)

    i = sub.add_parser("inspect", help="print the compiled program")
    i.add_argument("dir")
    i.set_defaults(fn=cmd_inspect)

    s = sub.add_parser("serve", help="serve a built site on loopback")
    s.add_argument("dir")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--isolate", action="store_true", help="send COOP/COEP headers")
    s.set_defaults(fn=cmd_serve)

    bn = sub.add_parser("bench", help="median latency vs. onnxruntime (and IREE), GFLOP/s, memory")
    bn.add_argument("model", help="an .onnx file")
    bn.add_argument("--runs", type=int, default=20)
    bn.add_argument("--warmup", type=int, default=3)
    bn.add_argument("--limits", default="adapter", choices=["default", "gpu", "cpu", "adapter"])
    bn.add_argument("--inputs", help=".npz of inputs keyed by input name (default: seeded random)")
    bn.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...")
    bn.add_argument("--dim", action="append", metavar="NAME=N", help="pin a named symbolic dim")
    bn.add_argument("--dynamic", action="append", metavar="NAME=MIN..MAX",
                    help="also time one build for this range of the dim, run at the pinned shape")
    bn.add_argument("--iree", action="store_true", help="also run IREE vulkan-spirv and llvm-cpu (pip install -e .[iree])")
    bn.add_argument("--spirv", action="store_true", help="also build and time the SPIR-V executables")
    bn.add_argument("--iree-vulkan-target", help="IREE's --iree-vulkan-target (its default has no int64)")
    bn.add_argument("--submit-chunk", type=int, default=0, metavar="N",
                    help="also time the build submitted every N dispatches as each run encodes them (the GPU "
                         "starts while the host encodes)")
    bn.add_argument("--json", help="write the report as JSON")
    bn.add_argument("--trace", metavar="OUT.json", help="write one profiled run's per-dispatch GPU timeline (the "
                    "ONNX nodes each dispatch fused) as a Chrome trace / Perfetto JSON")
    bn.set_defaults(fn=cmd_bench)

    t = sub.add_parser("tune", help="time each dispatch's candidate kernels on this adapter; write a tuning table")
    t.add_argument("model", help="an .onnx file")
    t.add_argument("--out", required=True, metavar="TABLE.json", help="where to write the table (webiree build --tuning)")
    t.add_argument("--runs", type=int, default=10, help="profiled runs per round")
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--limits", default="adapter", choices=["default", "gpu", "cpu", "adapter"],
                   help="the target the candidates are built for (default: this adapter's)")
    t.add_argument("--inputs", help=".npz of inputs keyed by input name (default: seeded random)")
    t.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...")
    t.add_argument("--dim", action="append", metavar="NAME=N", help="pin a named symbolic dim")
    t.set_defaults(fn=cmd_tune)

    d = sub.add_parser("demo", help="build the demo model, run it natively, compare with onnxruntime")
    d.add_argument("--out", default="site", help="where to write the site")
    d.set_defaults(fn=cmd_demo)
    return p


def main(argv=None) -> int:
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    args = build_parser().parse_args(argv)
    try:
        rc = args.fn(args)
        sys.stdout.flush()      # a reader gone early fails here, in the handlers below, not at exit
        return rc
    except WebireeError as e:
        if args.debug:
            raise
        print(f"webiree: error: {e}", file=sys.stderr)
        if e.hint:
            print(f"  hint: {e.hint}", file=sys.stderr)
        return EXIT_INTERNAL if e.kind == "internal" else EXIT_USER_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of our output went away (`webiree inspect DIR | head`): not an error of ours;
        # stdout is pointed at /dev/null so the interpreter's final flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a bug: still one line unless --debug
        if args.debug:
            raise
        print(f"webiree: internal error: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        print("  hint: rerun with --debug and report the traceback", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
