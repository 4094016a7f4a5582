"""SGLang's accept length beside the offline τ and training's simulated τ: the check that
catches a drafter served wrong.

Three figures measure the same thing -- tokens per verification, the bonus token counted:

- **served**: the accept length SGLang reports (Σ completion tokens / Σ verifications of the
  serving benchmark's requests), from the EAGLE-3 row with ``eagle_topk`` 1 and, when there is
  one, ``num_steps`` equal to the offline ``draft_tokens`` (the smallest batch size of those);
- **offline**: the offline evaluator's τ (transformers, the same chain of k drafts);
- **simulated**: training's estimate ``1 + Σ_i Π_{j<=i} acc_j`` at the served number of steps.

The rule (`accept_check`): the reference is the offline τ when it is comparable (it ran, with
``num_steps`` = its k, both greedy: ``mode: greedy`` and ``serving.temperature`` 0), else the
simulated τ. The gap is flagged when ``|served - reference|`` exceeds BOTH
``gap_warning`` x reference (25 % by default: served prompts, answer lengths and batching
differ from the offline run's, which moves τ by a few per cent) AND the sampling band of the
reference: 1.96 standard errors of the offline τ over its verification steps (from its
per-position counts; steps of one answer are correlated, so the band is a floor -- hence the
relative threshold as well). A served accept length of at most `NEVER_ACCEPTED` against a
reference of at least 1.3 is always flagged: no draft token was ever accepted.
"""

from __future__ import annotations

import math
from typing import Any

from eyas.evaluate.metrics import simulated_acceptance_length

NEVER_ACCEPTED = 1.05
"""A served accept length at or below this: the drafter's tokens are (almost) never accepted."""

CAUSES_NONE_ACCEPTED = (
    "`--speculative-algorithm EAGLE` given an EAGLE-3 drafter: SGLang serves it without the "
    "target's auxiliary hidden states, accepts nothing and reports accept length exactly 1.0, "
    "with no error (use EAGLE3)",
    "a wrong or missing `d2t` in model.safetensors: the drafter's ids map to other target "
    "tokens (re-export the drafter with eyas)",
    "auxiliary layer ids other than those trained on (config.json "
    "eagle_config.eagle_aux_hidden_state_layer_ids; SGLang adds 1 to DeepSeek-family ids only "
    "when the first is 1)",
    "a drafter trained for another target or tokenizer",
)
CAUSES_LOWER = (
    "auxiliary layers off by one (the drafter sees states one layer early or late)",
    "served prompts rendered with another chat template than the training data (e.g. without "
    "Kimi's thinking generation prompt `<think>`)",
    "served prompts and answers unlike the training data (other datasets, much longer answers)",
    "a target served in another precision or quantization than the one that wrote the data",
)
CAUSES_HIGHER = (
    "easier served prompts or shorter answers than the offline evaluation's",
    "an offline evaluation on too few prompts",
)


def _band(per_position: list[dict[str, Any]]) -> float | None:
    """1.96 x the standard error of τ from per-position counts: with n verification steps and
    P(X >= i) = accepted_i / n for X the drafts accepted in one step, E[X] = Σ P(X >= i) and
    E[X²] = Σ (2i - 1) P(X >= i)."""
    if not per_position or not per_position[0].get("reached"):
        return None
    n = per_position[0]["reached"]
    tail = [r["accepted"] / n for r in per_position]
    mean = sum(tail)
    second = sum((2 * i + 1) * p for i, p in enumerate(tail))
    return 1.96 * math.sqrt(max(0.0, second - mean * mean) / n)


def _served_row(rows: list[dict[str, Any]], k: int) -> dict[str, Any] | None:
    chain = [r for r in rows if r.get("mode") == "eagle3" and r.get("eagle_topk") == 1
             and r.get("accept_length") is not None]
    if not chain:
        return None
    same = [r for r in chain if r.get("num_steps") == k]
    return min(same or chain, key=lambda r: (r["batch_size"], r["num_steps"]))


def accept_check(report: dict[str, Any]) -> dict[str, Any]:
    """The three accept lengths of `report` side by side, and whether their gap is flagged
    (the rule in the module docstring). ``available`` is False without a served row."""
    k = report.get("draft_tokens")
    serving = report.get("serving") or {}
    row = _served_row(serving.get("rows") or [], k)
    sim = report.get("simulated") or {}
    offline_tau = report.get("acceptance_length")
    out: dict[str, Any] = {"available": row is not None, "offline": offline_tau,
                           "offline_draft_tokens": k, "served": None, "simulated": None,
                           "flagged": False, "note": None, "causes": []}
    if row is None:
        out["note"] = "no served EAGLE-3 accept length (no serving benchmark with topk 1)"
        return out
    steps = row["num_steps"]
    served = float(row["accept_length"])
    out.update(served=served, served_setting={k2: row[k2] for k2 in (
        "batch_size", "num_steps", "eagle_topk", "num_draft_tokens")})
    if sim.get("available"):
        out["simulated"] = simulated_acceptance_length(sim["acc"], steps)
    temperature = (serving.get("config") or {}).get("temperature", 0.0)
    comparable = (offline_tau is not None and steps == k and report.get("mode") == "greedy"
                  and not temperature)
    if comparable:
        reference, ref_name = offline_tau, "offline τ"
        band = _band(report.get("per_position") or [])
    elif out["simulated"] is not None:
        reference, ref_name, band = out["simulated"], "training's simulated τ", None
    else:
        out["note"] = ("nothing to compare the served accept length with (no comparable offline "
                       "τ, no training evaluation in the drafter's export)")
        return out
    warn = (report.get("config") or {}).get("gap_warning", 0.25)
    gap = served - reference
    limit = max(warn * reference, band or 0.0)
    out.update(reference=ref_name, reference_value=reference, gap=gap,
               relative_gap=gap / reference if reference else None, band=band, limit=limit)
    if served <= NEVER_ACCEPTED and reference >= 1.3:
        out.update(flagged=True, causes=list(CAUSES_NONE_ACCEPTED), note=(
            f"SGLang's accept length is {served:.2f} against {ref_name} {reference:.2f}: no "
            "draft token is accepted in serving"))
    elif abs(gap) > limit:
        out.update(flagged=True, causes=list(CAUSES_LOWER if gap < 0 else CAUSES_HIGHER), note=(
            f"SGLang's accept length {served:.2f} differs from {ref_name} {reference:.2f} by "
            f"{gap:+.2f}, more than sampling explains (limit {limit:.2f}: the larger of "
            f"{100 * warn:.0f}% and the 95% band)"))
    else:
        out["note"] = (f"SGLang's accept length {served:.2f} agrees with {ref_name} "
                       f"{reference:.2f} (gap {gap:+.2f}, limit {limit:.2f})")
    return out
