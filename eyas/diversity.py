"""How varied a model's answers are: distinct-n over all answers, and how often one repeats.

A target that answers most prompts with the same sentence makes any drafter look good (and an
n-gram drafter better): these two figures say whether a target is worth drafting for.

- ``distinct_n``: unique word n-grams / all word n-grams, over every answer together (the
  corpus-level "distinct-n" of Li et al., 2016). 1.0 when no n-gram repeats anywhere; a model
  that says one sentence to every prompt tends to 0.
- ``repeat_rate``: the share of answers that are a copy of an earlier answer (after collapsing
  whitespace): 0.0 when every answer is different, (n-1)/n when all n are the same.

Words are whitespace-separated, so the figures do not depend on a tokenizer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def _words(text: str) -> list[str]:
    return text.split()


def distinct_n(answers: Sequence[str], n: int = 2) -> float:
    """Unique word `n`-grams divided by all word `n`-grams, over all `answers` together.

    Answers shorter than `n` words contribute nothing; 0.0 when there is no n-gram at all.
    Raises ValueError for ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    grams: list[tuple[str, ...]] = []
    for answer in answers:
        words = _words(answer)
        grams.extend(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
    return len(set(grams)) / len(grams) if grams else 0.0


def repeat_rate(answers: Sequence[str]) -> float:
    """The share of `answers` that repeat an earlier one (whitespace collapsed); 0.0 if empty."""
    if not answers:
        return 0.0
    unique = {" ".join(_words(a)) for a in answers}
    return 1.0 - len(unique) / len(answers)


def answer_diversity(answers: Sequence[str]) -> dict:
    """``{"answers", "distinct_2", "repeat_rate", "top_answer", "top_answer_share", "mean_words"}``.

    ``top_answer`` is the most frequent answer (whitespace collapsed; ties: the first seen) and
    ``top_answer_share`` its share of all answers.
    """
    normalized = [" ".join(_words(a)) for a in answers]
    counts = Counter(normalized)
    top, top_count = counts.most_common(1)[0] if counts else ("", 0)
    return {
        "answers": len(answers),
        "distinct_2": round(distinct_n(answers, 2), 4),
        "repeat_rate": round(repeat_rate(answers), 4),
        "top_answer": top,
        "top_answer_share": round(top_count / len(answers), 4) if answers else 0.0,
        "mean_words": round(sum(len(_words(a)) for a in answers) / len(answers), 1)
        if answers
        else 0.0,
    }
