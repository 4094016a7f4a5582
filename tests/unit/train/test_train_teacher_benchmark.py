"""benchmarks/teacher.py: the teacher today vs precomputed (issue 27, point 5) runs on the CPU
and reports its figures, the trainer's memo over two epochs among them (no wall time
asserted)."""

from __future__ import annotations

import json

from support.paths import REPO
from support.repo_scripts import load_module


def test_the_teacher_benchmark_prints_the_three_forms_and_their_ratios(capsys):
    bench = load_module(REPO / "benchmarks" / "teacher.py")
    assert bench.main(["--tokens", "8", "--hidden", "8", "--repeats", "1", "--samples", "3"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["vocab"] == 163_840 and result["draft_vocab"] == 32_000
    for key in ("baseline_s", "argmax_precomputed_s", "topk_s"):
        assert result[key] > 0
    assert result["argmax_precomputed_ratio"] > 0 and result["topk_ratio"] > 0
    assert result["precomputed_is_the_same_teacher"] is True
    assert result["bytes_per_token"] == {"final_state_at_kimi_hidden": 14_336,
                                         "argmax_and_bit": 5, "memo": 4, "topk": 192}
    # Epoch 1 computes the 3 samples' argmax, epoch 2 (another order) finds all 3: the
    # same teacher tensors as computed in full, 4 bytes a token kept.
    e = result["epochs"]
    assert e["samples"] == 3 and (e["memo_misses"], e["memo_hits"]) == (3, 3)
    assert e["memo_bytes"] == 4 * 8 and e["memo_is_the_same_teacher"] is True
    assert e["without_memo_s"] > 0 and set(e["with_memo_s"]) == {"first_epoch", "later_epoch"}
    assert e["memo_ratio"] > 0 and e["first_epoch_ratio"] > 0
