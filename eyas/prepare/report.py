"""Readable summaries of a data-preparation run: tables, markdown and a picture.

Prefect-free: the flows turn these into artifacts; the CLI prints them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BAR = "█"


def dataset_rows(tokenized: dict[str, dict[str, Any]], merge_stats: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per dataset: phase-2 statistics plus its share of the merge.

    `tokenized` maps a dataset name to the stats its tokenization returned
    (samples, tokens, mean_len, max_len, supervised_fraction, cut_answers, rejected,
    rejected_reasons, ...). ``cut_share`` is the share of the dataset's samples holding an
    answer cut at ``max_tokens``; ``reject_reasons`` the rejects per reason, in words.
    """
    total_samples = sum(s.get("samples", 0) for s in tokenized.values()) or 1
    total_tokens = sum(s.get("tokens", 0) for s in tokenized.values()) or 1
    outliers = {o["dataset"]: o for o in (merge_stats or {}).get("outliers", [])}
    excluded = set((merge_stats or {}).get("excluded") or {})
    rows = []
    for name, s in tokenized.items():
        rows.append(
            {
                "dataset": name,
                "samples": s.get("samples", 0),
                "tokens": s.get("tokens", 0),
                "mean_len": round(float(s.get("mean_len", 0.0)), 1),
                "max_len": s.get("max_len", 0),
                "supervised_fraction": round(float(s.get("supervised_fraction", 0.0)), 3),
                "cut_answers": s.get("cut_answers", 0),
                "final_reasoning_tokens": s.get("final_reasoning_tokens", 0),
                "final_reasoning_supervised": _share(s.get("final_reasoning_supervised_fraction")),
                "cut_share": round(_cut_share(s), 4),
                "rejected": s.get("rejected", 0),
                "reject_reasons": "; ".join(
                    f"{reason} ({n:,})" for reason, n in (s.get("rejected_reasons") or {}).items()),
                "sample_share": round(s.get("samples", 0) / total_samples, 4),
                "token_share": round(s.get("tokens", 0) / total_tokens, 4),
                "outlier": "yes" if name in outliers else "",
                "merged": "excluded" if name in excluded else "yes",
            }
        )
    return rows


def _share(fraction: float | None) -> float | str:
    return "" if fraction is None else round(float(fraction), 3)


def reasoning_lines(tokenized: dict[str, dict[str, Any]]) -> list[str]:
    """One sentence per dataset whose final turns hold reasoning: how many reasoning tokens
    the target generated there and how many are supervised; flagged when under 90%."""
    lines = []
    for name, s in tokenized.items():
        total = s.get("final_reasoning_tokens") or 0
        if not total:
            continue
        sup = s.get("final_reasoning_supervised") or 0
        line = (f"{name}: {sup:,} of {total:,} final-turn reasoning tokens supervised "
                f"({sup / total:.1%}; tokenize.final_turn {s.get('final_turn', '?')})")
        if s.get("reasoning_undertrained"):
            line = f"**UNDER 90%** {line} — the drafter will not learn the target's thinking"
        lines.append(line)
    return lines


def _cut_share(s: dict[str, Any]) -> float:
    """Share of a dataset's samples (dropped ones included) with an answer cut at max_tokens."""
    if "cut_answer_share" in s:
        return float(s["cut_answer_share"])
    seen = (s.get("samples") or 0) + (s.get("cut_answers_dropped") or 0)
    return (s.get("cut_answers") or 0) / seen if seen else 0.0


def merge_totals(merge_stats: dict[str, Any]) -> list[tuple[str, Any]]:
    """The merge's headline numbers, in reading order."""
    return [
        ("records", merge_stats.get("records")),
        ("tokens", merge_stats.get("tokens")),
        ("supervised tokens", merge_stats.get("supervised_tokens")),
        ("train records", merge_stats.get("train", {}).get("records")),
        ("eval records", merge_stats.get("eval", {}).get("records")),
        ("truncated", merge_stats.get("truncated")),
        ("dropped (no supervised token)", merge_stats.get("dropped_unsupervised")),
        ("max_seq_len", merge_stats.get("max_seq_len")),
        ("seed", merge_stats.get("seed")),
    ]


