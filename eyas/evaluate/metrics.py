"""Figures of an evaluation, from the generations: τ, acceptance by position, tokens/s, costs,
the predicted speedup, and the simulated τ of training beside the measured one.

Definitions (every figure in ``report.json`` comes from one of these functions):

- τ (acceptance length) = tokens kept per verification, summed over all verifications of all
  prompts, divided by their count. It counts the target's own token (the bonus or the
  correction), as SGLang's ``accept_length`` does: τ = 1 means no draft was ever accepted.
- acceptance at draft position i (1-based): of the verifications whose drafts 1..i-1 were all
  accepted and that proposed an i-th draft, the share that accepted it (conditional, as
  training's acc_i is); ``at_least`` is the share of all verifications that accepted >= i.
- tokens/s = generated tokens / wall seconds, prompts' forward passes included.
- draft-step cost c = drafter seconds per chain step (its cache update included) / seconds of
  one plain decoding step of the target, both measured on the evaluating device.
- speedup predicted for a device = τ · step / (k · draft + verify), every cost measured on that
  device: a step of plain decoding, a draft step, a verification of k + 1 tokens. No cost is
  derived from parameter counts: a decoding step is far more than its weight reads (at the
  users' 90 tok/s a Kimi-K2.5 step takes ~11 ms of which ~2 ms read weights), so only
  measured costs say what a verification costs. ``this_device`` uses the costs measured here
  (the CPU in the demo): a figure of this device, not of serving. The serving prediction uses
  costs measured on the serving engine (`serving_prediction`), and is None without them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from eyas.evaluate.speculate import Generation

BOOTSTRAP_RESAMPLES = 2000
"""Resamples of the prompts behind each 95 % interval."""
BOOTSTRAP_SEED = 0
"""Fixed, so that a report's intervals do not move when it is recomputed from the same
generations."""
MIN_PROMPTS_FOR_CI = 2
"""Fewer prompts give no interval (one prompt resampled is always itself)."""


def acceptance_length(gens: Sequence[Generation]) -> float | None:
    """τ over `gens`; None when there was no verification."""
    cycles = sum(g.cycles for g in gens)
    return sum(sum(g.accept_lengths) for g in gens) / cycles if cycles else None


def bootstrap_ci95(results: Mapping[str, Sequence[Generation]], reference: str,
                   indices: Sequence[int] | None = None, *, resamples: int = BOOTSTRAP_RESAMPLES,
                   seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """95 % percentile-bootstrap intervals of τ over prompts, for every method of `results`
    (each a list of generations in the same prompt order) and of τ(reference) − τ(method).

    A resample draws prompts with replacement (the same draw for every method: the difference
    is paired) and recomputes τ as Σ kept / Σ verifications over the drawn prompts, so a
    prompt's verifications stay together (they are correlated). `indices` restricts to those
    prompts (a dataset). Returns ``{"ci95": {method: [lo, hi]}, "difference_ci95": {method:
    [lo, hi]}}`` (methods other than `reference`); every interval None with fewer than
    `MIN_PROMPTS_FOR_CI` prompts, or for a method that never verified.
    """
    n_all = len(next(iter(results.values()))) if results else 0
    idx = list(range(n_all)) if indices is None else list(indices)
    others = [m for m in results if m != reference]
    empty = {"ci95": {m: None for m in results},
             "difference_ci95": {m: None for m in others}}
    if len(idx) < MIN_PROMPTS_FOR_CI:
        return empty
    g = torch.Generator().manual_seed(seed)
    draw_BN = torch.randint(len(idx), (resamples, len(idx)), generator=g)
    taus: dict[str, torch.Tensor] = {}
    for m, gens in results.items():
        kept = torch.tensor([float(sum(gens[i].accept_lengths)) for i in idx], dtype=torch.float64)
        cycles = torch.tensor([float(gens[i].cycles) for i in idx], dtype=torch.float64)
        if cycles.sum() == 0:
            continue
        den_B = cycles[draw_BN].sum(1)
        # A resample of prompts that never verified has no τ: left out of the quantiles.
        taus[m] = torch.where(den_B > 0, kept[draw_BN].sum(1) / den_B.clamp(min=1), torch.nan)

    def interval(x_B: torch.Tensor) -> list[float] | None:
        x_B = x_B[~torch.isnan(x_B)]
        if x_B.numel() == 0:
            return None
        lo, hi = torch.quantile(x_B, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
        return [lo, hi]

    out = {"ci95": {m: interval(taus[m]) if m in taus else None for m in results},
           "difference_ci95": {}}
    for m in others:
        out["difference_ci95"][m] = (interval(taus[reference] - taus[m])
                                     if reference in taus and m in taus else None)
    return out


def comparison(difference_ci95: Sequence[float] | None) -> str:
    """"ahead" / "behind" only when the difference's 95 % interval excludes zero; else
    "within noise" (or "not computed" without an interval)."""
    if difference_ci95 is None:
        return "not computed"
    lo, hi = difference_ci95
    return "ahead" if lo > 0 else "behind" if hi < 0 else "within noise"


def per_position(gens: Sequence[Generation], k: int) -> list[dict[str, Any]]:
    """Acceptance at draft positions 1..k (module docstring), with the counts behind it."""
    reached = [0] * k
    accepted = [0] * k
    cycles = 0
    for g in gens:
        for n, a in zip(g.proposed, g.accepted, strict=True):
            cycles += 1
            for i in range(min(n, a + 1)):
                reached[i] += 1
                if i < a:
                    accepted[i] += 1
    return [{"position": i + 1, "reached": reached[i], "accepted": accepted[i],
             "rate": accepted[i] / reached[i] if reached[i] else None,
             "at_least": accepted[i] / cycles if cycles else None} for i in range(k)]


def tokens_per_s(gens: Sequence[Generation]) -> float | None:
    seconds = sum(g.seconds for g in gens)
    return sum(len(g.tokens) for g in gens) / seconds if seconds > 0 else None


def summary(gens: Sequence[Generation], k: int) -> dict[str, Any]:
    """τ, per-position acceptance, tokens/s and counts of one method's generations."""
    return {"acceptance_length": acceptance_length(gens), "per_position": per_position(gens, k),
            "tokens_per_s": tokens_per_s(gens), "tokens": sum(len(g.tokens) for g in gens),
            "verifications": sum(g.cycles for g in gens),
            "seconds": sum(g.seconds for g in gens)}


