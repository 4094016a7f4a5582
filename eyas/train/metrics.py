"""The numbers a drafter is compared by: per-step accuracy and acceptance length τ.

One definition, used by every record, report, picture and document of this project:

- ``acc_i`` (draft step i = 0, 1, ...): among the positions whose predicted token is
  supervised (loss mask 1), the share where the drafter's argmax, as a target id, equals the
  target's argmax over its *whole* vocabulary. The denominator is the loss mask alone, for
  every storage; a position whose target argmax lies outside the draft vocabulary is a miss
  (the drafter can never propose it).
- acceptance length for n draft steps, as SGLang reports ``accept length`` and the EAGLE papers
  report τ: tokens emitted per verification, the target's own (bonus) token included::

      τ_n = 1 + Σ_{k=0}^{n-1} Π_{i≤k} acc_i

  It is a simulation: a product of per-step accuracies measured under teacher forcing (every
  earlier draft accepted), with top-1 drafting (``--speculative-eagle-topk 1``). Records carry
  τ for the draft lengths people serve with: ``SERVED_DRAFT_STEPS`` (3, SGLang's
  ``--speculative-num-steps 3``) and the trained unroll k.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

SERVED_DRAFT_STEPS = 3
"""The draft length most deployments serve with (``--speculative-num-steps 3``)."""


def accuracies(correct: torch.Tensor, total: torch.Tensor) -> list[float]:
    """Per-step accuracy ``correct / total`` (0.0 where nothing was scored)."""
    return [c / t if t else 0.0 for c, t in zip(correct.tolist(), total.tolist(), strict=True)]


def acceptance_length(acc: Sequence[float], draft_steps: int | None = None) -> float:
    """τ = 1 + Σ_{k<n} Π_{i≤k} acc_i for n = `draft_steps` (default: every step of `acc`).

    Raises ValueError when `acc` holds fewer than `draft_steps` steps.
    """
    n = len(acc) if draft_steps is None else draft_steps
    if n > len(acc):
        raise ValueError(f"τ for {n} draft steps needs {n} per-step accuracies, got {len(acc)}")
    run, tau = 1.0, 1.0
    for a in acc[:n]:
        run *= a
        tau += run
    return tau


def acceptance_lengths(acc: Sequence[float]) -> dict[str, float]:
    """τ for the served draft length (3) and for every trained step (k = ``len(acc)``), keyed
    by the number of draft steps as a string (JSON keys): ``{"3": τ_3, "7": τ_7}``; one entry
    when k ≤ 3."""
    lengths = sorted({min(SERVED_DRAFT_STEPS, len(acc)), len(acc)})
    return {str(n): acceptance_length(acc, n) for n in lengths if n > 0}


def summarise(correct: torch.Tensor, total: torch.Tensor) -> dict:
    """The metric fields of a training or evaluation record: ``acc`` (per step),
    ``acceptance_length`` (τ by draft steps) and ``simulated_acceptance_length`` (τ_k, the
    trained unroll: what selects the best checkpoint)."""
    acc = accuracies(correct, total)
    return {"acc": acc, "acceptance_length": acceptance_lengths(acc),
            "simulated_acceptance_length": acceptance_length(acc)}


def upgrade_record(record: dict) -> dict:
    """A history record written before τ counted the bonus token, recomputed from its ``acc``
    (records that carry ``acceptance_length`` are returned unchanged)."""
    if "acc" not in record or "acceptance_length" in record:
        return record
    return {**record, "acceptance_length": acceptance_lengths(record["acc"]),
            "simulated_acceptance_length": acceptance_length(record["acc"])}
