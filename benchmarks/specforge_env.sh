#!/usr/bin/env bash
# Build the SpecForge 0.2.0 environment that benchmarks/vs_specforge.py runs SpecForge in.
#
#     bash benchmarks/specforge_env.sh [VENV]   # default: $SPECFORGE_VENV, else ~/.venvs/specforge
#
# SpecForge pins sglang, a CUDA torch and more; none of that runs on a CPU host. So it is
# installed with --no-deps into its own venv (never eyas's .venv), beside the CPU build of
# torch and the pure-Python packages its offline trainer imports. Triton (GPU only) is not
# installed: the harness's driver (benchmarks/_specforge_driver.py) puts a stand-in module
# in its place and swaps SpecForge's Triton loss for the plain-PyTorch reference loss that
# the same SpecForge module defines. The venv's python is what the harness runs.
# pip then reports the GPU dependencies it skipped as missing: expected.
# Idempotent: a second run with a complete venv does nothing.
set -euo pipefail
VENV=${1:-${SPECFORGE_VENV:-$HOME/.venvs/specforge}}
PY=${PYTHON:-python3}
stamp="$VENV/.specforge-env-1"
if [ -f "$stamp" ]; then
  echo "SpecForge environment ready: $VENV/bin/python"
  exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
# The CPU build of torch (the same pin as eyas); an unpinned torch pulls a multi-GB CUDA build.
"$VENV/bin/pip" install --quiet "torch==2.13.0"
# SpecForge itself, without its GPU dependencies (sglang, its torch pin, yunchang, wandb).
"$VENV/bin/pip" install --quiet --no-deps "specforge==0.2.0"
# What its offline EAGLE-3 trainer imports, pure Python (transformers at SpecForge's pin).
"$VENV/bin/pip" install --quiet "transformers==5.8.1" accelerate datasets huggingface-hub \
  numpy pydantic psutil pyyaml safetensors requests typing-extensions tqdm
"$VENV/bin/python" -c "import specforge, torch, transformers; print('specforge', \
getattr(specforge, '__version__', '0.2.0'), 'torch', torch.__version__, 'transformers', \
transformers.__version__)"
touch "$stamp"
echo "SpecForge environment ready: $VENV/bin/python"
