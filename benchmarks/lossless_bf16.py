"""The lossless check on a bf16 target: how many greedy divergences are near ties, how many a
float32 copy of the target settles as rounding, how many stay real; the same prompts in
float32 as the baseline (where a divergence would be a bug), in one process.

    python benchmarks/lossless_bf16.py                       # SmolLM2 (eyas:smollm2), HumanEval
    python benchmarks/lossless_bf16.py --prompts 4 --max-new-tokens 32   # quick
    python benchmarks/lossless_bf16.py --sharegpt 16 --dtypes bfloat16    # + ShareGPT turns

The target and prompts come from ``--config`` (default recipes/smollm2-sharegpt-smoke.yaml:
SmolLM2-135M-Instruct assembled from its packaged GGUF, HumanEval); the drafter from
``--drafter`` (an exported folder), else a seeded random drafter built for the target (the
check concerns the target's verification, which reads k + 1 tokens whatever the drafts are;
prompt lookup, also run, gets long acceptances on code). Prints one line per dtype (prompts,
divergences by kind, seconds of the evaluation and of the float32 settling, target tokens/s)
and the bf16 / float32 target tokens/s ratio; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eyas.config import load_config  # noqa: E402
from eyas.evaluate.run import evaluate, resolve_prompt_file, select_prompts  # noqa: E402
from eyas.prepare.phases import resolve_target  # noqa: E402
from eyas.prepare.tokenize import load_tokenizer  # noqa: E402


def random_drafter(model: Path, out: Path, draft_vocab: int) -> Path:
    """A seeded random EAGLE-3 drafter exported for `model` (SGLang's folder layout)."""
    from eyas.extract.target import load_target_embeddings
    from eyas.io import read_json
    from eyas.layers import default_aux_layers
    from eyas.train.export import export_drafter
    from eyas.train.model import Drafter, DrafterConfig
    from eyas.train.vocab import DraftVocab

    cfg = read_json(model / "config.json")
    torch.manual_seed(0)
    drafter = Drafter(DrafterConfig.from_target(cfg, draft_vocab),
                      load_target_embeddings(model).float())
    vocab = DraftVocab(torch.arange(draft_vocab), cfg["vocab_size"])
    return export_drafter(out, drafter, vocab, default_aux_layers(cfg["num_hidden_layers"]),
                          target_config=cfg)


def sharegpt_prompts(out: Path, count: int, skip: int) -> Path:
    """A prompt file of `count` first user turns of the packaged ShareGPT file (`eyas:sharegpt`),
    after its first `skip` conversations; conversations whose first turn is not a human's, or
    is empty, are passed over."""
    from eyas.packaged import packaged_path
    from eyas.prepare.sources import iter_rows

    rows = []
    for n, (_, row) in enumerate(iter_rows(packaged_path("eyas:sharegpt", where="--sharegpt"))):
        if len(rows) == count:
            break
        if n < skip or not isinstance(row, dict):
            continue
        turns = row.get("conversations") or []
        first = turns[0] if turns else {}
        if first.get("from") == "human" and str(first.get("value", "")).strip():
            rows.append({"id": f"sharegpt-{row.get('id', n)}",
                         "messages": [{"role": "user", "content": first["value"]}]})
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path,
                   default=ROOT / "recipes" / "smollm2-sharegpt-smoke.yaml")
    p.add_argument("--drafter", type=Path, default=None)
    p.add_argument("--prompts", type=int, default=12, help="prompts per prompt file")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--sharegpt", type=int, default=0,
                   help="also this many first user turns of the packaged ShareGPT file")
    p.add_argument("--sharegpt-skip", type=int, default=5000,
                   help="after this many ShareGPT conversations (away from the recipes' own)")
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                   choices=["bfloat16", "float32"], help="float32 is the baseline")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    model = resolve_target(cfg)
    tok = load_tokenizer(model)
    ecfg = cfg.evaluate.model_copy(update={"prompts_per_dataset": args.prompts,
                                           "max_new_tokens": args.max_new_tokens,
                                           "mode": "greedy"})
    files = [resolve_prompt_file(f, cfg.source_dir) for f in ecfg.prompt_files]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.sharegpt:
            files.append(sharegpt_prompts(Path(tmp) / "sharegpt.jsonl", args.sharegpt,
                                          args.sharegpt_skip))
        if not files:
            print(f"{args.config} names no evaluate.prompt_files (or pass --sharegpt N)",
                  file=sys.stderr)
            return 2
        drafter = args.drafter or random_drafter(model, Path(tmp) / "drafter", 8192)
        for dtype in args.dtypes:
            run_cfg = ecfg.model_copy(update={"dtype": dtype})
            selection = select_prompts(run_cfg, eval_jsonl=None, train_jsonl=None,
                                       prompt_files=files, tokenizer=tok)
            logged: list[tuple[float, str]] = []
            start = time.perf_counter()
            r = evaluate(model, drafter, selection, run_cfg, Path(tmp) / dtype, tokenizer=tok,
                         on_log=lambda line, logged=logged: logged.append((time.perf_counter(), line)))
            took = time.perf_counter() - start
            # The settling runs after the last prompt's line and before the report.
            last_prompt = max((t for t, line in logged if line.startswith("prompt ")), default=start)
            settling = [t for t, line in logged if line.startswith("lossless check:")]
            lossless = r["lossless"]
            row = {"dtype": dtype, "prompts": r["prompts"]["count"],
                   "divergences": (lossless["near_ties"] + lossless["float32_rounding"]
                                   + lossless["real"]),
                   "near_ties": lossless["near_ties"],
                   "float32_rounding": lossless["float32_rounding"], "real": lossless["real"],
                   "equal": lossless["equal"], "seconds": round(took, 1),
                   "settling_seconds": round(settling[-1] - last_prompt, 1) if settling else 0.0,
                   "target_tok_s": round(r["tokens_per_s"]["target"], 2),
                   "tau_eagle3": round(r["acceptance_length"], 3),
                   "tau_ngram": round(r["baselines"]["ngram"]["acceptance_length"], 3)
                   if "ngram" in r["baselines"] else None,
                   "settled": [{k: m.get(k) for k in ("id", "method", "position",
                                                      "target_top2_margin", "float32")}
                               for m in lossless["mismatches"] if m.get("float32")]}
            rows.append(row)
            print(" ".join(f"{k} {v}" for k, v in row.items() if k != "settled"), flush=True)
            for m in row["settled"]:
                print("  settled", json.dumps(m), flush=True)
    ratio = (rows[0]["target_tok_s"] / rows[1]["target_tok_s"] if len(rows) == 2 else None)
    if ratio is not None:
        print(f"target tokens/s bf16 / float32: {ratio:.2f}x")
    print(json.dumps({"model": str(model), "rows": rows, "bf16_to_float32_tok_s": ratio}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