def outlier_lines(merge_stats: dict[str, Any]) -> list[str]:
    """One sentence per flagged dataset: why, and what the config does about it."""
    lines = []
    for o in merge_stats.get("outliers", []):
        verdict = "excluded by config" if o.get("excluded") else "KEPT (add it to merge.exclude to drop it)"
        lines.append(f"outlier {o['dataset']}: {'; '.join(o.get('reasons', []))} — {verdict}")
    return lines


def cut_answer_lines(tokenized: dict[str, dict[str, Any]], policy: str | None = None) -> list[str]:
    """One sentence per dataset with answers the server cut at ``max_tokens``: how many, and
    what tokenization did with them (`policy`: ``tokenize.cut_answers``)."""
    what = {"unsupervised_end": "kept, closing end-of-turn unsupervised",
            "drop": "dropped", "keep": "kept and trained as finished"}
    lines = []
    for name, s in tokenized.items():
        cut = s.get("cut_answers") or 0
        if cut:
            seen = (s.get("samples") or 0) + (s.get("cut_answers_dropped") or 0)
            done = f" — {what.get(policy, policy)}" if policy else ""
            lines.append(f"{name}: {cut:,} of {seen:,} samples ({_cut_share(s):.1%}) hold an "
                         f"answer cut at max_tokens{done}")
    return lines


def markdown_summary(run_name: str, rows: list[dict[str, Any]], merge_stats: dict[str, Any] | None,
                     cut_lines: list[str] | None = None,
                     thinking_lines: list[str] | None = None) -> str:
    """A markdown report: merge totals, outliers with reasons, answers cut at max_tokens
    (`cut_lines`, from `cut_answer_lines`), the final turns' reasoning trained
    (`thinking_lines`, from `reasoning_lines`) and a share chart in text."""
    lines = [f"# Data preparation: {run_name}", ""]
    if merge_stats:
        lines += ["| merged | value |", "|---|---|"]
        lines += [f"| {k} | {v:,} |" if isinstance(v, int) else f"| {k} | {v} |"
                  for k, v in merge_totals(merge_stats) if v is not None]
        lines.append("")
        excluded = merge_stats.get("excluded") or {}
        if excluded:
            lines += ["**Not merged:** " + ", ".join(f"`{n}` ({why})" for n, why in excluded.items()), ""]
        lines += [f"- **{line}**" for line in outlier_lines(merge_stats)]
        lines.append("")
    if cut_lines:
        lines += ["**Answers cut at `generation.max_tokens`** (finish_reason `length`; "
                  "`tokenize.cut_answers` decides what is trained):", ""]
        lines += [f"- {line}" for line in cut_lines] + [""]
    if thinking_lines:
        lines += ["**Reasoning of the final turns** (what a thinking target writes most; "
                  "`tokenize.final_turn` decides whether it is trained):", ""]
        lines += [f"- {line}" for line in thinking_lines] + [""]
    lines += ["## Token share against sample share", "", "```"]
    width = max((len(r["dataset"]) for r in rows), default=7)
    for r in rows:
        s = BAR * max(1, round(r["sample_share"] * 40)) if r["samples"] else ""
        t = BAR * max(1, round(r["token_share"] * 40)) if r["tokens"] else ""
        lines.append(f"{r['dataset']:<{width}}  samples {r['sample_share']:6.1%} {s}")
        lines.append(f"{'':<{width}}  tokens  {r['token_share']:6.1%} {t}")
    lines += ["```", ""]
    return "\n".join(lines)


def composition_picture(rows: list[dict[str, Any]], path: Path) -> Path:
    """Save a bar chart of each dataset's token share against its sample share (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eyas.io import atomic_write

    names = [r["dataset"] for r in rows]
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names) + 2), 4.5), dpi=100)
    w = 0.4
    ax.bar([i - w / 2 for i in x], [100 * r["sample_share"] for r in rows], w, label="share of samples")
    ax.bar([i + w / 2 for i in x], [100 * r["token_share"] for r in rows], w, label="share of tokens")
    for i, r in enumerate(rows):
        if r["outlier"]:
            ax.annotate("outlier", (i + w / 2, 100 * r["token_share"]), ha="center", va="bottom", color="crimson")
    ax.set_xticks(list(x), names, rotation=30, ha="right")
    ax.set_ylabel("%")
    ax.set_title("Dataset composition: token share against sample share")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format="png")
    plt.close(fig)
    return path
