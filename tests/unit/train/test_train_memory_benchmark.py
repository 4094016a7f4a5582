"""benchmarks/train_memory.py: its step runs every path on the CPU, and its formula says what
docs/training.md says of the Kimi-K2.5-width drafter."""

from __future__ import annotations

import pytest
from support.paths import REPO
from support.repo_scripts import load_module


@pytest.fixture(scope="module")
def bench():
    return load_module(REPO / "benchmarks" / "train_memory.py")


@pytest.mark.parametrize("path", ["new", "ckpt", "naive"])
def test_one_measured_step_of_every_path_runs_on_the_cpu(bench, path):
    cfg = bench.narrow(bench.kimi_drafter(), heads=2, hidden=32, vocab=256, draft_vocab=64)
    r = bench.measure(path, cfg, 24, device="cpu", reps=1, chunk_mb=0.01, threads=1)
    assert r["peak_mb"] >= 0 and r["tok_s"] > 0


def test_the_kimi_width_drafter_fits_one_96_gb_gpu_at_8192_tokens(bench):
    cfg = bench.kimi_drafter()
    assert (cfg.hidden_size, cfg.vocab_size, cfg.draft_vocab_size) == (7168, 163_840, 32_000)
    static = bench.projected_static_bytes(cfg, 8192)
    step = bench.projected_step_bytes(cfg, 8192, bf16=True, chunk_mb=1024)
    ddp_buckets = 4 * bench.trainable_parameters(cfg)  # DDP's gradient copy
    assert static + step + ddp_buckets < 80e9  # 96 GB with room for the allocator and NCCL
    assert bench.naive_estimate_bytes(cfg, 8192) > 96e9 * 2  # what the dense path would need
    # checkpointing every step cuts the step's memory by more than half
    assert bench.projected_step_bytes(cfg, 8192, bf16=True, chunk_mb=1024,
                                      checkpointing=True) < step / 2
