"""benchmarks/vs_specforge.py scores the two trainers' drafters by real drafting (the target
verifies, `eyas.evaluate`) beside the simulated acceptance: its scoring functions on the tiny
target, without SpecForge (the training side needs SpecForge's own venv)."""

from __future__ import annotations

import json

import pytest
import torch
from support.paths import REPO
from support.repo_scripts import load_module


@pytest.fixture(scope="module")
def bench():
    return load_module(REPO / "benchmarks" / "vs_specforge.py")


def test_real_drafting_scores_both_drafters_with_paired_intervals(bench, tiny_target, tmp_path):
    from support.evaluate_fixtures import export_random_drafter

    from eyas.evaluate.speculate import generate
    from eyas.evaluate.target import Target, load_target
    from eyas.extract.target import load_target_embeddings
    from eyas.train.export import load_exported
    from eyas.train.tiny_data import tiny_records, write_jsonl

    torch.set_num_threads(1)
    embed = load_target_embeddings(tiny_target).float()
    a, vocab, layers = load_exported(export_random_drafter(tiny_target, tmp_path / "a", seed=1),
                                     embed)
    b, _, _ = load_exported(export_random_drafter(tiny_target, tmp_path / "b", seed=2), embed)
    merged = tmp_path / "merged"
    write_jsonl(merged / "train.jsonl", tiny_records(tiny_target, 2))
    write_jsonl(merged / "eval.jsonl", tiny_records(tiny_target, 2)
                + tiny_records(tiny_target, 3, heldout=True))
    prompts = bench.heldout_prompts(merged, 3)
    assert len(prompts) == 3  # the two training prompts are left out
    target = Target(load_target(tiny_target, torch.device("cpu"), torch.float32), layers)
    real = {name: [bench.real_drafting_counts(d, vocab, target, prompts, k=3, max_new_tokens=8)]
            for name, d in (("eyas", a), ("specforge", b))}
    for lengths in real["eyas"][0]:
        assert lengths and all(1 <= x <= 4 for x in lengths) and sum(lengths) <= 8 - 1
    # The same decoding the evaluator runs: the kept tokens are the target's greedy output.
    from eyas.evaluate.drafters import EagleDrafter
    g = generate(target, EagleDrafter(a, vocab), prompts[0], max_new_tokens=8, draft_tokens=3)
    assert g.accept_lengths == real["eyas"][0][0]
    out = bench.real_summary(real, 200)
    for name in ("eyas", "specforge"):
        lo, hi = out[name]["ci95"]
        assert lo <= out[name]["tau"] <= hi and out[name]["tau_per_seed"] == [out[name]["tau"]]
    assert out["difference"]["of"] == "eyas - specforge"
    assert out["difference"]["verdict"] in ("ahead", "behind", "within noise")
    json.dumps(out)  # goes into the benchmark's last line
    same = bench.real_summary({"eyas": real["eyas"], "specforge": real["eyas"]}, 200)
    assert same["difference"]["tau"] == 0 and same["difference"]["ci95"] == [0.0, 0.0]
    assert same["difference"]["verdict"] == "within noise"


def test_overrides_name_the_flag_and_the_fields_it_takes(bench):
    assert bench.parse_overrides(["lr=0.001", "betas=[0.9, 0.999]"]) == {
        "lr": 0.001, "betas": [0.9, 0.999]}
    sf = bench.parse_overrides(["lr=2e-3"], flag="--specforge-set",
                               allowed=bench.SPECFORGE_FIELDS)
    assert bench.TrainConfig.model_validate(sf).lr == 0.002  # YAML's "2e-3" is a string
    # SpecForge's run YAML has no field for eyas's own choices: refused, naming what it takes
    with pytest.raises(SystemExit, match=r"--specforge-set 'init_head=target'.*lr"):
        bench.parse_overrides(["init_head=target"], flag="--specforge-set",
                              allowed=bench.SPECFORGE_FIELDS)
    with pytest.raises(SystemExit, match=r"--eyas-set 'lr'"):
        bench.parse_overrides(["lr"])


def test_scores_are_keyed_by_the_evaluating_functions_not_the_whole_harness(bench):
    one = bench.code_hash(bench.per_sample_counts)
    assert one == bench.code_hash(bench.per_sample_counts) and len(one) == 16
    assert one != bench.code_hash(bench.real_drafting_counts)
    assert one != bench.code_hash(bench.per_sample_counts, bench.ROOT / "eyas" / "train" / "ttt.py")
