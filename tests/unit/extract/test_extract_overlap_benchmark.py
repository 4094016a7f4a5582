"""benchmarks/extract_overlap.py runs and both paths give the same samples (its figures are
printed, never asserted: wall times belong to docs/benchmarks.md)."""

import json

from support.paths import REPO
from support.repo_scripts import load_module


def test_the_overlap_benchmark_compares_equal_samples(capsys):
    bench = load_module(REPO / "benchmarks" / "extract_overlap.py")
    assert bench.main(["--records", "6", "--hidden", "64", "--batch-tokens", "1024",
                       "--call-s", "0.01"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["same_samples"] is True and out["batches"] >= 2
    assert out["tokens"] > 0 and {"sequential_s", "overlapped_s", "speedup", "bound"} <= set(out)
