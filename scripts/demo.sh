#!/usr/bin/env bash
# Set up, then run the tiny demo end to end: phases 1-3 (generate, tokenize, merge), then
# hidden-state extraction and drafter training (a drafter exported for SGLang), ending with the
# offline evaluation: speculative decoding on held-out prompts; prints τ, the baselines (an
# untrained drafter, prompt lookup) and the predicted speedup, and writes an HTML report.
# The tiny target is built once and cached (~/.cache/eyas). Usage: scripts/demo.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
work="${1:-runs/tiny-demo}"
recipe=recipes/tiny-demo.yaml
# The whole job as one Prefect flow (each phase also runs alone: eyas prepare / extract /
# train / evaluate). Run it again and every task comes back Cached or Skipped.
.venv/bin/eyas pipeline --config "$recipe" --workdir "$work"
