#!/usr/bin/env bash
# Phase 6 again in sampling mode, beside the pipeline's greedy report:
#   bash scripts/evaluate_sampled.sh RECIPE WORKDIR [TEMPERATURE]  ->  WORKDIR/evaluate-t<T>/
# Same prompts, baselines and draft length as the recipe's evaluate section; the target is
# the recipe's (built targets such as eyas:smollm2 come from eyas's cache).
set -euo pipefail
cd "$(dirname "$0")/.."
recipe=$1 workdir=$2 temperature=${3:-0.7}
py=.venv/bin/python
args=$("$py" - "$recipe" <<'PY'
import shlex, sys
from eyas.config import load_config
from eyas.prepare.phases import resolve_target
cfg = load_config(sys.argv[1])
ev = cfg.evaluate
out = ["--model", str(resolve_target(cfg)), "--draft-tokens", str(ev.draft_tokens),
       "--max-new-tokens", str(ev.max_new_tokens), "--dtype", ev.dtype]
if ev.prompts_per_dataset:
    out += ["--prompts-per-dataset", str(ev.prompts_per_dataset)]
for f in ev.prompt_files:
    out += ["--prompt-file", f]
print(shlex.join(out))
PY
)
# shellcheck disable=SC2086
eval "$py" -m eyas.evaluate.run $args --mode sampling --temperature "$temperature" \
  --drafter "$workdir/drafter/export" --eval-jsonl "$workdir/merged/eval.jsonl" \
  --train-jsonl "$workdir/merged/train.jsonl" --out "$workdir/evaluate-t$temperature"
