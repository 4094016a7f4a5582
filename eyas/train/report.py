"""What a training run looks like to a person: a picture of its history and its final evaluation.

Reads the records `eyas.train.trainer.Trainer` writes to ``history.json`` (``kind`` "train":
step, loss, per-step ``acc``; ``kind`` "eval": the same on the eval split plus
``simulated_acceptance_length``). No Prefect: the flow's tasks turn these into artifacts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _split(history: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    train = [r for r in history if r.get("kind") == "train"]
    evals = [r for r in history if r.get("kind") == "eval"]
    return train, evals


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
        fig.suptitle(f"{title + ': ' if title else ''}simulated acceptance length "
                     f"{last['simulated_acceptance_length']:.3f} at step {last['step']}")
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
    estimated chance that drafts 0..i are all accepted); a last row with the simulated
    acceptance length, their sum."""
    rows, running = [], 1.0
    for i, acc in enumerate(evaluation["acc"]):
        running *= acc
        rows.append({"draft_step": str(i), "acc": round(acc, 4),
                     "all_accepted_through_step": round(running, 4)})
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
                  f"| **simulated acceptance length** | **{best['simulated_acceptance_length']:.3f}**"
                  " (draft tokens accepted per verification; a server's accept length counts "
                  "one more) |"]
    lines.append(f"| export | `{summary.get('export')}` |")
    return "\n".join(lines) + "\n"
