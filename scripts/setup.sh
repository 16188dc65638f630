#!/usr/bin/env bash
# Set up everything webiree needs on a fresh Debian machine (run as root):
# system packages (Vulkan on the CPU, Chromium, SPIR-V tools), a .venv at the
# repo root with webiree installed in editable mode plus its test extra.
#   bash scripts/setup.sh            runtime + tests
#   bash scripts/setup.sh --models   also torch/transformers, to export the seed models
set -euo pipefail
cd "$(dirname "$0")/.."

models=0
for a in "$@"; do [ "$a" = "--models" ] && models=1; done

pkgs=(mesa-vulkan-drivers libvulkan1 chromium spirv-tools)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
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
echo "setup: ready (.venv with webiree $(.venv/bin/python -c 'import webiree; print(webiree.__version__)'))"
