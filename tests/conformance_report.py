"""The ONNX backend node test suite, run on webiree (native, wgpu-py).

    .venv/bin/python -m tests.conformance_report            # run everything, write docs/conformance.md
    .venv/bin/python -m tests.conformance_report -k gather  # only cases whose name contains 'gather' (no report)
    .venv/bin/python -m tests.conformance_report --jobs 1   # fewer worker processes

Every node test case of the installed `onnx` package is compiled once with
`webiree.onnx_backend.WebireeBackend` (webiree.compile + InferenceSession) and
its outputs compared with the case's expected outputs with the suite's own
check (same shape, same dtype, `np.testing.assert_allclose` with rtol=1e-3,
atol=1e-7). A case is

- *passed*: it matched, and a webiree kernel computed its outputs from its run-time inputs,
- *folded*: it matched, but no kernel read a run-time input: the compiler computed every
  output at compile time (every input compiled in as a shape parameter, or outputs that do
  not depend on the inputs' values); counted apart, outside the pass count and the op types,
- *failed* (with the error), or
- *excluded*, with one reason from `EXCLUSIONS`, decided from the model and
  its data before it runs: what the case needs is outside what WebGPU (32-bit
  types, static shapes) can represent. Hard-but-computable ops are failures,
  never exclusions.

The test data (model.onnx + test_data_set_0/{input,output}_*.pb per case) is
generated once from `onnx.backend.test.case.node` into tests/.data/onnx-node
(gitignored; regenerated when the onnx version changes), the same layout
`onnx/backend/test/data/node` has in a source checkout.

Cases run in worker processes (one compile + run per case, in-process), each
with a time limit; a worker that hangs or crashes is replaced and its case
reported as failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import selectors
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "tests" / ".data" / "onnx-node"
REPORT = ROOT / "docs" / "conformance.md"
# the ratchet: every case named here must pass (written with the report; tests/test_conformance.py)
PASSING = ROOT / "tests" / "conformance_passing.txt"
CASE_TIMEOUT_S = 60.0
RTOL, ATOL = 1e-3, 1e-7          # onnx.backend.test.case.node.expect's defaults (every node case uses them)

# the only reasons a case may be excluded (README of the report explains each)
EXCLUSIONS = {
    "training op": "ops of the ai.onnx.preview.training domain (gradients, optimizers)",
    "sequence/optional/map/string types": "inputs, outputs or ops on values that are not numeric tensors",
    "64-bit float required": "float64 inputs or outputs (WGSL has no f64)",
    "float8/int4 types": "float8, float4, int4/int2 and complex types in the inputs, outputs or constants "
                         "(kernels compute in f32/i32/u32; float16 and bfloat16 are computed in f32 and "
                         "rounded to their type)",
    "64-bit integers beyond int32": "int64/uint64 values outside the 32-bit range WGSL computes with",
    "random numbers": "outputs drawn from a random generator (cannot match the reference bit for bit)",
    "dynamic shape/data-dependent output shape": "the output shape depends on the values of a data input",
}

TRAINING_DOMAINS = {"ai.onnx.preview.training"}
RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
NON_TENSOR_OPS = {"SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
                  "SequenceLength", "SequenceMap", "SplitToSequence", "ConcatFromSequence", "Optional",
                  "OptionalGetElement", "OptionalHasElement", "StringNormalizer", "StringConcat", "StringSplit",
                  "RegexFullMatch", "TfIdfVectorizer"}
# op -> input positions whose *values* decide the output shape (a data input, not a parameter)
# (ImageDecoder: the image's dimensions are read from the encoded bytes)
DATA_DEPENDENT_SHAPE = {"NonZero": (0,), "Unique": (0,), "Compress": (1,), "NonMaxSuppression": (0, 1, 2, 3, 4),
                        "ImageDecoder": (0,)}


# what is known about a remaining failure (shown beside its error in the report)
FAILURE_NOTES = {
    "test_dft_inverse": "the result is the exact 0 (twiddles are exact at multiples of pi/2); the expected output "
                        "holds the reference's own float32 rounding, 1.9e-7, above atol=1e-7",
    "test_dft_inverse_opset19": "as test_dft_inverse",
}
# the reference computes these in float16 / bfloat16 numpy arithmetic, rounding every intermediate (the scores,
# each step of the softmax); webiree computes the op in f32 and rounds its result once (as onnxruntime's CPU
# kernels do): they differ by one ulp of the narrow type, above rtol=1e-3 (a bfloat16 ulp is 2^-8 relative)
for _case in ("3d_causal_bf16", "4d_attn_mask_causal_bf16", "4d_causal_bf16", "4d_causal_fp16", "4d_causal_padded_kv_bf16",
              "4d_padded_kv_bf16"):
    for _name in (f"test_attention_{_case}", f"test_attention_{_case}_expanded"):
        FAILURE_NOTES[_name] = ("one narrow-type ulp: the reference rounds every intermediate to the narrow type, "
                                "webiree computes in f32 and rounds the result")


# onnxruntime's contrib operators are not in the ONNX suite: each is tested against onnxruntime CPU
# in tests/test_contrib_ops.py, tests/test_contrib_attention.py and tests/test_contrib_quant.py. The
# report lists them here.
CONTRIB = [
    ("Gelu, BiasGelu", "erf form; BiasGelu's bias broadcast over the last dim"),
    ("FastGelu", "tanh approximation, with or without its bias input"),
    ("QuickGelu", "default or given alpha"),
    ("BiasAdd, BiasSplitGelu", "as documented (onnxruntime has no CPU kernel: tested against numpy)"),
    ("SkipLayerNormalization", "beta and bias optional; mean, inv_std_var and input_skip_bias_sum outputs; "
                               "skip [S, H] or [1, S, H] broadcast; 2-D input"),
    ("SkipSimplifiedLayerNormalization", "bias optional; inv_std_var and input_skip_bias_sum outputs (the mean "
                                         "output is refused: a simplified norm has none)"),
    ("SimplifiedLayerNormalization (default domain)", "any axis; inv_std_var output; stash_type 1 (11 computed "
                                                      "in float32)"),
    ("LayerNormalization before opset 17 (default domain)", "Mean and InvStdDev outputs"),
    ("FusedMatMul", "transA, transB, alpha, transBatchA/B on batched and broadcast shapes"),
    ("FusedConv", "activation Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid, HardSwish with its "
                  "activation_params; the Z sum input"),
    ("EmbedLayerNormalization", "segment inputs optional; position_ids [1, S] or [B, S]; mask_index; "
                                "embedding_sum output"),
    ("Attention", "packed QKV with or without bias; qkv_hidden_sizes; mask_index as key lengths, end/start "
                  "positions, 2-D and 3-D masks; unidirectional; scale; mask_filter_value; attention_bias; "
                  "past / present (refused: do_rotary, past_present_share_buffer, 4-D mask_index, "
                  "past_sequence_length)"),
    ("MultiHeadAttention", "separate, packed QKV or packed KV inputs; K/V per head; bias; key_padding_mask "
                           "(lengths, positions, 2-D, 3-D); attention_bias; unidirectional; past and present; "
                           "the qk output (refused: cache_indirection, the 3 x batch + 2 mask)"),
    ("RotaryEmbedding", "3-D or 4-D input; position_ids as one offset or per token; interleaved or not; "
                        "partial rotary_embedding_dim (refused: is_packed_batching)"),
    ("MatMulNBits", "bits 2, 4, 8; block_size 16 and up; K not a multiple of block_size; packed uint8 or float "
                    "zero points (or the default); scales and zero points 1-D or 2-D; bias; A 1-D, 2-D, batched, "
                    "symbolic; any accuracy_level (computed in float32); g_idx only when it is k // block_size; "
                    "B stays packed, dequantized inside the matmul's loads (refused: weight_prepacked)"),
    ("GatherBlockQuantized", "uint8 data of 2, 4 or 8 bits (gather_axis 0, quantize_axis last); int4 / uint4 "
                             "constant data on any axes; with or without zero points; int32 / int64 indices, "
                             "negative or out of range (zeros) (refused: the float8 / float4 data types)"),
    ("GroupQueryAttention", "num_heads a multiple of kv_num_heads (grouped or equal); separate Q, K, V or packed "
                            "QKV; past_key / past_value in BNSH, absent or of length 0 (a prompt) or symbolic (one "
                            "build decodes every step), present_key / present_value of past + sequence length; "
                            "prompt, decode and chunk steps; seqlens_k read per batch entry (right padding); "
                            "total_sequence_length checked against the shapes where known; do_rotary with cos/sin "
                            "caches, interleaved or not, partial rotary, position_ids; local_window_size; softcap; "
                            "scale; attention_bias; head_sink and smooth_softmax (refused: causal=0, qk_output / "
                            "the output_qk output, sliding_window_cache, a quantized KV cache, q_norm_weight / "
                            "k_norm_weight)"),
    ("not yet", "DynamicQuantizeLSTM; any other com.microsoft op is refused by name"),
]


def _onnx():
    import onnx
    return onnx


# ----------------------------------------------------------------------------
# test data

def ensure_node_data(data_dir: Path = DATA_DIR) -> Path:
    """Write the node test cases of the installed onnx as files, once per onnx version."""
    onnx = _onnx()
    stamp = data_dir / "STAMP.json"
    if stamp.exists():
        try:
            if json.loads(stamp.read_text()).get("onnx") == onnx.__version__:
                return data_dir
        except ValueError:
            pass
    import shutil
    import warnings

    import numpy as np
    from onnx import numpy_helper
    from onnx.backend.test.case import node as node_cases

    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node_cases.collect_testcases()

    def proto(value, vi):
        t = vi.type
        if t.HasField("sequence_type"):
            return numpy_helper.from_list(value, vi.name)
        if t.HasField("optional_type"):
            return numpy_helper.from_optional(value, vi.name)
        if t.HasField("map_type"):
            return numpy_helper.from_dict(value, vi.name)
        if isinstance(value, onnx.TensorProto):
            return value
        return numpy_helper.from_array(np.asarray(value), vi.name)

    index = {}
    for case in cases:
        d = data_dir / case.name
        d.mkdir()
        (d / "model.onnx").write_bytes(case.model.SerializeToString())
        for k, (inputs, outputs) in enumerate(case.data_sets):
            s = d / f"test_data_set_{k}"
            s.mkdir()
            for j, v in enumerate(inputs):
                (s / f"input_{j}.pb").write_bytes(proto(v, case.model.graph.input[j]).SerializeToString())
            for j, v in enumerate(outputs):
                (s / f"output_{j}.pb").write_bytes(proto(v, case.model.graph.output[j]).SerializeToString())
        index[case.name] = {"rtol": case.rtol, "atol": case.atol}
    (data_dir / "index.json").write_text(json.dumps(index, indent=0, sort_keys=True))
    stamp.write_text(json.dumps({"onnx": onnx.__version__, "cases": len(cases)}))
    return data_dir


def case_names(data_dir: Path = DATA_DIR) -> list[str]:
    return sorted(json.loads((data_dir / "index.json").read_text()))


def _load_value(path: Path, type_proto):
    onnx = _onnx()
    from onnx import numpy_helper

    raw = path.read_bytes()
    if type_proto.HasField("sequence_type"):
        p = onnx.SequenceProto()
        p.ParseFromString(raw)
        return numpy_helper.to_list(p)
    if type_proto.HasField("optional_type"):
        p = onnx.OptionalProto()
        p.ParseFromString(raw)
        return numpy_helper.to_optional(p)
    if type_proto.HasField("map_type"):
        p = onnx.MapProto()
        p.ParseFromString(raw)
        return numpy_helper.to_dict(p)
    t = onnx.TensorProto()
    t.ParseFromString(raw)
    return numpy_helper.to_array(t)


def load_case(name: str, data_dir: Path = DATA_DIR):
    """(model, [(inputs, expected outputs)]) of one case."""
    onnx = _onnx()
    d = data_dir / name
    model = onnx.load(str(d / "model.onnx"))
    sets = []
    for s in sorted(d.glob("test_data_set_*")):
        ins = [_load_value(s / f"input_{j}.pb", model.graph.input[j].type)
               for j in range(len(list(s.glob("input_*.pb"))))]
        outs = [_load_value(s / f"output_{j}.pb", model.graph.output[j].type)
                for j in range(len(list(s.glob("output_*.pb"))))]
        sets.append((ins, outs))
    return model, sets


# ----------------------------------------------------------------------------
# classification

def _all_nodes(graph):
    onnx = _onnx()
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_nodes(g)


def op_type_of(name: str, model) -> str:
    """The op a case tests: its single node's type, or for an `_expanded` case the op it expands."""
    nodes = list(model.graph.node)
    if "_expanded" not in name and len(nodes) == 1:
        n = nodes[0]
        return n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
    return ""   # resolved from the base case by the caller


