"""DDP with 2 gloo processes on CPU equals one process accumulating the same micro-batches."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp

from .ddp_worker import run, run_every_rank, run_memo, run_stopped, train_small


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_with_accumulation(tmp_path):
    """2 processes x 2 accumulated micro-batches (DDP syncs on the second only) = 1 process x 4."""
    mp.spawn(run, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=False)
    # Rank r takes global micro-batches r, r+2, ...; one process with grad_accum 4 takes
    # them four at a time: the averaged gradients are the same sums in another order.
    single, history = train_small(tmp_path / "single", grad_accum=4)
    for k, v in single.items():
        torch.testing.assert_close(ddp["weights"][k], v, rtol=1e-4, atol=1e-5)
    # The records are the whole step's, over both processes: mean loss, summed counts.
    steps = [h for h in ddp["history"] if h["kind"] == "train"]
    single_steps = [h for h in history if h["kind"] == "train"]
    assert [s["tokens"] for s in steps] == [s["tokens"] for s in single_steps]
    assert [s["loss"] for s in steps] == pytest.approx([s["loss"] for s in single_steps], rel=1e-5)
    assert [s["acc"] for s in steps] == [s["acc"] for s in single_steps]
    evals = [h for h in ddp["history"] if h["kind"] == "eval"]
    single_evals = [h for h in history if h["kind"] == "eval"]
    assert [e["tokens"] for e in evals] == [e["tokens"] for e in single_evals]
    assert evals[-1]["acc"] == pytest.approx(single_evals[-1]["acc"])


@pytest.mark.slow
def test_two_processes_share_the_teacher_memo_and_train_as_without_it(tmp_path):
    """2 processes, 4 steps of 4 of the 8 samples (2 epochs): after epoch 1 both hold the
    argmax of all 8 samples (each computed its own 4, `ArgmaxMemo.share` merged them), the
    same rows on both, and epoch 2's batches -- samples the other process had in epoch 1
    among them -- come from the memo; weights and records equal a run without it bit for
    bit."""
    for memo in (True, False):
        out = tmp_path / str(memo)
        out.mkdir()
        mp.spawn(run_memo, args=(2, _free_port(), str(out), memo), nprocs=2, join=True)
    with_memo = [torch.load(tmp_path / "True" / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    plain = [torch.load(tmp_path / "False" / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert plain[0]["memo"] is None
    memos = [m["memo"] for m in with_memo]
    assert sorted(memos[0]["rows"]) == list(range(8))
    assert memos[0]["rows"].keys() == memos[1]["rows"].keys()
    assert all(torch.equal(memos[0]["rows"][k], memos[1]["rows"][k]) for k in range(8))
    for m in memos:
        assert m["misses"] == 4 and m["hits"] == 4 and m["pending"] == 0
    for k, v in plain[0]["weights"].items():
        assert torch.equal(with_memo[0]["weights"][k], v), k

    def figures(history):
        return [{k: v for k, v in h.items() if k != "tok_s"} for h in history]

    assert figures(with_memo[0]["history"]) == figures(plain[0]["history"])


@pytest.mark.slow
def test_token_weighting_counts_every_token_of_the_step_over_processes(tmp_path):
    """loss_norm "token": 2 processes x 2 accumulated micro-batches of 1 sample give the step
    one process gives the same 4 samples as a single micro-batch of 4 -- every token of the
    step weighs the same, however the samples are split (the count is all-reduced)."""
    mp.spawn(run, args=(2, _free_port(), str(tmp_path), "token"), nprocs=2, join=True)
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=False)
    single, _ = train_small(tmp_path / "single", grad_accum=1, micro_batch=4, loss_norm="token")
    for k, v in single.items():
        torch.testing.assert_close(ddp["weights"][k], v, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_stop_asked_of_one_process_stops_every_process_after_the_same_step(tmp_path):
    """SIGTERM reaching one rank only: the stop rides on the step's all-reduce, so both ranks
    end after step 1 (none is left waiting in a collective), rank 0 having written the
    checkpoint of that step."""
    mp.spawn(run_stopped, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    outcomes = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert all(o.startswith("stopped 143: training stopped at step 1,") for o in outcomes), outcomes
    meta = json.loads((tmp_path / "checkpoint" / "meta.json").read_text())
    assert meta["step"] == 1


@pytest.mark.slow
def test_each_ranks_figure_reaches_every_rank_in_rank_order(tmp_path):
    """What the step record's per-GPU peak memory is gathered with (exact beyond 2^32)."""
    from eyas.train.trainer import every_rank

    assert every_rank(7, torch.device("cpu")) == [7]  # one process: its own figure
    mp.spawn(run_every_rank, args=(3, _free_port(), str(tmp_path)), nprocs=3, join=True)
    for rank in range(3):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == [2**40, 2**40 + 1000, 2**40 + 2000]


@pytest.mark.slow
def test_a_checkpoint_of_two_processes_is_not_resumed_by_one(tmp_path):
    """Issue 27, resume with another world size (2 -> 1 here, 8 -> 7 on the users' host):
    refused, naming both sizes, before anything is loaded; the checkpoint is left as it was."""
    from eyas.errors import ConfigError

    mp.spawn(run_stopped, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    state = (tmp_path / "checkpoint" / "state.pt").read_bytes()
    with pytest.raises(ConfigError, match=r"written by a training of 2 processes, and this "
                                          r"one has 1") as exc:
        train_small(tmp_path, grad_accum=2, resume=True)
    assert exc.value.where == "train.processes"
    assert "train.processes: 2" in str(exc.value)
    assert (tmp_path / "checkpoint" / "state.pt").read_bytes() == state


def test_resuming_eight_processes_checkpoint_with_seven_is_refused(tmp_path):
    """The issue's case by the logic itself: 8 processes wrote step 1,000, 7 would resume."""
    from eyas.errors import ConfigError
    from eyas.train.trainer import check_same_world

    with pytest.raises(ConfigError, match=r"step 1000\) was written by a training of 8 "
                                          r"processes, and this one has 7") as exc:
        check_same_world({"step": 1000, "world": 8}, 7, tmp_path / "checkpoint")
    assert "Run it with 8 processes again" in str(exc.value)
    check_same_world({"step": 1000, "world": 8}, 8, tmp_path / "checkpoint")  # same: resumes
    check_same_world({"step": 1000}, 7, tmp_path / "checkpoint")  # written before the check


@pytest.mark.slow
def test_bf16_gradient_compression_trains_as_float32_within_bf16_rounding(tmp_path):
    """grad_compression "bf16" (DDP's bf16_compress_hook): the all-reduced gradients are
    rounded to bfloat16, so the weights follow the float32 run closely but not exactly."""
    mp.spawn(run, args=(2, _free_port(), str(tmp_path / "bf16"), "sample", "bf16"), nprocs=2,
             join=True)
    mp.spawn(run, args=(2, _free_port(), str(tmp_path / "fp32")), nprocs=2, join=True)
    bf16 = torch.load(tmp_path / "bf16" / "ddp.pt", weights_only=False)["weights"]
    fp32 = torch.load(tmp_path / "fp32" / "ddp.pt", weights_only=False)["weights"]
    assert any(not torch.equal(bf16[k], fp32[k]) for k in fp32)
    # AdamW moves a weight by about lr a step whatever its gradient's size, so a rounded
    # near-zero gradient can move it the other way: at most 2 x lr x steps apart; few do.
    bound = 2 * 3e-3 * 4
    for k, v in fp32.items():
        diff = (bf16[k] - v).abs()
        assert float(diff.max()) <= bound, k
        assert float((diff > 1e-3).float().mean()) < 0.01, k
