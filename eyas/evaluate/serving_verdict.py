"""Rows of the serving benchmark and the verdict computed from them.

A row is one server setting at one batch size::

    {"mode": "baseline" | "eagle3", "batch_size": int, "num_steps": int | None,
     "eagle_topk": int | None, "num_draft_tokens": int | None, "output_tok_s": float,
     "accept_length": float | None}

The verdict compares, at each batch size that has both, the best EAGLE-3 row (highest
``output_tok_s`` over the sweep) with the baseline row: ``speedup = best / baseline``. A speedup
within ``1 ± tie_band`` is a tie. Reports draw the rows; the verdict is one sentence, e.g.
"EAGLE-3 beats the baseline at batch 1 by 2.31x, loses at batch 32 (0.80x)".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from eyas.evaluate.serving_config import SpecKnobs

ROW_KEYS = ("mode", "batch_size", "num_steps", "eagle_topk", "num_draft_tokens", "output_tok_s",
            "accept_length")


def make_row(mode: str, batch_size: int, knobs: SpecKnobs | None, output_tok_s: float,
             accept_length: float | None) -> dict:
    """One result row (the shape reports and the table artifact read)."""
    if mode not in ("baseline", "eagle3") or (mode == "eagle3") != (knobs is not None):
        raise ValueError(f"mode {mode!r} with knobs {knobs!r}: baseline has none, eagle3 has them")
    return {
        "mode": mode, "batch_size": int(batch_size),
        "num_steps": knobs.num_steps if knobs else None,
        "eagle_topk": knobs.eagle_topk if knobs else None,
        "num_draft_tokens": knobs.num_draft_tokens if knobs else None,
        "output_tok_s": float(output_tok_s),
        "accept_length": None if accept_length is None else float(accept_length),
    }


@dataclass(frozen=True)
class Comparison:
    """The best EAGLE-3 setting against the baseline at one batch size."""

    batch_size: int
    baseline_tok_s: float
    eagle3_tok_s: float
    speedup: float
    outcome: str
    """``beats``, ``ties`` or ``loses``."""
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    accept_length: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def compare(rows: list[dict], *, tie_band: float = 0.03) -> list[Comparison]:
    """Per batch size with a baseline row and at least one EAGLE-3 row, sorted by batch size."""
    base = {r["batch_size"]: r for r in rows if r["mode"] == "baseline"}
    spec: dict[int, list[dict]] = {}
    for r in rows:
        if r["mode"] == "eagle3":
            spec.setdefault(r["batch_size"], []).append(r)

    def rank(r: dict) -> tuple:
        # Equal throughput: the cheaper setting wins (fewer draft tokens, steps, branches).
        return (r["output_tok_s"], -r["num_draft_tokens"], -r["num_steps"], -r["eagle_topk"])

    best = {b: max(rs, key=rank) for b, rs in spec.items()}
    out = []
    for b in sorted(set(base) & set(best)):
        base_tok, spec_tok = base[b]["output_tok_s"], best[b]["output_tok_s"]
        speedup = spec_tok / base_tok if base_tok > 0 else float("inf")
        outcome = ("ties" if abs(speedup - 1.0) <= tie_band
                   else "beats" if speedup > 1.0 else "loses")
        r = best[b]
        out.append(Comparison(b, base_tok, spec_tok, speedup, outcome, r["num_steps"],
                              r["eagle_topk"], r["num_draft_tokens"], r["accept_length"]))
    return out


def _x(speedup: float) -> str:
    return f"{speedup:.2f}x"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def verdict(rows: list[dict], *, tie_band: float = 0.03) -> str:
    """One sentence: where EAGLE-3 beats, ties with or loses to the baseline, and by how much."""
    comps = compare(rows, tie_band=tie_band)
    if not comps:
        return ("No verdict: the benchmark has no batch size measured both with the baseline "
                "and with EAGLE-3.")
    wins = [c for c in comps if c.outcome == "beats"]
    ties = [c for c in comps if c.outcome == "ties"]
    losses = [c for c in comps if c.outcome == "loses"]
    rest = []
    if ties:
        rest.append("ties at " + _join([f"batch {c.batch_size} ({_x(c.speedup)})" for c in ties]))
    if losses:
        rest.append("loses at " + _join([f"batch {c.batch_size} ({_x(c.speedup)})"
                                         for c in losses]))
    if wins and len(wins) == len(comps):
        return ("EAGLE-3 beats the baseline at every batch size measured: "
                + _join([f"{_x(c.speedup)} at batch {c.batch_size}" for c in wins]) + ".")
    if wins:
        head = "EAGLE-3 beats the baseline at " + _join(
            [f"batch {c.batch_size} by {_x(c.speedup)}" for c in wins])
        return head + ", " + ", ".join(rest) + "."
    return "EAGLE-3 does not beat the baseline at any batch size: it " + ", ".join(rest) + "."
