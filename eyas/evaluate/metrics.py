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
  one plain decoding step of the target. Predicted speedup = τ / (k·c + v), v the cost of a
  verification of k + 1 tokens in decoding steps: the EAGLE papers' estimate takes v = 1 (a
  dense target decoding at small batch on a GPU is memory-bound, so k + 1 tokens cost what one
  does); ``evaluate.verify_cost`` sets v for targets where that fails (MoE). The
  ``this_device`` variant uses the verification cost measured here instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eyas.evaluate.speculate import Generation


def acceptance_length(gens: Sequence[Generation]) -> float | None:
    """τ over `gens`; None when there was no verification."""
    cycles = sum(g.cycles for g in gens)
    return sum(sum(g.accept_lengths) for g in gens) / cycles if cycles else None


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


def predicted_speedup(tau: float | None, cost: dict[str, Any],
                      verify_cost: float = 1.0) -> dict[str, float | None]:
    """``serving``: τ / (k·c + verify_cost); ``this_device``: τ·step / (k·draft + verify)."""
    k, c = cost["draft_tokens"], cost["draft_to_target"]
    serving = tau / (k * c + verify_cost) if tau is not None and c is not None else None
    step, draft, verify = cost["target_step_ms"], cost["draft_step_ms"], cost["verify_ms"]
    here = (tau * step / (k * draft + verify)
            if None not in (tau, step, draft, verify) and k * draft + verify > 0 else None)
    return {"serving": serving, "this_device": here}


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
