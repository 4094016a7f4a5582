"""How busy 8 DDP ranks are at the users' lengths: eyas's step-grouped order vs a plain one.

    python benchmarks/ddp_balance.py --quick    # a few seconds
    python benchmarks/ddp_balance.py            # every group size from 1 to 256

Simulates one epoch of ``eyas.train.data.Batches`` over the users' merged set (24,773 records,
87.8M tokens, each cut at 8,192: the lengths ``benchmarks/_synth.py`` gives the merge
benchmark) for ``--ranks`` processes at micro-batch 1 and ``grad_accum`` 1 (the Kimi recipe's).
A step's cost on one rank is its samples' ``tokens + tokens² / --quadratic-at`` (attention's
share grows with the square; by default it equals the rest at 8,192 tokens), and every rank
waits for the slowest at the step's gradient all-reduce:

    efficiency = Σ_steps Σ_ranks cost / Σ_steps (ranks × max_rank cost)

- ``baseline_efficiency``: the order eyas used before (runs of ``group_batches`` micro-batches
  sorted, each rank taking every ranks-th micro-batch: unrelated lengths side by side);
- ``efficiency``: today's order (runs of ``group_batches`` *steps* sorted and cut into steps,
  all ranks of a step given similar lengths) at the Kimi recipe's ``group_batches``.

Prints a table per group size, then as its last line JSON ``{"ranks", "efficiency",
"baseline_efficiency", ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synth import merged_lengths  # noqa: E402

from eyas.train.data import Batches  # noqa: E402


class LengthsOnly:
    """A source that knows only its samples' lengths (all the order needs)."""

    def __init__(self, lengths: list[int]) -> None:
        self._lengths = lengths
        self.ids = [str(i) for i in range(len(lengths))]

    def __len__(self) -> int:
        return len(self._lengths)

    def lengths(self) -> list[int]:
        return list(self._lengths)


def efficiency(order: list[int], lengths: list[int], *, ranks: int, quadratic_at: float) -> float:
    """Busy share of `ranks` ranks that take `order`'s samples round-robin, one per step."""
    busy = waited = 0.0
    for start in range(0, len(order) - ranks + 1, ranks):
        costs = [lengths[k] + lengths[k] ** 2 / quadratic_at for k in order[start:start + ranks]]
        busy += sum(costs)
        waited += ranks * max(costs)
    return busy / waited


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the recipe's group size and 1 only")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--group-batches", type=int, default=None,
                    help="group size to report (default: the Kimi recipe's train.group_batches)")
    ap.add_argument("--quadratic-at", type=float, default=8192.0,
                    help="tokens at which a sample's quadratic (attention) cost equals its linear")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    recipe_g = args.group_batches
    if recipe_g is None:
        from eyas.config import load_config

        recipe_g = load_config(ROOT / "recipes" / "kimi-k2.5.yaml").train.group_batches
    lengths = merged_lengths()
    source = LengthsOnly(lengths)

    def measure(g: int) -> tuple[float, float]:
        new = Batches(source, micro_batch=1, seed=args.seed, world=args.ranks, group_batches=g)
        old = Batches(source, micro_batch=1, seed=args.seed, world=1, group_batches=g)  # as before
        return (efficiency(new.order(0).tolist(), lengths, ranks=args.ranks,
                           quadratic_at=args.quadratic_at),
                efficiency(old.order(0).tolist(), lengths, ranks=args.ranks,
                           quadratic_at=args.quadratic_at))

    sizes = sorted({1, recipe_g} if args.quick else {1, 2, 4, 8, 16, 32, 64, 128, 256, recipe_g})
    print(f"{len(lengths):,} records, {sum(lengths) / 1e6:.1f}M tokens, {args.ranks} ranks, "
          f"micro-batch 1; cost = tokens + tokens^2/{args.quadratic_at:g}")
    print(f"{'group_batches':>13} {'samples sorted together':>24} {'efficiency':>10} "
          f"{'before':>8}")
    rows = {}
    for g in sizes:
        eff, before = measure(g)
        rows[g] = (eff, before)
        print(f"{g:>13} {g * args.ranks:>24} {eff:>10.3f} {before:>8.3f}")
    eff, before = rows[recipe_g]
    print(json.dumps({"ranks": args.ranks, "efficiency": round(eff, 4),
                      "baseline_efficiency": round(before, 4), "group_batches": recipe_g,
                      "records": len(lengths), "tokens": sum(lengths)}))


if __name__ == "__main__":
    main()
