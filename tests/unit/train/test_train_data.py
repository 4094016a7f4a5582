"""Data: offline shards and the in-process target give the same batches; order and resume."""

from __future__ import annotations

import threading

import pytest
import torch
from support.paths import REPO

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


def test_a_shard_that_does_not_verify_makes_training_refuse_naming_it(tiny_data, tmp_path):
    """Flipped bytes in one of the shards, or a shard missing between others, make the
    offline source refuse (naming that shard), never train on the rest; an interrupted
    writer's temporary folder is not a shard and is not counted."""
    import shutil

    from eyas.extract.store import DATA_NAME

    _, _, shards = tiny_data
    root = tmp_path / "hidden"
    shutil.copytree(shards["final"], root)
    (root / ".tmp-shard-00003-abc").mkdir()
    assert len(OfflineSource(root).shards) == 3
    data = root / "shard-00001" / DATA_NAME
    good = data.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    data.write_bytes(bytes(bad))
    with pytest.raises(DataError, match=r"shard-00001.*does not verify.*eyas extract"):
        OfflineSource(root)
    data.write_bytes(good)
    shutil.rmtree(root / "shard-00001")
    with pytest.raises(DataError, match=r"shard-00001 is missing"):
        OfflineSource(root)


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


class _Lengths:
    """A source of lengths only (what the order reads)."""

    def __init__(self, lengths):
        self._lengths = list(lengths)
        self.ids = [str(i) for i in range(len(self._lengths))]

    def __len__(self):
        return len(self._lengths)

    def lengths(self):
        return list(self._lengths)


def _steps(batches: Batches, epoch: int, per_step: int) -> list[list[int]]:
    order = batches.order(epoch).tolist()
    return [order[i : i + per_step] for i in range(0, len(order), per_step)]


def test_the_ranks_of_one_step_get_samples_of_similar_length():
    """8 ranks, micro-batch 1: each step's 8 samples are neighbours in a sorted run of
    group_batches steps, so no rank waits long at the gradient all-reduce; before, the ranks
    took consecutive micro-batches of a run shuffled after sorting (unrelated lengths)."""
    import random

    rnd = random.Random(0)
    lengths = [min(8192, int(rnd.lognormvariate(7.8, 0.8))) for _ in range(2000)]
    src = _Lengths(lengths)
    grouped = Batches(src, micro_batch=1, seed=5, world=8, group_batches=16)
    order = grouped.order(0).tolist()
    assert sorted(order) == list(range(2000))  # the epoch's samples, each once

    def spread(order):  # mean over steps of (longest - shortest) / longest
        steps = [order[i : i + 8] for i in range(0, len(order) - 7, 8)]
        return sum((max(lengths[k] for k in s) - min(lengths[k] for k in s))
                   / max(lengths[k] for k in s) for s in steps) / len(steps)

    before = Batches(src, micro_batch=1, seed=5, world=1, group_batches=16).order(0).tolist()
    assert spread(order) < 0.25 < 0.6 < spread(before)
    # each run of 16 steps holds the plain shuffle's samples, regrouped
    plain = torch.randperm(2000, generator=torch.Generator().manual_seed(5)).tolist()
    assert sorted(order[:128]) == sorted(plain[:128])


def test_a_step_holds_the_same_samples_however_it_is_split_into_processes_and_accumulation():
    src = _Lengths([(i * 37) % 500 + 1 for i in range(300)])
    one = Batches(src, micro_batch=2, seed=1, world=1, group_batches=4, accum=4)
    four = Batches(src, micro_batch=2, seed=1, world=4, group_batches=4, accum=1)
    two = Batches(src, micro_batch=2, seed=1, world=2, group_batches=4, accum=2)
    for epoch in range(3):
        a, b, c = (_steps(x, epoch, 8) for x in (one, four, two))
        assert a == b
        assert [sorted(s) for s in a] == [sorted(s) for s in c]


def test_accumulated_micro_batches_alternate_so_no_rank_always_takes_the_longest():
    src = _Lengths(list(range(1, 65)))
    b = Batches(src, micro_batch=1, seed=0, world=4, group_batches=1000, accum=4)
    order = b.order(0).tolist()
    work = [0] * 4
    for m, k in enumerate(order[:16]):  # the first step: 4 ranks x 4 micro-batches
        work[m % 4] += src.lengths()[k]
    assert max(work) - min(work) <= 0.05 * max(work)


def test_a_step_straddling_two_epochs_leaves_the_next_epochs_steps_aligned():
    """101 samples and 8 ranks: epoch 0 ends 5 micro-batches into a step; epoch 1's first 3
    finish it, and its own steps (sorted runs) start after them."""
    rnd = __import__("random").Random(1)
    lengths = [rnd.randint(1, 4000) for _ in range(101)]
    src = _Lengths(lengths)
    b = Batches(src, micro_batch=1, seed=2, world=8, group_batches=4)
    o1 = b.order(1).tolist()
    assert sorted(o1) == list(range(101))
    perm = torch.randperm(101, generator=torch.Generator().manual_seed(3)).tolist()
    assert o1[:3] == perm[:3]  # the unfinished step's rest, as the shuffle gives it
    run = o1[3 : 3 + 32]
    assert sorted(run) == sorted(perm[3 : 3 + 32])
    for s in range(4):  # each step of the run: 8 neighbours of the sorted run
        step = run[8 * s : 8 * s + 8]
        ranked = sorted(run, key=lambda k: -lengths[k])
        pos = sorted(ranked.index(k) for k in step)
        assert pos == list(range(pos[0], pos[0] + 8))


