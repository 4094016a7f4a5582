"""Rows of the serving benchmark and the verdict computed from them.

A row is one server setting at one batch size, over its repeated runs::

    {"mode": "baseline" | "ngram" | "eagle3", "batch_size": int, "num_steps": int | None,
     "eagle_topk": int | None, "num_draft_tokens": int | None,
     "output_tok_s": float, "accept_length": float | None,
     "output_tok_s_min": float, "output_tok_s_max": float,
     "decode_tok_s": float | None, "decode_tok_s_min": ..., "decode_tok_s_max": ...,
     "ttft_s": float | None, "repeats": int}

``output_tok_s`` is the run's throughput (all requests' tokens / wall time), ``decode_tok_s`` one
request's decode speed with the prefill excluded (`eyas.evaluate.loadgen`), ``ttft_s`` the time
to the first token; each is the median over the runs, with their min and max beside it.

The speed the verdict compares (`speed_key`): at batch 1 a request's decode tokens/s (what users
quote as "90 tok/s"), at larger batches the output throughput. At each batch size that has both,
the best EAGLE-3 row (highest median) is compared with the baseline row: ``speedup = best /
baseline`` (medians). The runs decide what may be said:

- the runs' ranges do not overlap: ``beats`` or ``loses``, or ``ties`` when the speedup is
  within ``1 ± tie_band``;
- they overlap, and every ratio the ranges allow is within ``1 ± tie_band``: ``ties``;
- they overlap more widely: ``within noise`` (no call either way).

One run per point has no spread: its ranges overlap only when equal. The verdict is one
sentence, e.g. "EAGLE-3 beats the baseline at batch 1 by 2.31x, loses at batch 32 (0.80x)", and
one more against SGLang's n-gram speculation when it was served.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from eyas.evaluate.serving_config import SpecKnobs

MODES = ("baseline", "ngram", "eagle3")
ROW_KEYS = ("mode", "batch_size", "num_steps", "eagle_topk", "num_draft_tokens", "output_tok_s",
            "accept_length", "output_tok_s_min", "output_tok_s_max", "decode_tok_s",
            "decode_tok_s_min", "decode_tok_s_max", "ttft_s", "repeats")
NAMES = {"baseline": "the baseline", "ngram": "SGLang's n-gram speculation"}


def _median(xs: Sequence[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def make_row(mode: str, batch_size: int, knobs: SpecKnobs | None,
             output_tok_s: float | Sequence[float], accept_length: float | None, *,
             decode_tok_s: Sequence[float] = (), ttft_s: Sequence[float] = ()) -> dict:
    """One result row (the shape reports and the table artifact read) from one run's throughput
    or the repeats' (`output_tok_s` a list), and their decode speeds and first-token times."""
    if mode not in MODES or (mode == "eagle3") != (knobs is not None):
        raise ValueError(f"mode {mode!r} with knobs {knobs!r}: only eagle3 has knobs "
                         f"(modes: {', '.join(MODES)})")
    runs = [float(output_tok_s)] if isinstance(output_tok_s, (int, float)) else [
        float(x) for x in output_tok_s]
    if not runs:
        raise ValueError("a row needs at least one run's throughput")
    decode = [float(x) for x in decode_tok_s]
    return {
        "mode": mode, "batch_size": int(batch_size),
        "num_steps": knobs.num_steps if knobs else None,
        "eagle_topk": knobs.eagle_topk if knobs else None,
        "num_draft_tokens": knobs.num_draft_tokens if knobs else None,
        "output_tok_s": _median(runs),
        "accept_length": None if accept_length is None else float(accept_length),
        "output_tok_s_min": min(runs), "output_tok_s_max": max(runs),
        "decode_tok_s": _median(decode) if decode else None,
        "decode_tok_s_min": min(decode) if decode else None,
        "decode_tok_s_max": max(decode) if decode else None,
        "ttft_s": _median([float(x) for x in ttft_s]) if ttft_s else None,
        "repeats": len(runs),
    }


