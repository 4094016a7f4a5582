"""`scripts/gpu_check.py evaluate`: its CPU path as a smoke test (both runs on the CPU must give
the same τ), and on a GPU (marker gpu) the real check: GPU τ equal to the CPU run's."""

from __future__ import annotations

import json

import pytest
from support.paths import REPO
from support.repo_scripts import load_module

SCRIPT = REPO / "scripts" / "gpu_check.py"


def gpu_check():
    return load_module(SCRIPT)


def run_check(args, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    rc = gpu_check().evaluate_check(args)
    return rc, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_cpu_path_gives_the_same_tau_twice(tiny_target, capsys):
    rc, out = run_check(["--tiny", "--steps", "2", "--prompts", "2", "--max-new-tokens", "8"],
                        capsys)
    assert rc == 0 and out["tau_match"] and out["device"] == "cpu"
    assert out["cpu_fp32"]["tau"] == out["dev_fp32"]["tau"] and out["cpu_fp32"]["lossless"]
    assert set(out["cpu_fp32"]["tokens_per_s"]) == {"target", "eagle3", "untrained", "ngram"}


@pytest.mark.gpu
def test_gpu_tau_matches_the_cpu_run(tiny_target, capsys):
    rc, out = run_check([], capsys)
    assert rc == 0 and out["tau_match"], out
    assert out["dev_fp32"]["lossless"] and "dev_bf16" in out