def exclusion_reason(model, data_sets) -> str | None:
    onnx = _onnx()
    import numpy as np
    from onnx import TensorProto as T

    nodes = list(_all_nodes(model.graph))
    domains = {n.domain for n in nodes}
    if domains & TRAINING_DOMAINS:
        return "training op"
    io = list(model.graph.input) + list(model.graph.output)
    elem_types = set()
    for vi in io:
        if not vi.type.HasField("tensor_type"):
            return "sequence/optional/map/string types"
        elem_types.add(vi.type.tensor_type.elem_type)
    for n in nodes:
        if n.op_type in NON_TENSOR_OPS:
            return "sequence/optional/map/string types"
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                elem_types.add(a.t.data_type)
            if a.type in (onnx.AttributeProto.STRING, onnx.AttributeProto.STRINGS) and \
                    a.name.endswith(("_strings", "stopwords", "keys_strings", "values_strings")):
                return "sequence/optional/map/string types"
    for t in model.graph.initializer:
        elem_types.add(t.data_type)
    if T.STRING in elem_types:
        return "sequence/optional/map/string types"
    if T.DOUBLE in elem_types:
        return "64-bit float required"
    narrow = {T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ,
              T.INT4, T.UINT4, T.COMPLEX64, T.COMPLEX128}
    for extra in ("FLOAT4E2M1", "FLOAT8E8M0", "INT2", "UINT2"):
        if hasattr(T, extra):
            narrow.add(getattr(T, extra))
    if elem_types & narrow:
        return "float8/int4 types"
    if any(n.op_type in RANDOM_OPS for n in nodes):
        return "random numbers"
    for n in nodes:
        if n.op_type == "Dropout":
            graph_inputs = {vi.name for vi in model.graph.input}
            if len(n.input) > 2 and n.input[2] and n.input[2] in graph_inputs:
                pos = [vi.name for vi in model.graph.input].index(n.input[2])
                if any(bool(np.asarray(ins[pos]).reshape(-1)[0]) for ins, _ in data_sets if pos < len(ins)):
                    ratio_pos = [vi.name for vi in model.graph.input].index(n.input[1]) \
                        if len(n.input) > 1 and n.input[1] in graph_inputs else None
                    if ratio_pos is None or any(float(np.asarray(ins[ratio_pos]).reshape(-1)[0]) != 0.0
                                                for ins, _ in data_sets):
                        return "random numbers"
    graph_inputs = [vi.name for vi in model.graph.input]
    for n in nodes:
        for pos in DATA_DEPENDENT_SHAPE.get(n.op_type, ()):
            if pos < len(n.input) and n.input[pos] in graph_inputs:
                return "dynamic shape/data-dependent output shape"
    for ins, outs in data_sets:
        for v in list(ins) + list(outs):
            a = np.asarray(v) if not isinstance(v, (list, dict)) else None
            if a is not None and a.dtype in (np.int64, np.uint64) and a.size:
                if int(a.min()) < -(1 << 31) or int(a.max()) >= (1 << 31):
                    return "64-bit integers beyond int32"
    return None


