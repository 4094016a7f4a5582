"""benchmarks/train_step.py and benchmarks/loader.py: the paths they measure compute the same
thing, and one measurement of each runs on the CPU (no wall time asserted)."""

from __future__ import annotations

import pytest
from support.paths import REPO
from support.repo_scripts import load_module

from eyas.train.data import Batches, OfflineSource
from eyas.train.model import DrafterConfig


def load(name: str):
    return load_module(REPO / "benchmarks" / f"{name}.py")


@pytest.fixture(scope="module")
def step_bench():
    return load("train_step")


@pytest.mark.parametrize("T", [24, 40])
def test_the_two_measured_paths_are_the_two_kernels_and_agree(step_bench, T):
    """One measured step on each path (fresh drafters, the same seed): "fused" and
    "reference" run the fused and the chunked attention, and their losses agree."""
    assert step_bench.PATHS == {"fused": "fused", "reference": "chunked"}
    cfg = DrafterConfig(**{**step_bench.TINY_WIDTH, "hidden_size": 32, "target_hidden_size": 32,
                           "intermediate_size": 64, "vocab_size": 128, "draft_vocab_size": 64})
    r = {path: step_bench.measure(path, cfg, T, steps=3, reps=1, chunk_mb=0.002, threads=1)
         for path in step_bench.PATHS}
    for got in r.values():
        assert got["peak_mb"] >= 0 and got["step_s"] > 0 and got["loss"] > 0
    assert r["fused"]["loss"] == pytest.approx(r["reference"]["loss"], rel=1e-5)


def test_the_loader_benchmark_reads_compact_shards_both_ways(tmp_path):
    bench = load("loader")
    nbytes = bench.write_shards(tmp_path, samples=5, tokens=16, hidden=8, per_shard=2)
    src = OfflineSource(tmp_path)
    assert nbytes > 0 and len(src) == 5 and src.storage == "compact"
    new = bench.take(Batches(src, micro_batch=1, seed=0, prefetch=2, dequantize=False), 5, None)
    old = bench.take(Batches(src, micro_batch=1, seed=0), 5, 1e6)
    assert new["tokens"] == old["tokens"] == 80 and new["tok_s"] > 0
