"""Synthetic prepared datasets shaped like the users' (deterministic, fast to write).

At scale 1: ten datasets named like the users', 26.7K samples and about 90M tokens in all;
``A1_deepswekimi`` is the outlier (about 7% of the samples, 32% of the tokens, mean
~15K tokens). The other nine have lognormal lengths (means 1.6K-3.6K tokens), so a few
percent exceed 8192 and get truncated. Token ids are uniform over a 163,840 vocabulary
(Kimi's size); each mask is a prompt of zeros then supervised ones, and about 0.5% of the
samples have no supervised token at all (they must be dropped). Lines are written the way
eyas phase 2 writes them: compact JSON, ``{"id", "input_ids", "loss_mask"}``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

VOCAB = 163_840
OUTLIER = "A1_deepswekimi"

# name: (samples at scale 1, mean length in tokens)
SHAPE: dict[str, tuple[int, int]] = {
    OUTLIER: (1_900, 15_000),
    "A2_kimik25": (3_000, 3_600),
    "B1_glaive": (3_200, 1_600),
    "B2_opencodeinstruct": (3_000, 2_100),
    "B3_magicoder": (2_800, 1_900),
    "B4_mixturethoughts": (2_600, 3_500),
    "B5_openthoughts": (2_700, 3_300),
    "B6_ultrachat": (2_900, 1_700),
    "B7_sharegpt": (2_673, 2_000),
    "B8_sweagent": (1_900, 2_900),
}


def make_datasets(folder: Path, scale: float = 1.0, seed: int = 0) -> dict[str, Path]:
    """Write ``folder/<name>/tokenized_data.jsonl`` for each dataset; return name -> path."""
    out = {}
    for index, (name, (samples, mean)) in enumerate(SHAPE.items()):
        rng = np.random.default_rng([seed, index])
        n = max(2, round(samples * scale))
        sigma = 0.5 if name == OUTLIER else 0.8
        lengths = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n).astype(np.int64)
        lengths = np.clip(lengths, 16, 65_536)
        prompt_share = rng.uniform(0.05, 0.6, n)
        unsupervised = rng.random(n) < 0.005
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
                mask[: int(length * prompt_share[i])] = 0
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
