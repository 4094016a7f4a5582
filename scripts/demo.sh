#!/usr/bin/env bash
# Set up, then run phases 1-3 of the tiny demo end to end (builds the tiny target once).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PREFECT_SERVER_ANALYTICS_ENABLED=false HF_HUB_OFFLINE=1
exec .venv/bin/eyas prepare --config recipes/tiny-demo.yaml --workdir "${1:-runs/tiny-demo}"
