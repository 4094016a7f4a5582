"""Check 5's own refusals (the run itself is covered end to end by test_flow)."""

from eyas.preflight.result import bounded
from eyas.preflight.training import check_training, short_config
from eyas.train.config import TrainConfig


def test_training_is_not_run_without_captured_samples(tmp_path):
    r = bounded("training", lambda: check_training(
        work=tmp_path, model_dir=tmp_path, cfg=TrainConfig(), steps=2, processes=1,
        aux_layers=None, timeout_s=30, records=10, tokens=100), 30)
    assert not r.ok and "the capture check failed" in r.detail and r.fix


def test_the_short_run_keeps_the_recipes_shape_and_length():
    cfg = TrainConfig(max_len=8192, micro_batch=1, epochs=2.0, warmup_steps=50,
                      intermediate_size=1024)
    short = short_config(cfg, 20, 8)
    assert (short.max_len, short.micro_batch, short.intermediate_size) == (8192, 1, 1024)
    assert (short.steps, short.epochs, short.processes, short.warmup_steps) == (20, None, 8, 19)


def test_every_ranks_peak_memory_is_held_against_the_card():
    """The step record of 8 CUDA ranks (what the trainer writes; no GPU here): the check holds
    the highest rank to the card and names it; one rank over the limit fails the check."""
    import pytest

    from eyas.preflight.result import CheckFailed
    from eyas.preflight.training import memory_verdict
    gib = 2**30
    card = 96 * gib
    peaks = [80 * gib] * 8
    data: dict = {}
    said = memory_verdict({"peak_mem_bytes": max(peaks), "peak_mem_bytes_per_rank": peaks,
                           "gpu_mem_bytes": card}, data)
    assert "80.0 of 96.0 GiB" in said and "8 GPUs" in said
    assert data["peak_mem_bytes_per_rank"] == peaks
    peaks[5] = 93 * gib  # rank 5 alone is over 95% of its card
    with pytest.raises(CheckFailed, match="rank 5") as err:
        memory_verdict({"peak_mem_bytes": peaks[0], "peak_mem_bytes_per_rank": peaks,
                        "gpu_mem_bytes": card}, {})
    assert "micro_batch" in err.value.fix and "97%" in err.value.figure
    # A record from one process (or an older one): its single figure.
    assert "its GPU" in memory_verdict({"peak_mem_bytes": gib, "gpu_mem_bytes": card}, {})