def test_ddp_balance_benchmark_reaches_its_goal_on_the_users_lengths():
    """The simulation of benchmarks/ddp_balance.py (deterministic, no timing) at the Kimi
    recipe's group size: ranks busy >= 90% of the time (a plain order: about 41%)."""
    import sys

    bench = REPO / "benchmarks"
    saved = list(sys.path)
    sys.path.insert(0, str(bench))
    try:
        from _synth import merged_lengths
        from ddp_balance import LengthsOnly, efficiency
    finally:
        # ddp_balance adds benchmarks/ itself: left there, the DDP tests' spawned processes
        # would import benchmarks/train.py as the tests' `train` package
        sys.path[:] = saved
    from eyas.config import load_config

    g = load_config(bench.parent / "recipes" / "kimi-k2.5.yaml").train.group_batches
    lengths = merged_lengths()
    assert len(lengths) == 24_773
    src = LengthsOnly(lengths)
    new = Batches(src, micro_batch=1, seed=0, world=8, group_batches=g).order(0).tolist()
    old = Batches(src, micro_batch=1, seed=0, world=1, group_batches=g).order(0).tolist()
    assert efficiency(new, lengths, ranks=8, quadratic_at=8192) >= 0.9
    assert efficiency(old, lengths, ranks=8, quadratic_at=8192) < 0.5


def compact_shards(root, n: int = 9, width: int = 32):
    """`n` random samples in two "compact" shards written by ``eyas.extract.store``."""
    from eyas.extract.store import shard_name, write_shard

    samples = random_samples(n, width=width, storage="topk", seed=2)
    for s, i in zip(samples, range(n), strict=True):
        s["id"] = f"c{i}"
        s["aux_hidden"] = s["aux_hidden"] * (1 + i)  # scales that differ per sample
    for index, part in enumerate((samples[:5], samples[5:])):
        write_shard(root / shard_name(index), part, storage="compact", aux_layers=[1, 2, 3],
                    hidden_size=width, topk=4)
    return OfflineSource(root)


def test_compact_aux_states_widened_on_the_device_equal_widened_on_reading(tmp_path):
    """dequantize=False: the batch carries float8 states and their scales (a quarter of the
    bytes); ``Batch.aux_on`` widens them where the step runs, to the same bf16 bit for bit
    (padding included)."""
    src = compact_shards(tmp_path)
    read = Batches(src, micro_batch=3, seed=1)
    later = Batches(src, micro_batch=3, seed=1, dequantize=False)
    for _ in range(4):
        a, b = next(read), next(later)
        assert a.ids == b.ids and a.aux_scale is None
        assert b.aux_hidden.dtype == torch.float8_e4m3fn and b.aux_scale.shape[-1] == 3
        assert a.aux_hidden.dtype == torch.bfloat16
        assert torch.equal(b.aux_on(torch.device("cpu")), a.aux_hidden)
        assert torch.equal(a.aux_on(torch.device("cpu")), a.aux_hidden)
        for k in a.teacher:
            assert torch.equal(a.teacher[k], b.teacher[k])


@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetched_batches_are_todays_in_order_and_resume_exactly(prefetch):
    """A background reader gives the same micro-batches in the same order (grouped lengths,
    two ranks' stream, accumulation, several epochs); the position is what was taken, not what
    was read ahead, so a resume from it continues exactly."""
    src = MemorySource(random_samples(11, seed=5))
    opts = {"micro_batch": 2, "seed": 3, "group_batches": 2, "rank": 1, "world": 2, "accum": 2}
    plain, ahead = Batches(src, **opts), Batches(src, **opts, prefetch=prefetch)
    for _ in range(9):
        a, b = next(plain), next(ahead)
        assert a.ids == b.ids and torch.equal(a.aux_hidden, b.aux_hidden)
        assert ahead.state_dict() == plain.state_dict()
    state = ahead.state_dict()
    after = [next(ahead).ids for _ in range(4)]
    resumed = Batches(src, **opts, prefetch=prefetch)
    resumed.load_state_dict(state)
    assert [next(resumed).ids for _ in range(4)] == after
    resumed.load_state_dict(state)  # also while its reader runs ahead
    assert [next(resumed).ids for _ in range(4)] == after
    for b in (ahead, resumed):
        b.close()
        assert b._reader is None


class RecordingSource(MemorySource):
    """Records the thread of each read; fails on sample `bad`."""

    def __init__(self, samples, bad: int | None = None) -> None:
        super().__init__(samples)
        self.threads, self.bad = [], bad
        self.read = threading.Semaphore(0)

    def load(self, k: int, *, dequantize: bool = True):
        if k == self.bad:
            raise DataError("unreadable rows", path="shard-00001/data.safetensors")
        self.threads.append(threading.current_thread().name)
        self.read.release()
        return super().load(k)


def test_prefetch_reads_ahead_on_another_thread_and_hands_on_its_errors():
    src = RecordingSource(random_samples(8, seed=1))
    batches = Batches(src, micro_batch=1, seed=0, shuffle=False, prefetch=3)
    assert next(batches).ids == ["s0"]
    for _ in range(3):  # three more read ahead, no further `next` needed
        assert src.read.acquire(timeout=30)
    assert src.threads and set(src.threads) == {"eyas-prefetch"}
    batches.close()
    bad = Batches(RecordingSource(random_samples(4, seed=1), bad=2), micro_batch=1, seed=0,
                  shuffle=False, prefetch=2)
    assert [next(bad).ids for _ in range(2)] == [["s0"], ["s1"]]
    with pytest.raises(DataError, match="unreadable rows"):
        next(bad)


def test_a_dropped_prefetching_loader_stops_its_thread():
    batches = Batches(MemorySource(random_samples(6, seed=1)), micro_batch=1, seed=0, prefetch=2)
    next(batches)
    thread = batches._reader.thread
    del batches
    thread.join(timeout=30)
    assert not thread.is_alive()
