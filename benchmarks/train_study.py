"""Training study on the tiny target: acceptance length against epochs, and loss weighting.

    python benchmarks/train_study.py --quick     # 2 seeds, epochs 1/2/4 (~20-40 CPU-minutes)
    python benchmarks/train_study.py             # 3 seeds, epochs 1/2/3/4/6

The tiny demo target answers its training questions (``eyas.train.tiny_data.tiny_records``);
the records are extracted once (storage "final") and a drafter is trained on them from the
same seeded initialisation for each setting, then scored on held-out questions by training's
simulated acceptance length τ (7 TTT steps; the bonus token counted) at the last step (not
the best of several evaluations: that would favour longer runs by picking). Settings: the
demo recipe's (micro-batch 4, lr 1e-3, warmup 5%), ``train.epochs`` ∈ the list; and
``loss_norm`` ``token`` beside ``sample`` at 2 epochs, micro-batch 1 × 4 accumulated (the
weighting differs only across micro-batches). One torch thread. Prints a table (τ mean ±
standard error over the seeds) and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eyas.train.config import TrainConfig  # noqa: E402
from eyas.train.data import OfflineSource  # noqa: E402


def run(train_dir: Path, eval_dir: Path, model: Path, out: Path, *, seed: int, epochs: float,
        loss_norm: str, micro_batch: int, grad_accum: int, lr: float, max_len: int) -> dict:
    from eyas.train.run import train_drafter

    src = OfflineSource(train_dir)
    steps = math.ceil(epochs * len(src) / (micro_batch * grad_accum))
    cfg = TrainConfig(epochs=epochs, lr=lr, warmup_steps=max(1, steps // 20),
                      micro_batch=micro_batch, grad_accum=grad_accum, max_len=max_len,
                      eval_every=steps, log_every=steps, device="cpu", draft_vocab_size=32_000,
                      seed=seed, loss_norm=loss_norm)
    t0 = time.perf_counter()
    final = {}

    def log(rec: dict) -> None:
        if rec["kind"] == "eval":
            final.update(rec)

    summary = train_drafter(src, OfflineSource(eval_dir), model, out, cfg,
                            aux_layers=src.aux_layers, on_log=log)
    return {"tau": final["simulated_acceptance_length"], "steps": summary["steps"],
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="2 seeds, epochs 1/2/4, fewer samples")
    p.add_argument("--keep", type=Path, help="keep the work folder here")
    p.add_argument("--only", choices=["epochs", "loss_norm"], default=None,
                   help="run one of the two studies")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [0, 1] if args.quick else [0, 1, 2]
    epoch_list = [1, 2, 4] if args.quick else [1, 2, 3, 4, 6]
    n_train, n_eval = (120, 48) if args.quick else (240, 80)
    sizes = {"lr": 1e-3, "max_len": 256}

    from eyas.tiny import build_tiny_target
    from eyas.train.tiny_data import extract_shards, tiny_records, write_jsonl

    model = build_tiny_target()
    work = args.keep or Path(tempfile.mkdtemp(prefix="eyas-train-study-"))
    rows: dict[str, list[dict]] = {}
    try:
        merged = work / "merged"
        if not (merged / "train.jsonl").exists():
            write_jsonl(merged / "train.jsonl", tiny_records(model, n_train))
            write_jsonl(merged / "eval.jsonl", tiny_records(model, n_eval, heldout=True))
        train_dir = extract_shards(model, merged / "train.jsonl", work / "hidden" / "train",
                                   storage="final", shard_size=64)
        eval_dir = extract_shards(model, merged / "eval.jsonl", work / "hidden" / "eval",
                                  storage="final", shard_size=64)
        # Loss weighting differs only across micro-batches (within one, tokens already weigh
        # the same), so it is compared at micro-batch 1 x 4 accumulated: the same samples per
        # step as micro-batch 4.
        settings = [] if args.only == "loss_norm" else [
            (f"epochs={e}", e, "sample", 4, 1) for e in epoch_list]
        if args.only != "epochs":
            settings += [(f"epochs=2 mb=1x4 loss_norm={n}", 2, n, 1, 4)
                         for n in ("sample", "token")]
        for seed in seeds:
            for name, epochs, norm, mb, accum in settings:
                r = run(train_dir, eval_dir, model, work / "drafters" / f"{name}-{seed}",
                        seed=seed, epochs=epochs, loss_norm=norm, micro_batch=mb,
                        grad_accum=accum, **sizes)
                rows.setdefault(name, []).append(r)
                print(f"seed {seed} {name:>26}: τ {r['tau']:.3f} after {r['steps']} steps "
                      f"({r['seconds']} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    table = {}
    print(f"\n{n_train} train / {n_eval} held-out questions, seeds {seeds}, {sizes}")
    print(f"{'setting':>26} {'τ':>7} {'± se':>6} {'steps':>6}")
    for name, rs in rows.items():
        taus = [r["tau"] for r in rs]
        se = statistics.stdev(taus) / math.sqrt(len(taus)) if len(taus) > 1 else 0.0
        table[name] = {"tau": round(statistics.mean(taus), 4), "se": round(se, 4),
                       "steps": rs[0]["steps"], "taus": [round(t, 4) for t in taus]}
        print(f"{name:>26} {table[name]['tau']:7.3f} {se:6.3f} {rs[0]['steps']:6d}")
    print(json.dumps({"study": table, "train_samples": n_train, "eval_samples": n_eval,
                      "seeds": seeds, **sizes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
