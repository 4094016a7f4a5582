#!/usr/bin/env bash
# Create .venv and install eyas with everything the demo and the tests need (CPU only).
# Idempotent: a second run with the same pyproject.toml does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.eyas-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/pip install --quiet --upgrade pip
# The CPU build of torch: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/pip install --quiet "torch==2.13.0"
.venv/bin/pip install --quiet -e '.[dev]'
echo "$want" > "$stamp"
