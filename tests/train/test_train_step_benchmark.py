"""benchmarks/train_step.py and benchmarks/loader.py: the baselines they keep compute what
today's code computes, and one measurement of each runs on the CPU (no wall time asserted)."""

from __future__ import annotations

import pytest
import torch
from repo_scripts import ROOT, load_module

import eyas.train.ttt as ttt
from eyas.train.data import Batches, OfflineSource
from eyas.train.model import DrafterConfig, attend_causal


def load(name: str):
    return load_module(ROOT / "benchmarks" / f"{name}.py")


@pytest.fixture(scope="module")
def step_bench():
    return load("train_step")


def test_the_old_attention_computes_what_the_new_one_does(step_bench):
    """float64: output and every gradient, chunks of 3 queries, two diagonal keys."""
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, 2, 10, 4, generator=g, dtype=torch.float64, requires_grad=True)
              for _ in range(7)]
    q, k, v, *rest = inputs
    chunk = 3 * 4 * 2 * 10 * 8 / 2**20
    outs = [f(q, k, v, rest[:2], rest[2:], chunk_mb=chunk)
            for f in (attend_causal, step_bench.old_attend_causal)]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)
    for a, b in zip(*(torch.autograd.grad(o.square().sum(), inputs) for o in outs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", ["new", "old"])
def test_one_measured_step_of_each_path_runs_and_puts_the_attention_back(step_bench, path):
    cfg = DrafterConfig(**{**step_bench.TINY_WIDTH, "hidden_size": 32, "target_hidden_size": 32,
                           "intermediate_size": 64, "vocab_size": 128, "draft_vocab_size": 64})
    r = step_bench.measure(path, cfg, 24, steps=2, reps=1, chunk_mb=0.01, threads=1)
    assert r["peak_mb"] >= 0 and r["step_s"] > 0 and r["loss"] > 0
    assert ttt.attend_causal is attend_causal


def test_the_loader_benchmark_reads_compact_shards_both_ways(tmp_path):
    bench = load("loader")
    nbytes = bench.write_shards(tmp_path, samples=5, tokens=16, hidden=8, per_shard=2)
    src = OfflineSource(tmp_path)
    assert nbytes > 0 and len(src) == 5 and src.storage == "compact"
    new = bench.take(Batches(src, micro_batch=1, seed=0, prefetch=2, dequantize=False), 5, None)
    old = bench.take(Batches(src, micro_batch=1, seed=0), 5, 1e6)
    assert new["tokens"] == old["tokens"] == 80 and new["tok_s"] > 0
