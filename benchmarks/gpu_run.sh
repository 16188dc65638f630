#!/usr/bin/env bash
# The performance run on a lent NVIDIA machine (see docs/performance.md):
# Vulkan loader from .gl/*.deb, wgpu from .whl/, seed models exported there,
# then `webiree bench` per model, PyTorch CUDA as the native reference.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD XDG_RUNTIME_DIR=/tmp PYTHONUNBUFFERED=1
if ! python3 -c "import wgpu; a = wgpu.gpu.request_adapter_sync(); print(a.info['device'], a.info['backend_type'])"; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  python3 -c "import wgpu; a = wgpu.gpu.request_adapter_sync(); print(a.info['device'], a.info['backend_type'])" || exit 1
fi
OUT=${OUT:-/tmp/out}
mkdir -p /tmp/seed "$OUT"
status=0  # any failed or wrong stage makes the script exit 1, after the other stages ran
right() {  # webiree bench marks a result above 1e-4 WRONG but exits 0: fail here on a wrong webiree result
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["results"]
bad = {k: v["rel_err"] for k, v in r.items() if k.startswith("webiree") and not v.get("rel_err", 0) <= 1e-4}
sys.exit(f"FAILED: {sys.argv[1]}: {bad} (rel. error vs onnxruntime > 1e-4): not comparable" if bad else 0)' "$1"
}
# STAGES picks what runs (all by default): variants (matmul kernel variants), models, torch, dynamic,
# dawn (webiree.js vs onnxruntime-web on Dawn in Node: carry .dawn/ from benchmarks/dawn_pack.sh),
# precision (f32 / fp16 / int8 / int4 variants of MiniLM and MobileNetV2), generation (a GPT-2-small-sized
# decoder generating token by token: webiree vs onnxruntime CPU and torch CUDA; GEN_REPEAT generations each,
# GEN_VARIANTS of f32,fp16,int4, GEN_ARGS passed on, e.g. "--layers 2"), tune (webiree tune per model:
# the tuning tables of benchmarks/tuning/, each with its tuned / heuristic end-to-end ratio; the model
# minilm_int8 is MiniLM through quantize_dynamic), dot4 (int8 dot products vs f32 fma on the adapter)
# PRECISION_ARGS is passed to precision.py (e.g. "--only minilm"); COMPARE_MODELS (default TUNE_MODELS)
# are the models the compare stage times
STAGES=${STAGES:-variants models torch dynamic precision generation}
if [[ $STAGES == *dot4* ]]; then
  python3 benchmarks/dot4_throughput.py 2>&1 | tee "$OUT/dot4.txt" || status=1
fi
if [[ $STAGES == *variants* ]]; then
  python3 benchmarks/matmul_variants.py --runs 10 ${SHAPES:-} 2>&1 | tee "$OUT/matmul_variants.txt" || status=1
fi
if [[ $STAGES == *dynamic* ]]; then  # one build for a range of sizes vs. a build pinned to the size run
  python3 benchmarks/dynamic_shapes.py --runs ${RUNS:-30} --json "$OUT/dynamic.json" 2>&1 | grep -v "^Forcing" || status=1
fi
if [[ $STAGES == *generation* ]]; then  # per-token latency; exits 1 if webiree's tokens differ from onnxruntime's
  python3 benchmarks/generation.py --repeat ${GEN_REPEAT:-5} --variants ${GEN_VARIANTS:-f32,fp16,int4} ${GEN_ARGS:-} \
    --json "$OUT/generation.json" 2>&1 | grep -v "^Forcing\|WARNING" || status=1
fi
[[ $STAGES == *models* || $STAGES == *torch* || $STAGES == *precision* || $STAGES == *tune* || $STAGES == *compare* || $STAGES == *dawn* ]] || exit $status
python3 tests/seed/export_seed_models.py --out /tmp/seed ${MODELS:+--only $MODELS} 2>&1 | tail -4
if [[ "${TUNE_MODELS:-} ${COMPARE_MODELS:-}" == *minilm_int8* ]]; then
  python3 -c "from webiree.testing.models import quantize_dynamic_model as q; q('/tmp/seed/minilm.onnx', '/tmp/seed/minilm_int8.onnx')" 2>&1 | grep -v WARNING
  cp /tmp/seed/minilm.inputs.npz /tmp/seed/minilm_int8.inputs.npz
