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


def test_the_recipes_ttt_3_and_the_full_draft_vocabulary_as_docs_training_md_projects(bench):
    """docs/training.md, "At the recipe's TTT length, and at the full draft vocabulary": 43.9 GB
    at 32,000 draft tokens and 73.3 GB at all 163,840 at the recipe's TTT 3 (48.2 / 77.6 GB at
    TTT 4; bf16, a 1 GiB chunk, no checkpointing), all on one 96 GB card; the runbook and the
    Kimi recipe cite them."""
    from eyas.train.model import DrafterConfig

    def total_gb(draft_vocab: int, steps: int, **kw) -> float:
        cfg = DrafterConfig.from_target(bench.KIMI_K25_TEXT, draft_vocab)
        step = bench.projected_step_bytes(cfg, 8192, steps=steps, bf16=True, chunk_mb=1024, **kw)
        return round((bench.projected_static_bytes(cfg, 8192) + step) / 1e9, 1)

    assert total_gb(32_000, 3) == 43.9 and total_gb(32_000, 3, checkpointing=True) == 37.0
    assert total_gb(163_840, 3) == 73.3 and total_gb(163_840, 3, checkpointing=True) == 66.4
    assert (total_gb(32_000, 4), total_gb(163_840, 4)) == (48.2, 77.6)
    assert (total_gb(163_840, 4, checkpointing=True), total_gb(163_840, 7)) == (67.0, 90.4)
    full = DrafterConfig.from_target(bench.KIMI_K25_TEXT, 163_840)
    assert round(bench.trainable_parameters(full) / 1e9, 2) == 2.14
    assert 96 - total_gb(163_840, 3) > 22  # room for the allocator and NCCL
