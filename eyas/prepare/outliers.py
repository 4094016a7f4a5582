"""Datasets that would dominate a merge: flagged with the numbers, never dropped here.

A dataset is an outlier when it brings far more tokens than its share of samples
(``token share / sample share >= outlier_token_share_ratio``) or when its samples are far
longer than the other datasets' (``mean length / median of the others' mean lengths >=
outlier_mean_len_ratio``). The users' ``A1_deepswekimi`` (7% of samples, 32% of tokens)
is the case this exists for. Flagging only informs: whether a dataset is merged is decided
by ``MergeConfig.include`` / ``MergeConfig.exclude`` alone.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # keep this module light: merge worker processes import it
    from eyas.prepare.config import MergeConfig


@dataclass(frozen=True)
class DatasetProfile:
    """What a scan of one ``tokenized_data.jsonl`` found (before truncation)."""

    samples: int
    """Records in the file."""
    tokens: int
    """Sum of ``len(input_ids)``."""
    supervised_tokens: int
    """Positions with ``loss_mask == 1``."""
    max_len: int
    """Longest record, in tokens."""

    @property
    def mean_len(self) -> float:
        """Mean record length in tokens (0 for an empty dataset)."""
        return self.tokens / self.samples if self.samples else 0.0

    def to_dict(self) -> dict:
        """JSON-able form, mean length included."""
        return {**asdict(self), "mean_len": round(self.mean_len, 1)}


@dataclass(frozen=True)
class Outlier:
    """One flagged dataset, why it was flagged, and whether the config leaves it out."""

    dataset: str
    reasons: list[str]
    """Human-readable sentences, each with the numbers and the threshold crossed."""
    sample_share: float
    token_share: float
    share_ratio: float
    """``token_share / sample_share``."""
    mean_len: float
    others_median_mean_len: float
    mean_len_ratio: float
    """``mean_len / others_median_mean_len`` (0 when there are no others)."""
    excluded: bool
    """True when the merge config leaves this dataset out (``exclude`` or not in ``include``)."""
    checks: list[str] = field(default_factory=list)
    """Which checks fired: ``token_share`` and/or ``mean_len``."""

    def to_dict(self) -> dict:
        """JSON-able form (floats rounded for reading)."""
        d = asdict(self)
        for k in ("sample_share", "token_share"):
            d[k] = round(d[k], 4)
        for k in ("share_ratio", "mean_len", "others_median_mean_len", "mean_len_ratio"):
            d[k] = round(d[k], 2)
        return d


def selected_datasets(names: list[str], cfg: MergeConfig) -> list[str]:
    """Datasets the merge reads: ``cfg.include`` (default all of `names`) minus ``cfg.exclude``.

    Keeps the order of `names` (the registry order). Does not check that the names exist;
    `merge_datasets` does that.
    """
    include = set(names if cfg.include is None else cfg.include)
    exclude = set(cfg.exclude)
    return [n for n in names if n in include and n not in exclude]


def find_outliers(profiles: dict[str, DatasetProfile], cfg: MergeConfig) -> list[Outlier]:
    """Flag datasets whose token share or mean length is far above the others'.

    `profiles` maps every dataset considered (selected or not) to its profile; shares are
    relative to all of them. Empty datasets are ignored. Returns outliers in the order of
    `profiles`; an empty list when fewer than two non-empty datasets are given. Nothing is
    excluded here: ``Outlier.excluded`` only reports what ``cfg`` already decides.
    """
    live = {name: p for name, p in profiles.items() if p.samples > 0}
    if len(live) < 2:
        return []
    total_samples = sum(p.samples for p in live.values())
    total_tokens = sum(p.tokens for p in live.values())
    selected = set(selected_datasets(list(profiles), cfg))
    found = []
    for name, p in live.items():
        sample_share = p.samples / total_samples
        token_share = p.tokens / total_tokens if total_tokens else 0.0
        share_ratio = token_share / sample_share
        others = [q.mean_len for other, q in live.items() if other != name]
        median = statistics.median(others)
        len_ratio = p.mean_len / median if median > 0 else 0.0
        reasons, checks = [], []
        if share_ratio >= cfg.outlier_token_share_ratio:
            checks.append("token_share")
            reasons.append(
                f"{token_share:.1%} of tokens from {sample_share:.1%} of samples "
                f"({share_ratio:.1f}x; threshold outlier_token_share_ratio="
                f"{cfg.outlier_token_share_ratio:g})"
            )
        if len_ratio >= cfg.outlier_mean_len_ratio:
            checks.append("mean_len")
            reasons.append(
                f"mean length {p.mean_len:,.0f} tokens is {len_ratio:.1f}x the median of the "
                f"other datasets' means ({median:,.0f}; threshold outlier_mean_len_ratio="
                f"{cfg.outlier_mean_len_ratio:g})"
            )
        if reasons:
            found.append(
                Outlier(
                    dataset=name,
                    reasons=reasons,
                    sample_share=sample_share,
                    token_share=token_share,
                    share_ratio=share_ratio,
                    mean_len=p.mean_len,
                    others_median_mean_len=median,
                    mean_len_ratio=len_ratio,
                    excluded=name not in selected,
                    checks=checks,
                )
            )
    return found