def speed_key(batch_size: int, *rows: dict) -> str:
    """``decode_tok_s`` at batch 1 when every row has it, else ``output_tok_s``."""
    if batch_size == 1 and all(r.get("decode_tok_s") is not None for r in rows):
        return "decode_tok_s"
    return "output_tok_s"


def _range(row: dict, key: str) -> tuple[float, float]:
    lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
    return (row[key] if lo is None else lo, row[key] if hi is None else hi)


def outcome(ref: tuple[float, float], new: tuple[float, float], speedup: float,
            tie_band: float) -> str:
    """``beats`` / ``ties`` / ``loses`` / ``within noise`` from the runs' ranges (module
    docstring)."""
    if new[0] > ref[1] or new[1] < ref[0]:
        return "ties" if abs(speedup - 1.0) <= tie_band else "beats" if speedup > 1 else "loses"
    lo = new[0] / ref[1] if ref[1] > 0 else float("inf")
    hi = new[1] / ref[0] if ref[0] > 0 else float("inf")
    return "ties" if 1 - tie_band <= lo and hi <= 1 + tie_band else "within noise"


@dataclass(frozen=True)
class Comparison:
    """The best EAGLE-3 setting against the baseline (or the n-gram server) at one batch size."""

    batch_size: int
    baseline_tok_s: float
    """The reference's median speed (`metric`): the baseline's, or the n-gram server's."""
    eagle3_tok_s: float
    speedup: float
    outcome: str
    """``beats``, ``ties``, ``loses`` or ``within noise``."""
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    accept_length: float | None
    metric: str = "output_tok_s"
    """What is compared: ``decode_tok_s`` (a request's decode speed) or ``output_tok_s``."""
    baseline_range: tuple[float, float] | None = None
    """Min and max of the reference's runs."""
    eagle3_range: tuple[float, float] | None = None
    repeats: int = 1
    reference: str = "baseline"
    """``baseline`` or ``ngram``."""

    def to_dict(self) -> dict:
        return asdict(self)


def compare(rows: list[dict], *, tie_band: float = 0.03,
            reference: str = "baseline") -> list[Comparison]:
    """Per batch size with a `reference` row (``baseline`` or ``ngram``) and at least one
    EAGLE-3 row, sorted by batch size."""
    base = {r["batch_size"]: r for r in rows if r["mode"] == reference}
    spec: dict[int, list[dict]] = {}
    for r in rows:
        if r["mode"] == "eagle3":
            spec.setdefault(r["batch_size"], []).append(r)
    out = []
    for b in sorted(set(base) & set(spec)):
        key = speed_key(b, base[b], *spec[b])

        def rank(r: dict, key: str = key) -> tuple:
            # Equal speed: the cheaper setting wins (fewer draft tokens, steps, branches).
            return (r[key], -r["num_draft_tokens"], -r["num_steps"], -r["eagle_topk"])

        r = max(spec[b], key=rank)
        base_tok, spec_tok = base[b][key], r[key]
        speedup = spec_tok / base_tok if base_tok > 0 else float("inf")
        ref_range, new_range = _range(base[b], key), _range(r, key)
        out.append(Comparison(
            b, base_tok, spec_tok, speedup, outcome(ref_range, new_range, speedup, tie_band),
            r["num_steps"], r["eagle_topk"], r["num_draft_tokens"], r["accept_length"],
            metric=key, baseline_range=ref_range, eagle3_range=new_range,
            repeats=min(base[b].get("repeats") or 1, r.get("repeats") or 1),
            reference=reference))
    return out


def _x(speedup: float) -> str:
    return f"{speedup:.2f}x"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _sentence(comps: list[Comparison], name: str) -> str:
    wins = [c for c in comps if c.outcome == "beats"]
    rest = []
    for word, kind in (("ties", "ties"), ("loses", "loses"), ("is within noise", "within noise")):
        some = [c for c in comps if c.outcome == kind]
        if some:
            rest.append(f"{word} at " + _join([f"batch {c.batch_size} ({_x(c.speedup)})"
                                               for c in some]))
    if wins and len(wins) == len(comps):
        return (f"EAGLE-3 beats {name} at every batch size measured: "
                + _join([f"{_x(c.speedup)} at batch {c.batch_size}" for c in wins]) + ".")
    if wins:
        head = f"EAGLE-3 beats {name} at " + _join(
            [f"batch {c.batch_size} by {_x(c.speedup)}" for c in wins])
        return head + ", " + ", ".join(rest) + "."
    return f"EAGLE-3 does not beat {name} at any batch size: it " + ", ".join(rest) + "."