def costs(plain: Sequence[Generation], drafted: Sequence[Generation], k: int) -> dict[str, Any]:
    """Measured seconds of a target decoding step, a draft step and a verification, and the
    draft-to-target cost ratio c (module docstring); None where nothing was measured."""
    def ratio(num: float, den: int) -> float | None:
        return num / den if den else None

    step = ratio(sum(g.target_seconds for g in plain), sum(g.target_calls for g in plain))
    draft = ratio(sum(g.draft_seconds for g in drafted), sum(g.draft_steps for g in drafted))
    verify = ratio(sum(g.target_seconds for g in drafted), sum(g.target_calls for g in drafted))
    c = draft / step if draft is not None and step else None
    return {"target_step_ms": _ms(step), "draft_step_ms": _ms(draft),
            "verify_ms": _ms(verify), "draft_to_target": c,
            "verify_to_target": verify / step if verify is not None and step else None,
            "draft_tokens": k}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def predicted_speedup(tau: float | None, cost: dict[str, Any]) -> float | None:
    """τ · step / (k · draft + verify) from `cost` (`costs`, or the serving engine's: ms of a
    plain decoding step ``target_step_ms``, a draft step ``draft_step_ms`` and a verification
    ``verify_ms`` of ``draft_tokens`` + 1 tokens); None when one is missing."""
    k = cost.get("draft_tokens")
    step, draft, verify = cost.get("target_step_ms"), cost.get("draft_step_ms"), cost.get("verify_ms")
    if None in (tau, k, step, draft, verify) or k * draft + verify <= 0:
        return None
    return tau * step / (k * draft + verify)


SERVING_COST_KEYS = ("target_step_ms", "draft_step_ms", "verify_ms")


def serving_prediction(tau: float | None, k: int, serving: dict[str, Any] | None
                       ) -> dict[str, Any]:
    """The speedup that the offline τ (k drafts) predicts for serving, from the costs the
    serving benchmark measured on the engine at batch 1 (``serving["draft_cost_measured"]``,
    `eyas.evaluate.serving_verdict.measured_costs`: ms of a decoding step without speculation,
    of a draft step and of a verification, and the ``method`` that separated the last two).
    ``value`` None, with ``note`` saying why, without those costs or without an offline τ."""
    costs = (serving or {}).get("draft_cost_measured") or {}
    missing = [key for key in SERVING_COST_KEYS if costs.get(key) is None]
    if missing:
        return {"value": None, "note": "not predicted: no draft and verification costs measured "
                "on the serving engine" + (f" ({', '.join(missing)} missing)" if costs else "")}
    if tau is None:
        return {"value": None, "note": "not predicted: no offline τ"}
    value = predicted_speedup(tau, {**costs, "draft_tokens": k})
    how = f"; {costs['method']}" if costs.get("method") else ""
    return {"value": value, "note": "from the offline τ and the decoding, draft and verification "
            f"costs measured on the serving engine at batch 1{how}",
            "costs": {key: costs[key] for key in SERVING_COST_KEYS}}


def simulated_acceptance_length(acc: Sequence[float], k: int) -> float:
    """τ that training's per-step accuracies predict for k drafts: 1 + Σ_{j<k} Π_{i≤j} acc_i
    (uses the first k of `acc`; fewer when training unrolled fewer steps)."""
    run, tau = 1.0, 1.0
    for a in list(acc)[:k]:
        run *= a
        tau += run
    return tau


def compare_simulated(metrics: dict | None, measured: float | None, k: int,
                      warn: float) -> dict[str, Any]:
    """Training's simulated τ (from its best evaluation's acc_i) beside the measured one.

    ``flagged`` when they differ by more than `warn` × the simulated value.
    """
    if not metrics or not metrics.get("acc"):
        return {"available": False, "flagged": False,
                "note": "the drafter carries no training evaluation (no acc_i)"}
    acc = [float(a) for a in metrics["acc"]]
    sim = simulated_acceptance_length(acc, k)
    gap = (measured - sim) / sim if measured is not None else None
    out = {"available": True, "acc": acc, "draft_tokens": k, "steps_used": min(k, len(acc)),
           "simulated_acceptance_length": sim, "measured_acceptance_length": measured,
           "relative_gap": gap, "flagged": gap is not None and abs(gap) > warn,
           "warn_above": warn, "training_step": metrics.get("step"),
           "recorded": metrics.get("simulated_acceptance_length")}
    if out["flagged"]:
        out["note"] = (f"measured τ {measured:.3f} differs from training's simulated {sim:.3f} "
                       f"by {100 * gap:+.0f}% (more than {100 * warn:.0f}%): the eval data may not "
                       "be the target's own outputs, or the drafter sees other states in "
                       "serving than in training")
    return out
