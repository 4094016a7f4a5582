#!/usr/bin/env bash
# The GPU checks, with only torch + transformers on the machine; each prints one JSON line:
#   1. HF-backend extraction throughput (Llama-3.1-8B shape, random bf16 weights), share of peak;
#   2. one EAGLE-3 training step at a Llama-3.1-8B-shaped drafter: tokens/s and model FLOPs use;
#   3. the offline evaluator with the tiny target and a drafter trained for it: τ on the GPU must
#      match the CPU run; tokens/s with and without the drafter (float32 and bf16).
# Budget: well under 12 minutes on one H200.
#   bash scripts/gpu_check.sh              # both, on the GPU
#   bash scripts/gpu_check.sh --tiny       # both, tiny shapes on the CPU (smoke test)
#   bash scripts/gpu_check.sh train [...]  # only training (or: extract [...], evaluate [...])
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  train)   shift; exec timeout 240 "$PY" scripts/gpu_check.py train "$@" ;;
  extract) shift; exec timeout 300 "$PY" scripts/gpu_check.py "$@" ;;
  evaluate) shift; exec timeout 420 "$PY" scripts/gpu_check.py evaluate "$@" ;;
esac
timeout 300 "$PY" scripts/gpu_check.py "$@"
timeout 170 "$PY" scripts/gpu_check.py train "$@"
timeout 420 "$PY" scripts/gpu_check.py evaluate "$@"
