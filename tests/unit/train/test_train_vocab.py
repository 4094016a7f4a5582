"""Draft vocabulary: selection, SGLang's d2t/t2d layout, fill-up, cache keyed by data."""

from __future__ import annotations

import json

import pytest
import torch

from eyas.errors import ConfigError, DataError
from eyas.train.vocab import DraftVocab, count_tokens, coverage, load_or_build, select_vocab


def samples():
    ids = torch.tensor([5, 5, 5, 2, 2, 9, 9, 9, 9, 1])
    mask = torch.tensor([1, 1, 1, 1, 1, 0, 0, 0, 0, 1])  # 9 is frequent but never supervised
    return [(ids, mask)]


def test_most_frequent_masked_tokens_sorted_by_id_with_offsets():
    counts = count_tokens(samples(), 12)
    v = select_vocab(counts, 2)
    assert v.draft_to_target.tolist() == [2, 5]
    assert v.d2t.tolist() == [2, 4]  # d2t[i] = target id - i
    assert v.t2d.nonzero()[:, 0].tolist() == [2, 5] and v.t2d.dtype == torch.bool
    assert v.target_to_draft()[[2, 5, 9]].tolist() == [0, 1, -1]
    assert DraftVocab.from_d2t(v.d2t, 12).draft_to_target.tolist() == [2, 5]


def test_ties_go_to_the_smaller_id_and_unseen_ids_fill_in_order():
    counts = count_tokens(samples(), 12)  # seen: 5 x3, 2 x2, 1 x1
    assert select_vocab(counts, 4).draft_to_target.tolist() == [0, 1, 2, 5]
    assert select_vocab(counts, 6).draft_to_target.tolist() == [0, 1, 2, 3, 4, 5]
    whole = select_vocab(counts, 100)  # clipped to the vocabulary
    assert whole.size == 12 and whole.d2t.abs().sum() == 0


def test_errors_name_the_problem():
    with pytest.raises(DataError, match="out of range"):
        count_tokens([(torch.tensor([3, 40]), torch.tensor([1, 1]))], 12)
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        select_vocab(torch.zeros(5, dtype=torch.long), 0)


def test_cache_is_reused_for_the_same_data_and_rebuilt_for_new_data(tmp_path):
    v1, built1 = load_or_build(tmp_path, "data-a", 2, 12, samples())
    v2, built2 = load_or_build(tmp_path, "data-a", 2, 12, iter(()))  # not iterated
    assert built1 and not built2 and torch.equal(v1.draft_to_target, v2.draft_to_target)
    other = [(torch.tensor([7, 7, 8]), torch.tensor([1, 1, 1]))]
    v3, built3 = load_or_build(tmp_path, "data-b", 2, 12, other)
    assert built3 and v3.draft_to_target.tolist() == [7, 8]


def test_the_cached_vocabulary_is_the_same_bytes_every_time(tmp_path):
    # A rerun (after a kill, say) rebuilds it: its bytes must not depend on the run.
    files = []
    for i in range(8):
        load_or_build(tmp_path / str(i), "data-a", 2, 12, samples())
        files += [p.read_bytes() for p in (tmp_path / str(i)).glob("*.safetensors")]
    assert len(files) == 8 and all(f == files[0] for f in files)


def test_coverage_is_the_share_of_supervised_tokens_the_vocabulary_holds():
    counts = torch.tensor([5, 0, 3, 2])
    two = select_vocab(counts, 2)  # the two most frequent: ids 0 and 2
    assert sorted(two.draft_to_target.tolist()) == [0, 2]
    assert coverage(two, counts) == 0.8
    assert coverage(select_vocab(counts, 4), counts) == 1.0
    assert coverage(two, torch.zeros(4, dtype=torch.int64)) == 1.0  # nothing counted


def test_built_or_cached_the_vocabulary_knows_its_coverage(tmp_path):
    # samples(): supervised 5, 5, 5, 2, 2, 1 (9 is never supervised): the 2 most frequent
    # hold 5 of 6.
    v1, built1 = load_or_build(tmp_path, "data-a", 2, 12, samples())
    v2, built2 = load_or_build(tmp_path, "data-a", 2, 12, iter(()))
    assert built1 and not built2
    assert v1.coverage == v2.coverage == pytest.approx(5 / 6)
    record = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert record["coverage"] == pytest.approx(5 / 6, abs=1e-6) and record["seen_tokens"] == 3