def verdict(rows: list[dict], *, tie_band: float = 0.03) -> str:
    """Where EAGLE-3 beats, ties with or loses to the baseline (and to SGLang's n-gram
    speculation when served), by how much, or where the runs' spread allows no call."""
    comps = compare(rows, tie_band=tie_band)
    if not comps:
        return ("No verdict: the benchmark has no batch size measured both with the baseline "
                "and with EAGLE-3.")
    text = _sentence(comps, NAMES["baseline"])
    ngram = compare(rows, tie_band=tie_band, reference="ngram")
    if ngram:
        text += " " + _sentence(ngram, NAMES["ngram"])
    return text


def measured_costs(rows: list[dict]) -> dict | None:
    """Draft and verification costs on the serving engine, read from the batch-1 rows.

    A request's decode time per token is a target step without speculation
    (``target_step_ms = 1000 / decode_tok_s``); with a chain of k draft steps and accept length
    τ a verification cycle lasts ``cycle_ms = 1000 · τ / decode_tok_s`` = ``k · draft_step_ms +
    verify_ms``. Two or more chain lengths: both fitted (least squares; ``method`` "fit over
    num_steps"). One: ``verify_ms`` from the n-gram server's cycle when served (its drafting runs
    on the CPU, so its cycle is nearly all verification), else taken as one target step. So
    ``decode tok/s ≈ 1000 · τ / (k · draft_step_ms + verify_ms)`` predicts a setting's batch-1
    speed on this engine from an offline τ. None without a batch-1 baseline decode speed."""
    at1 = [r for r in rows if r["batch_size"] == 1 and r.get("decode_tok_s")]
    base = next((r for r in at1 if r["mode"] == "baseline"), None)
    if base is None:
        return None
    step = 1000.0 / base["decode_tok_s"]

    def cycle(r: dict) -> float | None:
        return 1000.0 * r["accept_length"] / r["decode_tok_s"] if r.get("accept_length") else None

    chains = [r for r in at1 if r["mode"] == "eagle3" and r["eagle_topk"] == 1 and cycle(r)]
    ngram = next((r for r in at1 if r["mode"] == "ngram" and cycle(r)), None)
    settings = [{"num_steps": r["num_steps"], "eagle_topk": 1,
                 "num_draft_tokens": r["num_draft_tokens"], "accept_length": r["accept_length"],
                 "decode_tok_s": r["decode_tok_s"], "cycle_ms": cycle(r)} for r in chains]
    draft = verify = None
    method = "no EAGLE-3 chain (topk 1) measured at batch 1 with an accept length"
    ks = [r["num_steps"] for r in chains]
    if len(set(ks)) >= 2:
        ys = [cycle(r) for r in chains]
        mk, my = sum(ks) / len(ks), sum(ys) / len(ys)
        draft = (sum((k - mk) * (y - my) for k, y in zip(ks, ys, strict=True))
                 / sum((k - mk) ** 2 for k in ks))
        verify = my - draft * mk
        method = "fit over num_steps (cycle = k · draft + verify)"
    elif chains:
        verify = cycle(ngram) if ngram else step
        method = ("verification from the n-gram server's cycle (its drafting runs on the CPU)"
                  if ngram else "verification taken as one target step (no n-gram server)")
        draft = sum((cycle(r) - verify) / r["num_steps"] for r in chains) / len(chains)
    return {"engine": "SGLang", "batch_size": 1, "target_step_ms": step,
            "draft_step_ms": draft, "verify_ms": verify,
            "draft_to_target": draft / step if draft is not None else None,
            "verify_to_target": verify / step if verify is not None else None,
            "ngram_cycle_ms": cycle(ngram) if ngram else None,
            "method": method, "settings": settings}
