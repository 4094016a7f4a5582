"""Synthetic prepared datasets shaped like the users' (deterministic, fast to write).

At scale 1 the merge (``exclude=[A1]``, ``max_seq_len=8192``) keeps exactly the users' 24,773
records and about their 87.8M tokens. Ten datasets named like the users'; ``A1_deepswekimi`` is
the outlier with the users' figures (2,800 samples averaging about 16,025 tokens: 44.9M tokens,
about a third of all tokens from 7% of the samples). The other nine have lognormal lengths
(means 2.7K-6.0K tokens before truncation), so many exceed 8192 and get truncated. Token ids
are uniform over a 163,840 vocabulary (Kimi's size); each mask is a prompt of zeros (at most
4,096 tokens, so truncation never leaves a sample unsupervised) then supervised ones; on top of
the kept samples, 0.5% more have no supervised token at all (the merge must drop them). Lines
are written the way eyas phase 2 writes them: compact JSON, ``{"id", "input_ids",
"loss_mask"}``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

VOCAB = 163_840
OUTLIER = "A1_deepswekimi"

# name: (samples kept by the merge at scale 1, mean length in tokens before truncation)
SHAPE: dict[str, tuple[int, int]] = {
    OUTLIER: (2_800, 16_025),
    "A2_kimik25": (3_000, 5_980),
    "B1_glaive": (3_200, 2_660),
    "B2_opencodeinstruct": (3_000, 3_490),
    "B3_magicoder": (2_800, 3_150),
    "B4_mixturethoughts": (2_600, 5_810),
    "B5_openthoughts": (2_700, 5_480),
    "B6_ultrachat": (2_900, 2_820),
    "B7_sharegpt": (2_673, 3_320),
    "B8_sweagent": (1_900, 4_810),
}
UNSUPERVISED = 0.005
"""Samples with no supervised token, added on top of the kept ones (a share of them)."""
MAX_PROMPT = 4_096
"""Longest prompt: below the merge's 8,192, so a truncated sample keeps supervised tokens."""


def _draw(index: int, name: str, scale: float, seed: int):
    """A dataset's generator and its per-sample draws, in stream order: (rng, lengths,
    prompt shares, unsupervised flags); the token ids come from the same rng after them."""
    samples, mean = SHAPE[name]
    rng = np.random.default_rng([seed, index])
    kept = max(2, round(samples * scale))
    n = kept + round(kept * UNSUPERVISED)
    sigma = 0.5 if name == OUTLIER else 0.8
    lengths = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n).astype(np.int64)
    lengths = np.clip(lengths, 16, 65_536)
    prompt_share = rng.uniform(0.05, 0.6, n)
    unsupervised = np.zeros(n, dtype=bool)
    unsupervised[rng.choice(n, n - kept, replace=False)] = True
    return rng, lengths, prompt_share, unsupervised


def make_datasets(folder: Path, scale: float = 1.0, seed: int = 0) -> dict[str, Path]:
    """Write ``folder/<name>/tokenized_data.jsonl`` for each dataset; return name -> path."""
    out = {}
    for index, name in enumerate(SHAPE):
        rng, lengths, prompt_share, unsupervised = _draw(index, name, scale, seed)
        n = len(lengths)
        path = folder / name / "tokenized_data.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb", buffering=1 << 20) as fh:
            for i in range(n):
                if i % 1000 == 0:  # token ids drawn 1,000 samples at a time: bounded memory
                    chunk = lengths[i:i + 1000]
                    ids_all = rng.integers(0, VOCAB, int(chunk.sum()), dtype=np.int32)
                    start = 0
                length = int(lengths[i])
                mask = np.ones(length, dtype=np.int8)
                mask[: min(int(length * prompt_share[i]), MAX_PROMPT)] = 0
                if unsupervised[i]:
                    mask[:] = 0
                fh.write(orjson.dumps(
                    {"id": f"{name}-{i}", "input_ids": ids_all[start:start + length],
                     "loss_mask": mask},
                    option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE,
                ))
                start += length
        out[name] = path
    return out


def merged_lengths(scale: float = 1.0, seed: int = 0, max_seq_len: int = 8_192) -> list[int]:
    """Token counts of the samples the merge keeps from `make_datasets(folder, scale, seed)`
    (the outlier excluded, unsupervised samples dropped, cut at `max_seq_len`), drawn the same
    way without writing anything: at scale 1, the users' 24,773 records."""
    out: list[int] = []
    for index, name in enumerate(SHAPE):
        _, lengths, _, unsupervised = _draw(index, name, scale, seed)
        if name != OUTLIER:
            out.extend(int(min(t, max_seq_len)) for t in lengths[~unsupervised])
    return out


def text_table(rows: list[tuple[str, ...]]) -> str:
    """`rows` (the first one the header) as aligned text: the first column left, the others
    right, a rule under the header (what the merge benchmarks print)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