# ----------------------------------------------------------------------------
# running one case (inside a worker)

def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    text = re.sub(r"\s+", " ", text)
    return text[:400]


def run_case(name: str, data_dir: Path = DATA_DIR) -> dict:
    import warnings

    import numpy as np

    t0 = time.perf_counter()
    model, sets = load_case(name, data_dir)
    result = {"name": name, "op": op_type_of(name, model)}
    reason = exclusion_reason(model, sets)
    if reason is not None:
        result.update(status="excluded", reason=reason)
        return result
    from webiree.onnx_backend import WebireeBackend

    folded = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = WebireeBackend.prepare(model, "CPU")
            for inputs, expected in sets:
                outputs = list(rep.run(inputs))
                folded.append(rep.last_run.folded)
                np.testing.assert_equal(len(outputs), len(expected))
                for i, (got, ref) in enumerate(zip(outputs, expected)):
                    ref = np.asarray(ref)
                    np.testing.assert_array_equal(got.shape, ref.shape, err_msg=f"Output {i} has incorrect shape")
                    np.testing.assert_equal(got.dtype, ref.dtype, err_msg=f"Output {i} has incorrect dtype")
                    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL, err_msg=f"Output {i}")
    except Exception as e:  # noqa: BLE001  (every failure is a result)
        result.update(status="failed", error=_short(e))
    else:
        result.update(status="folded" if all(folded) else "passed")
        if rep.deferred:
            result["specialized"] = list(rep.deferred)
    result["seconds"] = round(time.perf_counter() - t0, 3)
    return result


