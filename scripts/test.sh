#!/usr/bin/env bash
# Set everything up and run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --models
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/webiree-xdg}"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
exec .venv/bin/python -m pytest -ra "$@"
