"""The teacher memo (issue 27, point 5): storage "final"'s whole-vocabulary argmax computed once
per sample gives the same teacher, and the same training bit for bit."""

from __future__ import annotations

import pytest
import torch

from eyas.train.data import collate
from eyas.train.teacher_memo import ArgmaxMemo, memo_bytes
from eyas.train.ttt import TargetHead
from eyas.train.vocab import DraftVocab

from .helpers import random_samples
from .test_train_trainer import make_trainer


def _head(chunk_mb: float = 1e-4) -> TargetHead:
    g = torch.Generator().manual_seed(4)
    vocab = DraftVocab(torch.sort(torch.randperm(50, generator=g)[:24]).values, 50)
    return TargetHead(torch.randn(50, 32, generator=g), vocab, chunk_mb=chunk_mb)


def _assert_same_teacher(a, b) -> None:
    for name in ("logp_BTVd", "top_BT", "valid_BT", "in_vocab_BT"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name


def test_a_stored_argmax_gives_the_computed_teacher_whatever_the_batch_around_it():
    """Samples first seen in one batch, then in others (other neighbours, other padding):
    every tensor of the teacher equals the one computed in full, padding rows included; the
    V-wide argmax ran only for the batch of new samples."""
    head = _head()
    samples = random_samples(4, seed=2)
    memo = ArgmaxMemo()
    first = collate(samples, ["a", "b", "c", "d"], None, [0, 1, 2, 3])
    _assert_same_teacher(memo.teacher(head, first.teacher["final_hidden"], first.indices,
                                      first.lengths),
                         head.teacher(first.teacher["final_hidden"]))
    assert (memo.misses, memo.hits, len(memo)) == (1, 0, 4)
    assert memo.tokens == sum(first.lengths) and memo.nbytes == 4 * sum(first.lengths)
    for order in ([3, 1], [2], [1, 0, 3]):
        batch = collate([samples[k] for k in order], ["x"] * len(order), None, order)
        final = batch.teacher["final_hidden"]
        _assert_same_teacher(memo.teacher(head, final, batch.indices, batch.lengths),
                             head.teacher(final))
    assert (memo.misses, memo.hits) == (1, 3)


def test_a_batch_with_one_new_sample_is_computed_and_stores_it():
    head = _head()
    samples = random_samples(3, seed=5)
    memo = ArgmaxMemo()
    one = collate(samples[:1], ["a"], None, [0])
    memo.teacher(head, one.teacher["final_hidden"], one.indices, one.lengths)
    both = collate(samples[:2], ["a", "b"], None, [0, 1])
    t = memo.teacher(head, both.teacher["final_hidden"], both.indices, both.lengths)
    _assert_same_teacher(t, head.teacher(both.teacher["final_hidden"]))
    assert (memo.misses, memo.hits, len(memo)) == (2, 0, 2)


def test_a_sample_of_another_length_than_its_stored_argmax_is_refused():
    """One memo serves one source and max_len: a row of another length is an error, not a
    silently wrong teacher."""
    head = _head()
    samples = random_samples(1, seed=3)
    memo = ArgmaxMemo()
    full = collate(samples, ["a"], None, [0])
    memo.teacher(head, full.teacher["final_hidden"], full.indices, full.lengths)
    cut = collate(samples, ["a"], 5, [0])
    with pytest.raises(ValueError, match="sample 0 has 5 tokens here but"):
        memo.teacher(head, cut.teacher["final_hidden"], cut.indices, cut.lengths)


def test_memo_bytes_is_four_bytes_a_kept_token():
    assert memo_bytes([10, 3, 7], None) == 80
    assert memo_bytes([10, 3, 7], 5) == 4 * (5 + 3 + 5)


@pytest.mark.parametrize("fields", [{}, {"chunk_mb": 1e-3, "activation_checkpointing": True}],
                         ids=["default", "memory-saving"])
def test_training_with_the_memo_equals_training_without_it_bit_for_bit(tmp_path, fields):
    """2.4 epochs of the tiny drafter (10 samples, 4 a step, length-grouped and shuffled, so
    the neighbours and padding of a sample change every epoch), evaluated every 3 steps:
    the same losses, counts, evaluations and final weights; the memo held every training
    sample after the first epoch and served the later batches and evaluations."""
    with_memo = make_trainer(tmp_path / "memo", steps=6, teacher_memo=True, **fields)
    with_memo.fit()
    without = make_trainer(tmp_path / "plain", steps=6, teacher_memo=False, **fields)
    without.fit()
    assert without.train_memo is None and without.eval_memo is None
    memo = with_memo.train_memo
    assert len(memo) == 10 and memo.hits > 0 and memo.misses > 0
    assert with_memo.eval_memo.hits > 0  # evaluated twice (steps 3 and 6): the second hits
    assert memo.tokens == sum(min(n, 10**9) for n in with_memo.train_batches.source.lengths())

    def figures(history):
        return [{k: v for k, v in h.items() if k != "tok_s"} for h in history]

    assert figures(with_memo.state.history) == figures(without.state.history)
    a, b = with_memo.drafter.state_dict(), without.drafter.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_storage_topk_leaves_the_memo_empty(tmp_path):
    """A top-K teacher is stored already: the memo (made for the head the trainer was given)
    is never filled nor asked."""
    trainer = make_trainer(tmp_path, steps=3, storage="topk", teacher_memo=True)
    trainer.fit()
    memo = trainer.train_memo
    assert (len(memo), memo.hits, memo.misses) == (0, 0, 0)
