"""Data: offline shards and the in-process target give the same batches; order and resume."""

from __future__ import annotations

import pytest
import torch

from eyas.errors import DataError
from eyas.train.data import Batches, MemorySource, OfflineSource, OnlineSource
from eyas.train.tiny_data import extract_shards, tiny_records, write_jsonl

from .helpers import random_samples


@pytest.fixture(scope="module")
def tiny_data(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-data")
    jsonl = write_jsonl(root / "merged" / "train.jsonl", tiny_records(tiny_target, 12))
    shards = {s: extract_shards(tiny_target, jsonl, root / "hidden" / s, storage=s, shard_size=5)
              for s in ("final", "topk", "compact")}
    return tiny_target, jsonl, shards


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["final", "topk", "compact"])
def test_offline_and_online_give_the_same_batches(tiny_data, storage):
    torch.set_num_threads(1)
    model, jsonl, shards = tiny_data
    offline = OfflineSource(shards[storage])
    # "compact" stores the "topk" teacher with float8 aux states; online computes "topk".
    online_storage = "topk" if storage == "compact" else storage
    online = OnlineSource(jsonl, model, storage=online_storage, topk=16, device="cpu")
    assert offline.ids == online.ids and len(offline.shards) == 3
    assert offline.aux_layers == online.aux_layers and offline.storage == storage
    tol = 0.15 if storage == "compact" else 2e-2  # float8 e4m3 keeps 3 mantissa bits
    a = Batches(offline, micro_batch=2, seed=5, max_len=64)
    b = Batches(online, micro_batch=2, seed=5, max_len=64)
    for _ in range(3):
        x, y = next(a), next(b)
        assert x.ids == y.ids
        assert torch.equal(x.input_ids, y.input_ids) and torch.equal(x.loss_mask, y.loss_mask)
        # Same bf16 storage; batched (padded) extraction vs one sample at a time may differ
        # in the last bf16 bit.
        torch.testing.assert_close(x.aux_hidden.float(), y.aux_hidden.float(), rtol=tol, atol=tol)
        for k in x.teacher:
            if k == "topk_ids":  # near-ties may swap order; the top-1 must agree
                assert (x.teacher[k][..., 0] == y.teacher[k][..., 0]).float().mean() > 0.98
            else:
                torch.testing.assert_close(x.teacher[k].float(), y.teacher[k].float(),
                                           rtol=2e-2, atol=2e-2)


def test_order_is_a_seeded_global_shuffle_and_resumes_exactly():
    src = MemorySource(random_samples(7))
    a = Batches(src, micro_batch=2, seed=3)
    seen = [next(a).ids for _ in range(4)]  # one epoch: 2+2+2+1
    assert sorted(sum(seen, [])) == sorted(src.ids) and len(seen[-1]) == 1
    assert seen != [src.ids[i : i + 2] for i in range(0, 7, 2)]  # shuffled
    b = Batches(src, micro_batch=2, seed=3)
    assert [next(b).ids for _ in range(4)] == seen  # same seed, same order
    state = a.state_dict()
    after = [next(a).ids for _ in range(3)]  # into epoch 1: another permutation
    c = Batches(src, micro_batch=2, seed=3)
    c.load_state_dict(state)
    assert [next(c).ids for _ in range(3)] == after
    assert sum(after, []) != sum(seen, [])[:6]


def test_ranks_split_the_global_stream():
    src = MemorySource(random_samples(8))
    whole = Batches(src, micro_batch=1, seed=1)
    stream = [next(whole).ids[0] for _ in range(8)]
    r0 = Batches(src, micro_batch=1, seed=1, rank=0, world=2)
    r1 = Batches(src, micro_batch=1, seed=1, rank=1, world=2)
    assert [next(r0).ids[0] for _ in range(4)] == stream[0::2]
    assert [next(r1).ids[0] for _ in range(4)] == stream[1::2]


def test_padding_and_truncation():
    src = MemorySource(random_samples(3))
    batch = next(Batches(src, micro_batch=3, seed=0, max_len=8, shuffle=False))
    assert batch.input_ids.shape[1] == 8 and max(batch.lengths) == 8
    short = min(range(3), key=lambda i: batch.lengths[i])
    assert batch.loss_mask[short, batch.lengths[short] :].sum() == 0


def test_offline_source_errors_name_the_folder(tmp_path):
    with pytest.raises(DataError, match="no complete hidden-state shard"):
        OfflineSource(tmp_path)


def test_grouped_batches_hold_similar_lengths_cover_each_epoch_and_resume_exactly():
    """group_batches: each run of 4 micro-batches of the seeded shuffle is sorted by length and
    cut; the epoch holds every sample once, padding shrinks, and a resume continues exactly."""
    src = MemorySource(random_samples(32, seed=4))
    lengths = dict(zip(src.ids, src.lengths(), strict=True))

    def padding(batches: Batches, n: int) -> tuple[list, int]:
        seen = [next(batches).ids for _ in range(n)]
        return seen, sum(len(ids) * max(lengths[i] for i in ids) - sum(lengths[i] for i in ids)
                         for ids in seen)

    plain, grouped = (Batches(src, micro_batch=2, seed=3, group_batches=g) for g in (1, 4))
    plain_ids, plain_pad = padding(plain, 16)
    grouped_ids, grouped_pad = padding(grouped, 16)
    assert sorted(sum(grouped_ids, [])) == sorted(src.ids)  # one epoch, every sample once
    assert grouped_pad < plain_pad / 2
    for run in range(4):  # the runs hold the plain shuffle's samples, regrouped
        a = sorted(sum(plain_ids[4 * run : 4 * run + 4], []))
        assert sorted(sum(grouped_ids[4 * run : 4 * run + 4], [])) == a
    again = Batches(src, micro_batch=2, seed=3, group_batches=4)
    assert [next(again).ids for _ in range(16)] == grouped_ids  # a function of the seed
    state = grouped.state_dict()
    after = [next(grouped).ids for _ in range(5)]
    resumed = Batches(src, micro_batch=2, seed=3, group_batches=4)
    resumed.load_state_dict(state)
    assert [next(resumed).ids for _ in range(5)] == after


def test_sources_know_their_lengths_without_loading_samples(tiny_data):
    model, jsonl, shards = tiny_data
    offline = OfflineSource(shards["final"])
    online = OnlineSource(jsonl, model, storage="final", device="cpu")
    want = [int(offline.load(k)["input_ids"].shape[0]) for k in range(len(offline))]
    assert offline.lengths() == want == online.lengths()
