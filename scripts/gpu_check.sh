#!/usr/bin/env bash
# HF-backend extraction throughput on one GPU (Llama-3.1-8B shape, random bf16 weights).
# Needs only torch + transformers; prints one JSON line. Budget: well under 8 minutes on an H200.
#   bash scripts/gpu_check.sh            # GPU
#   bash scripts/gpu_check.sh --tiny     # CPU smoke test
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec timeout 450 "$PY" scripts/gpu_check.py "$@"
