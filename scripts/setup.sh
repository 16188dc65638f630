#!/usr/bin/env bash
# Set up everything webiree needs on a fresh Debian machine (run as root):
# system packages (Vulkan on the CPU, Chromium, SPIR-V tools), a .venv at the
# repo root with webiree installed in editable mode plus its test extra, and
# the pinned Pyodide (npm) in node_modules/ for python.html (Python in the browser), the pinned
# `webgpu` (npm: Dawn's dawn.node) in node_modules/ for tests/test_dawn.py (webiree.js on Dawn in Node),
# and the pinned `esbuild` (npm) for tests/test_npm_package.py (web/ as an npm package, bundled).
#   bash scripts/setup.sh            runtime + tests
#   bash scripts/setup.sh --models   also torch/transformers, to export the seed models
set -euo pipefail
cd "$(dirname "$0")/.."

models=0
for a in "$@"; do [ "$a" = "--models" ] && models=1; done

# libegl1/libegl-mesa0/libgles2: llvmpipe's OpenGL ES through EGL, Dawn's OpenGL ES backend (tests/test_dawn.py)
pkgs=(mesa-vulkan-drivers libvulkan1 chromium spirv-tools libegl1 libegl-mesa0 libgles2)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
extras="test"
[ "$models" = 1 ] && extras="test,models"
.venv/bin/python -m pip install -q -e ".[$extras]" 2>&1 | grep -vE "^WARNING: (Location|Skipping)" || true
.venv/bin/python -c "import webiree, wgpu, onnx" || { echo "setup: the Python install failed" >&2; exit 1; }
# Pyodide for python.html (the version pinned in webiree/bundler/pyodide.py), dawn.node for
# tests/test_dawn.py (the version pinned in tests/dawn_util.py) and esbuild for tests/test_npm_package.py
# (pinned there), from npm (never a CDN). One npm call installs all three: a later
# `npm install --no-save` can prune what an earlier one installed.
pyodide_version=$(sed -n 's/^PYODIDE_VERSION = "\(.*\)"$/\1/p' webiree/bundler/pyodide.py)
webgpu_version=$(sed -n 's/^WEBGPU_VERSION = "\(.*\)"$/\1/p' tests/dawn_util.py)
esbuild_version=$(sed -n 's/^ESBUILD_VERSION = "\(.*\)"$/\1/p' tests/test_npm_package.py)
npm_ok=1
specs=("pyodide@$pyodide_version" "webgpu@$webgpu_version" "esbuild@$esbuild_version")
for spec in "${specs[@]}"; do
  have=$(node -p "require('./node_modules/${spec%@*}/package.json').version" 2>/dev/null || true)
  [ "$have" = "${spec##*@}" ] || npm_ok=0
done
if [ "$npm_ok" = 0 ]; then
  echo "setup: installing ${specs[*]} into node_modules/"
  npm install --no-save --no-package-lock --no-audit --no-fund --loglevel=error "${specs[@]}" >/dev/null
fi
echo "setup: ready (.venv with webiree $(.venv/bin/python -c 'import webiree; print(webiree.__version__)'))"