fi
if [[ $STAGES == *dawn* ]]; then  # webiree.js vs onnxruntime-web on Dawn in Node (.dawn/ from benchmarks/dawn_pack.sh)
  mkdir -p /tmp/dawn && tar -xJf .dawn/dawn.tar.xz -C /tmp/dawn || exit 1
  for m in ${DAWN_MODELS:-mobilenet_v2 minilm}; do
    python3 benchmarks/dawn_vs_ort_web.py --onnx /tmp/seed/$m.onnx --inputs /tmp/seed/$m.inputs.npz --runs ${RUNS:-30} \
      --node /tmp/dawn/node/bin/node --webgpu /tmp/dawn/webgpu/index.js --ort-dir /tmp/dawn/ort --json "$OUT/dawn-$m.json" || status=1
  done
fi
if [[ $STAGES == *precision* ]]; then  # each variant checked within its model's tolerance, then timed in turns
  python3 benchmarks/precision.py --seed-dir /tmp/seed --runs ${RUNS:-30} ${PRECISION_ARGS:-} --json "$OUT/precision.json" 2>&1 | grep -v "^Forcing\|WARNING" || status=1
fi
python3 benchmarks/make_matmul.py 4096 /tmp/seed/matmul4096.onnx
if [[ $STAGES == *tune* ]]; then  # a table per model, written as soon as it is measured
  for m in ${TUNE_MODELS:-matmul4096 mobilenet_v2 minilm deeplabv3 mobilebert}; do
    inputs=/tmp/seed/$m.inputs.npz; [[ -f $inputs ]] || inputs=
    python3 -m webiree.cli tune /tmp/seed/$m.onnx ${inputs:+--inputs $inputs} --runs ${TUNE_RUNS:-10} \
      --out "$OUT/tune-$m.json" 2>&1 | grep -v "^Forcing\|round " || status=1
  done
fi
if [[ $STAGES == *compare* ]]; then  # this commit's heuristic vs each model's table and the heuristic recorded in it
  for m in ${COMPARE_MODELS:-${TUNE_MODELS:-mobilenet_v2 minilm deeplabv3}}; do
    t=benchmarks/tuning/h200-$m.json; [[ -f $OUT/tune-$m.json ]] && t=$OUT/tune-$m.json   # a table just measured
    python3 benchmarks/tuning_compare.py /tmp/seed/$m.onnx --inputs /tmp/seed/$m.inputs.npz --table $t \
      --recorded-heuristic $t --runs ${RUNS:-30} 2>&1 | grep -v "^Forcing" || status=1
  done
fi
[[ $STAGES == *models* || $STAGES == *torch* ]] || exit $status
if [[ $STAGES == *models* ]]; then  # webiree with the adapter's limits (bench's default), onnxruntime CPU
  for m in ${MODELS:-mobilenet_v2 deeplabv3 minilm mobilebert}; do
    python3 -m webiree.cli bench /tmp/seed/$m.onnx --inputs /tmp/seed/$m.inputs.npz --runs ${RUNS:-30} ${BENCH_ARGS:-} --json "$OUT/$m.json" 2>&1 | grep -v "^Forcing" || status=1
    right "$OUT/$m.json" || status=1
  done
  python3 -m webiree.cli bench /tmp/seed/matmul4096.onnx --runs 10 --json "$OUT/matmul4096.json" || status=1
  right "$OUT/matmul4096.json" || status=1
fi
if [[ $STAGES == *torch* ]]; then  # the same models and inputs, checked against the same onnxruntime outputs
  python3 benchmarks/torch_reference.py --seed-dir /tmp/seed --runs ${RUNS:-30} --json "$OUT/torch.json" ${MODELS:+--only $MODELS} || status=1
fi
exit $status