def worker_main() -> None:
    """Read case names on stdin, write one JSON result per line on the protocol pipe."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)   # anything else printed goes to stderr
    data_dir = Path(os.environ.get("WEBIREE_CONFORMANCE_DATA", DATA_DIR))
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        try:
            res = run_case(name, data_dir)
        except Exception as e:  # noqa: BLE001
            res = {"name": name, "op": "", "status": "failed", "error": "runner: " + _short(e)}
        proto.write(json.dumps(res) + "\n")


# ----------------------------------------------------------------------------
# the pool

class _Worker:
    def __init__(self, data_dir: Path, log):
        env = dict(os.environ, WEBIREE_CONFORMANCE_DATA=str(data_dir), PYTHONUNBUFFERED="1")
        env.setdefault("XDG_RUNTIME_DIR", "/tmp/webiree-xdg")
        os.makedirs(env["XDG_RUNTIME_DIR"], exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.conformance_report", "--worker"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                     text=True, bufsize=1)
        self.case: str | None = None
        self.started = 0.0

    def send(self, name: str):
        self.case, self.started = name, time.monotonic()
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()

    def kill(self):
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()


def run_all(names: list[str], data_dir: Path = DATA_DIR, jobs: int = 2, timeout: float = CASE_TIMEOUT_S,
            progress=None) -> list[dict]:
    todo = collections.deque(names)
    results: dict[str, dict] = {}
    log = open(os.devnull, "w") if not os.environ.get("WEBIREE_CONFORMANCE_LOG") else \
        open(os.environ["WEBIREE_CONFORMANCE_LOG"], "a")
    sel = selectors.DefaultSelector()
    workers: list[_Worker] = []

    def start():
        w = _Worker(data_dir, log)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        workers.append(w)
        return w

    def retire(w, result=None):
        sel.unregister(w.proc.stdout)
        workers.remove(w)
        w.kill()
        if result is not None:
            results[result["name"]] = result

    try:
        for _ in range(max(1, min(jobs, len(todo)))):
            w = start()
            w.send(todo.popleft())
        while workers:
            for key, _ in sel.select(timeout=1.0):
                w = key.data
                line = w.proc.stdout.readline()
                if not line:   # the worker died (a crash in the driver)
                    case = w.case
                    retire(w, {"name": case, "op": "", "status": "failed",
                               "error": f"worker crashed (exit code {w.proc.poll()})"})
                    if todo:
                        start().send(todo.popleft())
                    continue
                res = json.loads(line)
                results[res["name"]] = res
                if progress:
                    progress(res, len(results), len(names))
                if todo:
                    w.send(todo.popleft())
                else:
                    w.case = None
                    retire(w)
            now = time.monotonic()
            for w in list(workers):
                if w.case is not None and now - w.started > timeout:
                    retire(w, {"name": w.case, "op": "", "status": "failed",
                               "error": f"timeout: no result within {timeout:.0f} s"})
                    if todo:
                        start().send(todo.popleft())
    finally:
        for w in list(workers):
            w.kill()
        log.close()
    return [results[n] for n in names if n in results]


def resolve_ops(results: list[dict], data_dir: Path = DATA_DIR) -> None:
    """Fill the op of `_expanded` cases (and of crashed cases) from their base case."""
    onnx = _onnx()
    by_name = {r["name"]: r for r in results}
    for r in results:
        if r.get("op"):
            continue
        base = re.sub(r"_expanded(_ver\d+)?$", "", r["name"])
        if base in by_name and by_name[base].get("op"):
            r["op"] = by_name[base]["op"]
            continue
        try:
            m = onnx.load(str(data_dir / base / "model.onnx"))
            r["op"] = op_type_of(base, m) or m.graph.node[0].op_type
        except Exception:  # noqa: BLE001
            r["op"] = "?"


# ----------------------------------------------------------------------------
# the report

def summarize(results: list[dict]) -> dict:
    counts = collections.Counter(r["status"] for r in results)
    ops = collections.defaultdict(collections.Counter)
    for r in results:
        ops[r["op"]][r["status"]] += 1
    return {"passed": counts["passed"], "folded": counts["folded"], "failed": counts["failed"],
            "excluded": counts["excluded"], "total": len(results), "ops": ops,
            "ops_passing": sorted(o for o, c in ops.items() if c["passed"]),
            "ops_all_passing": sorted(o for o, c in ops.items() if c["passed"] and not c["failed"])}


def write_report(results: list[dict], seconds: float, path: Path = REPORT, jobs: int = 2) -> str:
    import onnx

    s = summarize(results)
    lines = [
        "# ONNX conformance: the backend node test suite",
        "",
        "Generated by `.venv/bin/python -m tests.conformance_report` (writes this file; "
        "`tests/test_conformance.py` runs the same cases and checks that every case named in "
        "`tests/conformance_passing.txt`, which this report writes, still passes).",
        "",
        f"Every node test case of onnx {onnx.__version__} (`onnx.backend.test.case.node`, written to "
        "`tests/.data/onnx-node`) is compiled with `webiree.onnx_backend.WebireeBackend` and run natively "
        "(wgpu-py; here on Mesa lavapipe). Outputs must match the expected ones as the suite checks them: "
        f"same shape, same dtype, `np.testing.assert_allclose(rtol={RTOL:g}, atol={ATOL:g})`.",
        "",
        "Inputs that only parameterize a shape (Reshape's `shape`, Slice's `starts`/`ends`, TopK's `k`, "
        "Expand's `shape`, ...; `webiree.onnx_backend.SHAPE_PARAMETERS`) are compiled in as constants, "
        "because webiree compiles static shapes; every data input stays a run-time input (the cases are "
        "listed below).",
        "",
        "Ops without a handler of their own lower through their ONNX function body (Attention, the losses, "
        "RMSNormalization, ...; *lowered by* below); a float64 intermediate inside such a body is computed "
        "in float32. If/Loop/Scan are compiled away (branches inlined, loops unrolled).",
        "",
        "## Summary",
        "",
        f"- **{s['passed']} passed**, {s['folded']} folded, {s['failed']} failed, {s['excluded']} excluded, "
        f"of {s['total']} cases",
        f"- op types with at least one passing case: **{len(s['ops_passing'])}** "
        f"(every non-excluded case passing: {len(s['ops_all_passing'])}) of {len(s['ops'])}",
        "- *folded*: the outputs matched, but no webiree kernel read a run-time input: the compiler "
        "computed every output at compile time (through `onnx.reference`), because every input is a "
        "shape parameter compiled in as a constant, or the outputs do not depend on the inputs' values "
        "(Shape, Size, Constant). These cases are listed apart and count neither as passes nor towards "
        "the op types; running them as inputs needs symbolic shapes.",
        f"- duration: {seconds:.0f} s with {jobs} worker process(es)",
        "",
        "Exclusion reasons (a case is excluded only when what it needs cannot be represented on WebGPU "
        "as webiree targets it; an op that is merely hard to compute is a failure):",
        "",
    ]
    excl = collections.Counter(r["reason"] for r in results if r["status"] == "excluded")
    for reason, what in EXCLUSIONS.items():
        lines.append(f"- *{reason}* ({excl.get(reason, 0)}): {what}")
    from webiree.compiler.ops import OPS
    lines += ["", "## Per op type", "",
              "*lowered by*: the op's handler in `webiree/compiler/ops/`, or its ONNX function body "
              "(`webiree/compiler/expand.py`) where webiree has no handler.", "",
              "| op | passed | folded | failed | excluded | lowered by |", "|---|---:|---:|---:|---:|---|"]
    for op in sorted(s["ops"], key=str.lower):
        c = s["ops"][op]
        how = "handler" if op in OPS else ("ONNX function" if c["passed"] else "—")
        lines.append(f"| {op} | {c['passed']} | {c['folded']} | {c['failed']} | {c['excluded']} | {how} |")
    folded = [r for r in results if r["status"] == "folded"]
    lines += ["", "## Folded (not counted as passed)", "",
              f"{len(folded)} cases matched without any webiree kernel reading a run-time input.", "",
              "| case | op | inputs compiled in |", "|---|---|---|"]
    for r in sorted(folded, key=lambda r: (r["op"].lower(), r["name"])):
        lines.append(f"| {r['name']} | {r['op']} | {', '.join(r.get('specialized', [])) or '—'} |")
    spec = [r for r in results if r["status"] == "passed" and r.get("specialized")]
    lines += ["", "## Passed with shape inputs compiled in", "",
              f"{len(spec)} passing cases take a shape parameter as a graph input; it was compiled in as a "
              "constant (see above), while their data inputs stay run-time inputs.", "",
              "| case | op | inputs compiled in |", "|---|---|---|"]
    for r in sorted(spec, key=lambda r: (r["op"].lower(), r["name"])):
        lines.append(f"| {r['name']} | {r['op']} | {', '.join(r['specialized'])} |")
    lines += ["", "## onnxruntime contrib operators (com.microsoft)", "",
              "Not part of the ONNX suite: each is compared with onnxruntime CPU over its variants in "
              "`tests/test_contrib_ops.py`, `tests/test_contrib_attention.py` and `tests/test_contrib_quant.py`. "
              "Every optional input, output "
              "and attribute is implemented or refused at build with one error naming the node and the "
              "attribute.", "", "| operator | supported variants |", "|---|---|"]
    lines += [f"| {op} | {what} |" for op, what in CONTRIB]
    lines += ["", "## Failures", "", "| case | op | error |", "|---|---|---|"]
    for r in sorted((r for r in results if r["status"] == "failed"), key=lambda r: (r["op"].lower(), r["name"])):
        err = r.get("error", "").replace("|", "\\|")
        if r["name"] in FAILURE_NOTES:
            err = f"**{FAILURE_NOTES[r['name']]}.** {err}"
        lines.append(f"| {r['name']} | {r['op']} | {err} |")
    lines += ["", "## Exclusions", "", "| case | op | reason |", "|---|---|---|"]
    for r in sorted((r for r in results if r["status"] == "excluded"), key=lambda r: (r["op"].lower(), r["name"])):
        lines.append(f"| {r['name']} | {r['op']} | {r['reason']} |")
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def write_passing(results: list[dict], path: Path = PASSING) -> None:
    """The ratchet: the names of the passing cases, one a line, sorted."""
    names = sorted(r["name"] for r in results if r["status"] == "passed")
    path.write_text("".join(n + "\n" for n in names))


def read_passing(path: Path = PASSING) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines() if line.strip()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("-k", dest="pattern", help="only cases whose name contains this (no report is written)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("WEBIREE_CONFORMANCE_JOBS", "2")))
    ap.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="seconds per case")
    ap.add_argument("--report", default=str(REPORT), help="where to write the report")
    ap.add_argument("--json", help="also write every result as JSON here")
    ap.add_argument("--rerun", metavar="JSON", help="only the cases that failed in this earlier --json output "
                    "(no report is written)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case")
    args = ap.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    t0 = time.perf_counter()
    ensure_node_data()
    names = case_names()
    if args.pattern:
        names = [n for n in names if args.pattern in n]
    if args.rerun:
        failed = {r["name"] for r in json.loads(Path(args.rerun).read_text()) if r["status"] == "failed"}
        names = [n for n in names if n in failed]

    def progress(res, done, total):
        if args.verbose or ((args.pattern or args.rerun) and res["status"] == "failed"):
            extra = res.get("error") or res.get("reason") or ""
            print(f"[{done}/{total}] {res['status']:<8} {res['name']}  {extra}", flush=True)
        elif done % 100 == 0:
            print(f"[{done}/{total}] {time.perf_counter() - t0:.0f} s", flush=True)

    results = run_all(names, jobs=args.jobs, timeout=args.timeout, progress=progress)
    resolve_ops(results)
    seconds = time.perf_counter() - t0
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    s = summarize(results)
    print(f"{s['passed']} passed, {s['folded']} folded, {s['failed']} failed, {s['excluded']} excluded "
          f"of {s['total']}; "
          f"{len(s['ops_passing'])} op types pass; {seconds:.0f} s")
    if not args.pattern and not args.rerun:
        write_report(results, seconds, Path(args.report), args.jobs)
        write_passing(results)
        print(f"wrote {args.report} and {PASSING.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
