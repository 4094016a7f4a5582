"""The draft vocabulary: which target tokens the drafter's head can propose.

The drafter predicts over the N target tokens seen most often at supervised (loss-mask) positions.
Two tensors describe the choice, exactly as SGLang's ``LlamaForCausalLMEagle3`` reads them:

- ``d2t`` int64 [N]: an *offset*, ``d2t[i] = draft_to_target[i] - i``; SGLang recovers the
  target id of draft row i as ``d2t[i] + i``. Exporting the raw ids instead is a silent
  acceptance collapse in serving.
- ``t2d`` bool [V]: ``t2d[t]`` is True when target token t is in the draft vocabulary.

Draft ids are sorted by target id, so row i of the head is the i-th True entry of ``t2d``.
Ties in frequency go to the smaller token id; when fewer than N distinct tokens were seen, the
unseen ids fill the remainder in increasing order (deterministic, never a short vocabulary).

The mapping is cached in ``<cache_dir>/vocab-<key>.safetensors`` where the key hashes the data's
identity (the caller passes the dataset hashes) and N, so a changed dataset rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eyas.errors import ConfigError, DataError
from eyas.io import atomic_write

DEFAULT_DRAFT_VOCAB = 32_000


@dataclass(frozen=True)
class DraftVocab:
    """The draft vocabulary of a target with ``vocab_size`` tokens."""

    draft_to_target: torch.Tensor
    """int64 [N], increasing target ids."""
    vocab_size: int
    """The target's vocabulary size V."""
    coverage: float | None = field(default=None, compare=False)
    """Share of the supervised training tokens the vocabulary holds (`coverage`), where known:
    the rest no drafter of this vocabulary can propose."""

    @property
    def size(self) -> int:
        return int(self.draft_to_target.numel())

    @property
    def d2t(self) -> torch.Tensor:
        """int64 [N] offsets: ``d2t[i] = draft_to_target[i] - i`` (SGLang's layout)."""
        return self.draft_to_target - torch.arange(self.size, dtype=torch.int64)

    @property
    def t2d(self) -> torch.Tensor:
        """bool [V]: True where the target token is in the draft vocabulary."""
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.draft_to_target] = True
        return mask

    def target_to_draft(self) -> torch.Tensor:
        """int64 [V]: the draft id of each target token, -1 where it has none."""
        out = torch.full((self.vocab_size,), -1, dtype=torch.int64)
        out[self.draft_to_target] = torch.arange(self.size, dtype=torch.int64)
        return out

    @classmethod
    def from_d2t(cls, d2t: torch.Tensor, vocab_size: int) -> DraftVocab:
        """The inverse of ``.d2t`` (how a server reads an exported file)."""
        return cls(d2t.to(torch.int64) + torch.arange(d2t.numel(), dtype=torch.int64), vocab_size)


def count_tokens(
    samples: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int
) -> torch.Tensor:
    """int64 [V] counts of token ids at positions whose loss mask is set.

    `samples` yields ``(input_ids [T], loss_mask [T])``. Raises DataError for an id outside
    ``[0, vocab_size)``.
    """
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for n, (ids, mask) in enumerate(samples):
        chosen = ids[mask.bool()].to(torch.int64)
        if chosen.numel() and (int(chosen.min()) < 0 or int(chosen.max()) >= vocab_size):
            raise DataError(
                f"token id out of range [0, {vocab_size}) (min {int(chosen.min())}, "
                f"max {int(chosen.max())})",
                path=f"<sample {n}>",
                field="input_ids",
            )
        counts += torch.bincount(chosen, minlength=vocab_size)
    return counts


def select_vocab(counts_V: torch.Tensor, size: int) -> DraftVocab:
    """The `size` most frequent ids (ties: smaller id first; unseen ids fill up, in order).

    `size` larger than the vocabulary is clipped to it. Raises ConfigError for size < 1.
    """
    vocab_size = int(counts_V.numel())
    if size < 1:
        raise ConfigError(f"draft vocabulary size must be >= 1, got {size}", where="draft_vocab_size")
    size = min(size, vocab_size)
    # A stable sort on -count keeps increasing id order among equal counts (unseen ones too).
    order = torch.sort(-counts_V, stable=True).indices
    chosen = torch.sort(order[:size]).values
    return DraftVocab(chosen.to(torch.int64), vocab_size)


def coverage(vocab: DraftVocab, counts_V: torch.Tensor) -> float:
    """Share of the supervised tokens counted in `counts_V` (int [V]) that `vocab` holds: the
    rest no drafter of that vocabulary can propose. 1.0 when nothing was counted."""
    total = int(counts_V.sum())
    return float(counts_V[vocab.draft_to_target].sum()) / total if total else 1.0


def cache_key(data_identity: str, size: int, vocab_size: int) -> str:
    """Hash naming a cached vocabulary: the data's identity, the size asked, the vocab size."""
    text = json.dumps({"data": data_identity, "size": size, "vocab": vocab_size}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_or_build(
    cache_dir: Path,
    data_identity: str,
    size: int,
    vocab_size: int,
    samples: Iterable[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[DraftVocab, bool]:
    """The cached vocabulary for (`data_identity`, `size`), or one built from `samples`.

    `samples` is only iterated when building. Returns ``(vocab, built)``, the vocabulary's
    `coverage` of the counted tokens set either way; the file is written atomically with its
    counts, so a crash never leaves a half cache.
    """
    path = Path(cache_dir) / f"vocab-{cache_key(data_identity, size, vocab_size)}.safetensors"
    if path.is_file():
        tensors = load_file(str(path))
        vocab = DraftVocab(tensors["draft_to_target"], vocab_size)
        return replace(vocab, coverage=coverage(vocab, tensors["counts"])), False
    counts = count_tokens(samples, vocab_size)
    vocab = select_vocab(counts, size)
    vocab = replace(vocab, coverage=coverage(vocab, counts))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(
        {"draft_to_target": vocab.draft_to_target.contiguous(), "counts": counts},
        str(tmp),
        # One key: safetensors writes several in a random order, and a rerun must write the
        # same bytes.
        metadata={"vocab": json.dumps({"data_identity": data_identity, "size": size},
                                      sort_keys=True)},
    )
    tmp.replace(path)
    with atomic_write(path.with_suffix(".json")) as fh:
        fh.write(json.dumps({"data_identity": data_identity, "size": vocab.size,
                             "seen_tokens": int((counts > 0).sum()),
                             "coverage": round(vocab.coverage, 6)}, indent=1))
    return vocab, True
