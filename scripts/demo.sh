#!/usr/bin/env bash
# Set up, then run the tiny demo end to end: phases 1-3 (generate, tokenize, merge), then
# hidden-state extraction and drafter training, ending with a drafter exported for SGLang.
# The tiny target is built once and cached (~/.cache/eyas). Usage: scripts/demo.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
work="${1:-runs/tiny-demo}"
recipe=recipes/tiny-demo.yaml
.venv/bin/eyas prepare --config "$recipe" --workdir "$work"
.venv/bin/eyas extract --config "$recipe" --workdir "$work"
.venv/bin/eyas train --config "$recipe" --workdir "$work"
