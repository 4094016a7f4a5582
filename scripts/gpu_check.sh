#!/usr/bin/env bash
# The GPU checks, with only torch + transformers on the machine; each prints one JSON line:
#   1. HF-backend extraction throughput (Llama-3.1-8B shape, random bf16 weights), share of peak;
#   2. one EAGLE-3 training step at a Llama-3.1-8B-shaped drafter: tokens/s and model FLOPs use;
#   3. the training-memory benchmark with the Kimi-K2.5-width drafter (hidden 7168, Kimi's head
#      geometry, draft vocabulary 32,000 of 163,840) in bf16 at T = 1,024 and 8,192: peak
#      memory (the step's and the whole GPU's), tokens/s and model FLOP utilisation, for the
#      memory-bounded path, with activation checkpointing, and the dense path where it fits;
#   4. the offline evaluator with the tiny target and a drafter trained for it: τ on the GPU must
#      match the CPU run; tokens/s with and without the drafter (float32 and bf16).
# Budget: the default run is capped at 9 minutes in all, so it fits one 10-minute call on one
# H200 (each check's cap below; they usually finish well inside them).
#   bash scripts/gpu_check.sh               # all four, on the GPU
#   bash scripts/gpu_check.sh --tiny        # all four, tiny shapes on the CPU (smoke test)
#   bash scripts/gpu_check.sh train [...]   # only one (or: extract, memory, evaluate [...])
#   PYTHON=/venv-with-sglang/bin/python bash scripts/gpu_check.sh sglang [--dry-run]
#     # SGLang backend (capture hook) vs HF backend on a tiny DeepSeek-V3; needs sglang==0.5.23
#   EYAS_SGLANG_PYTHON=/venv-with-sglang/bin/python bash scripts/gpu_check.sh serving
#     # the serving benchmark through SGLang on the tiny target: baseline, n-gram and EAGLE-3
#     # servers, 3 runs per point after POST /flush_cache, streamed TTFT and decode tok/s, the
#     # GPU checked free before each server, the draft/verify costs (tests/unit/evaluate/test_serving_gpu.py)
#   PYTHON=/venv-with-sglang/bin/python bash scripts/gpu_check.sh mla [--dry-run]
#     # an MLA drafter (Eagle3DeepseekV2ForCausalLM) trained by eyas, served by SGLang 0.5.23:
#     # its accept length against eyas's offline evaluator (scripts/gpu_check_sglang_mla.py)
#   PYTHON=/venv-with-sglang/bin/python bash scripts/gpu_check.sh overfit [--dry-run]
#     # the overfit gate with SGLang measuring: passes on the tiny target's clean export, fails
#     # on aux layers shifted, fc_norm dropped, d2t off by one (scripts/gpu_check_overfit.py)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MEMORY=(benchmarks/train_memory.py --kimi --T 1024 8192 --chunk-mb 1024)
if [[ " $* " == *" --tiny "* ]]; then MEMORY=(benchmarks/train_memory.py); fi  # --tiny: CPU
case "${1:-}" in
  train)   shift; exec timeout 240 "$PY" scripts/gpu_check.py train "$@" ;;
  extract) shift; exec timeout 300 "$PY" scripts/gpu_check.py "$@" ;;
  sglang)  shift; exec timeout 420 "$PY" scripts/gpu_check.py sglang "$@" ;;
  mla)     shift; exec timeout 540 "$PY" scripts/gpu_check_sglang_mla.py "$@" ;;
  overfit) shift; exec timeout 540 "$PY" scripts/gpu_check_overfit.py "$@" ;;
  memory)  shift; exec timeout 300 "$PY" "${MEMORY[@]}" "$@" ;;
  evaluate) shift; exec timeout 420 "$PY" scripts/gpu_check.py evaluate "$@" ;;
  serving) shift; : "${EYAS_SGLANG_PYTHON:?set it to the python of an SGLang 0.5.23 venv}"
           exec timeout 540 "$PY" -m pytest tests/unit/evaluate/test_serving_gpu.py -m gpu -x -q -s \
             -p no:cacheprovider "$@" ;;
esac
timeout 120 "$PY" scripts/gpu_check.py "$@"
timeout 100 "$PY" scripts/gpu_check.py train "$@"
timeout 160 "$PY" "${MEMORY[@]}" "$@"
timeout 150 "$PY" scripts/gpu_check.py evaluate "$@"
