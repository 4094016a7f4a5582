"""What a training run looks like to a person: a picture of its history and its final evaluation.

Reads the records `eyas.train.trainer.Trainer` writes to ``history.json`` (``kind`` "train":
step, loss, per-step ``acc``, ``acceptance_length``; ``kind`` "eval": the same on the eval
split). Acceptance length is τ as ``eyas.train.metrics`` defines it (the target's bonus token
counted, as SGLang's "accept length"), for 3 draft steps and for the trained unroll k
(``simulated_acceptance_length``). No Prefect: the flow's tasks turn these into artifacts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eyas.train.metrics import upgrade_record


def _split(history: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    history = [upgrade_record(r) for r in history]
    train = [r for r in history if r.get("kind") == "train"]
    evals = [r for r in history if r.get("kind") == "eval"]
    return train, evals


def tau_text(record: dict[str, Any]) -> str:
    """``τ 2.417 (7 draft steps), 2.105 (3)``: a record's acceptance lengths, longest first."""
    lengths = upgrade_record(record)["acceptance_length"]
    steps = sorted(lengths, key=int, reverse=True)
    first, rest = steps[0], steps[1:]
    return (f"τ {lengths[first]:.3f} ({first} draft steps)"
            + "".join(f", {lengths[n]:.3f} ({n})" for n in rest))


def training_picture(history: list[dict[str, Any]], path: Path, *, title: str = "") -> Path:
    """Save a PNG of loss (left) and per-step accuracy acc_i (right) against optimizer steps.

    Training records are lines, evaluations markers. Written atomically; returns `path`.
    Raises ValueError when `history` holds no training or evaluation record.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eyas.io import atomic_write

    train, evals = _split(history)
    if not train and not evals:
        raise ValueError("the history holds no training or evaluation record to draw")
    k = max(len(r["acc"]) for r in train + evals)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train")
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o--", label="eval")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss (Σ 0.8^i · CE_i)")
    ax_loss.set_title("Loss")
    ax_loss.legend()
    colors = plt.get_cmap("viridis")
    for i in range(k):
        color = colors(i / max(1, k - 1))
        if train:
            ax_acc.plot([r["step"] for r in train if len(r["acc"]) > i],
                        [r["acc"][i] for r in train if len(r["acc"]) > i], color=color,
                        label=f"acc_{i}")
        if evals:
            ax_acc.plot([r["step"] for r in evals if len(r["acc"]) > i],
                        [r["acc"][i] for r in evals if len(r["acc"]) > i], "o", color=color,
                        label=None if train else f"acc_{i} (eval)")
    ax_acc.set_xlabel("step")
    ax_acc.set_ylabel("accuracy (lines: train, dots: eval)")
    ax_acc.set_ylim(0, 1)
    ax_acc.set_title("Per-step accuracy acc_i")
    ax_acc.legend(fontsize="small", ncol=2)
    if evals:
        last = evals[-1]
        fig.suptitle(f"{title + ': ' if title else ''}acceptance length {tau_text(last)} "
                     f"at step {last['step']}")
    elif title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)
    return path


def evaluation_rows(evaluation: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per drafting step i of an evaluation record: acc_i and Π_{j≤i} acc_j (the
    estimated chance that drafts 0..i are all accepted); then τ = 1 + the sum of those
    products: a row for 3 draft steps (when fewer than the trained k) and a last one, the
    "simulated acceptance length", for all k."""
    evaluation = upgrade_record(evaluation)
    rows, running = [], 1.0
    for i, acc in enumerate(evaluation["acc"]):
        running *= acc
        rows.append({"draft_step": str(i), "acc": round(acc, 4),
                     "all_accepted_through_step": round(running, 4)})
    k = str(len(evaluation["acc"]))
    for n, tau in sorted(evaluation["acceptance_length"].items(), key=lambda kv: int(kv[0])):
        if n != k:
            rows.append({"draft_step": f"simulated acceptance length, {n} draft steps",
                         "acc": None, "all_accepted_through_step": round(tau, 4)})
    rows.append({"draft_step": "simulated acceptance length", "acc": None,
                 "all_accepted_through_step": round(evaluation["simulated_acceptance_length"], 4)})
    return rows


def summary_markdown(summary: dict[str, Any], history: list[dict[str, Any]]) -> str:
    """A short markdown account of a run: steps, best evaluation, where the export is."""
    train, evals = _split(history)
    best = summary.get("best") or (evals[-1] if evals else None)
    lines = [f"## Drafter training: {summary.get('status', 'done')}", "", "| | |", "|---|---|",
             f"| steps | {summary.get('steps')} |",
             f"| resumed from step | {summary.get('resumed_from')} |",
             f"| draft vocabulary | {summary.get('draft_vocab_size')} |"]
    if train:
        last = train[-1]
        lines.append(f"| last training loss | {last['loss']:.4f} (step {last['step']}) |")
        if "tok_s" in last and math.isfinite(last["tok_s"]):
            lines.append(f"| training tokens/s | {last['tok_s']:.0f} |")
    if best:
        acc = ", ".join(f"{a:.3f}" for a in best["acc"])
        lines += [f"| best evaluation | step {best['step']}, loss {best['loss']:.4f} |",
                  f"| acc_i | {acc} |",
                  f"| **simulated acceptance length** | **{tau_text(best)}** (tokens per "
                  "verification, the target's bonus token counted, as SGLang's accept length) |"]
    lines.append(f"| export | `{summary.get('export')}` |")
    return "\n".join(lines) + "\n"
