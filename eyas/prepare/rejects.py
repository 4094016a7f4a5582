"""Rejected records: why, how many of each reason, and when there are too many.

With ``tokenize.on_bad_record: reject`` one bad sample in 100K does not stop a run; a dataset
whose rejected share passes ``tokenize.max_rejected_share`` does (a wrong format, a wrong
field map, a server without its parsers: a setup error, not a stray sample). Phase 1 (answers
that spell special tokens) and phase 2 (every bad record) count their rejects here.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from eyas.errors import DataError

TOP_REASONS = 3

_SAMPLE_PREFIX = re.compile(r"^sample '(?:[^'\\]|\\.)*': |^sample \"(?:[^\"\\]|\\.)*\": ")
_DETAIL = re.compile(r": | \(")
_NUMBER = re.compile(r"\d+")


def reason_of(reject: dict[str, Any]) -> str:
    """A reject's reason, short and shared by every record with the same fault: its error's
    ``kind`` when set, else its message without the sample id, details or numbers
    (``token id N at position N is outside the tokenizer's vocabulary``)."""
    kind = reject.get("kind")
    if kind:
        return str(kind)
    text = _SAMPLE_PREFIX.sub("", str(reject.get("error") or "unknown"))
    cut = _DETAIL.search(text)
    if cut:
        text = text[: cut.start()]
    return _NUMBER.sub("N", text).strip()[:100] or "unknown"


class RejectTally:
    """Rejected records counted per reason."""

    def __init__(self) -> None:
        self.reasons: Counter[str] = Counter()

    def add(self, reject: dict[str, Any]) -> str:
        """Count one reject (its `as_reject` dict); return its reason."""
        reason = reason_of(reject)
        self.reasons[reason] += 1
        return reason

    @property
    def total(self) -> int:
        return sum(self.reasons.values())

    def as_dict(self) -> dict[str, int]:
        """``{reason: count}``, most frequent first (ties by name)."""
        return dict(sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])))

    def top(self, n: int = TOP_REASONS) -> str:
        """The `n` most frequent reasons, in words."""
        items = list(self.as_dict().items())
        text = "; ".join(f"{reason} ({count:,})" for reason, count in items[:n])
        if len(items) > n:
            text += f"; and {len(items) - n} other reason(s)"
        return text


def check_rejected_share(*, dataset: str, tally: RejectTally, seen: int, max_share: float,
                         rejects_path: Path, source: str | None = None) -> None:
    """Raise DataError when more than `max_share` of the `seen` records were rejected.

    The message names the dataset, the share against the limit, the top reasons and the
    rejects file (which the caller keeps).
    """
    rejected = tally.total
    if not seen or rejected / seen <= max_share:
        return
    raise DataError(
        f"dataset {dataset!r}: {rejected:,} of {seen:,} records rejected "
        f"({rejected / seen:.2%}), more than tokenize.max_rejected_share "
        f"({max_share:.2%}); top reasons: {tally.top()}. The rejected records and their "
        f"errors are in {rejects_path}",
        path=source,
        field="tokenize.max_rejected_share",
        kind="too-many-rejects",
    )
