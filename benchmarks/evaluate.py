"""Offline evaluator benchmark (CPU): τ, tokens/s and this device's speedups of a run's drafter for
several draft lengths k, each against the target decoding alone in the same process.

    python benchmarks/evaluate.py --workdir runs/tiny-demo            # after scripts/demo.sh
    python benchmarks/evaluate.py --workdir runs/tiny-demo --quick    # fewer prompts and k

Reads the run's config (``--config``, default the tiny recipe) for the target, the prompts and
the evaluator settings, and ``<workdir>/drafter/export``. For each k it runs the whole
evaluation (target alone, trained drafter, untrained drafter, prompt lookup on the same
held-out prompts) and prints one line: τ of each drafter, tokens/s, the measured speedup
(tokens/s with the drafter / target alone, same process, prompts interleaved) and the one
predicted from this device's measured costs (not a serving prediction). The last line is one JSON object. Outputs go to a temporary folder (the run's own
``evaluate/`` is left alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eyas.config import load_config  # noqa: E402
from eyas.evaluate.run import evaluate, resolve_prompt_file, select_prompts  # noqa: E402
from eyas.layout import RunLayout  # noqa: E402
from eyas.prepare.phases import resolve_target  # noqa: E402
from eyas.prepare.tokenize import load_tokenizer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", type=Path, default=ROOT / "runs" / "tiny-demo")
    p.add_argument("--config", type=Path, default=ROOT / "recipes" / "tiny-demo.yaml")
    p.add_argument("--draft-tokens", type=int, nargs="+", default=None)
    p.add_argument("--quick", action="store_true", help="4 prompts per dataset, k = 1 and 3")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    layout = RunLayout(args.workdir)
    drafter = layout.drafter_dir / "export"
    if not drafter.is_dir():
        print(f"no drafter at {drafter}: run scripts/demo.sh (or eyas train) first",
              file=sys.stderr)
        return 2
    ks = args.draft_tokens or ([1, 3] if args.quick else [1, 2, 3, 5])
    ecfg = cfg.evaluate
    if args.quick:
        ecfg = ecfg.model_copy(update={"prompts_per_dataset": 4})
    model = resolve_target(cfg)
    tok = load_tokenizer(model)
    selection = select_prompts(ecfg, eval_jsonl=layout.eval, train_jsonl=layout.train,
                               prompt_files=[resolve_prompt_file(f, cfg.source_dir)
                                             for f in ecfg.prompt_files], tokenizer=tok)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in ks:
            run_cfg = ecfg.model_copy(update={"draft_tokens": k})
            r = evaluate(model, drafter, selection, run_cfg, Path(tmp) / f"k{k}", tokenizer=tok,
                         on_log=None)
            row = {"draft_tokens": k, "tau": r["acceptance_length"],
                   "tau_ci95": r["acceptance_length_ci95"],
                   **{f"tau_{m}": s["acceptance_length"] for m, s in r["baselines"].items()},
                   "tok_s_target": r["tokens_per_s"]["target"],
                   "tok_s_drafter": r["tokens_per_s"]["eagle3"],
                   "speedup_measured": r["speedup_measured"],
                   "draft_to_target": r["costs"]["draft_to_target"],
                   "verify_to_target": r["costs"]["verify_to_target"],
                   "predicted_speedup_this_device": r["predicted_speedup_this_device"],
                   "lossless": r["lossless"]["equal"]}
            rows.append(row)
            print(" ".join(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}"
                           for key, value in row.items()), flush=True)
    print(json.dumps({"prompts": selection.counts()["per_dataset"], "threads": ecfg.threads,
                      "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
