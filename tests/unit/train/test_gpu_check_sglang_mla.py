"""scripts/gpu_check_sglang_mla.py: the engine arguments it serves the MLA drafter with are
SGLang 0.5.23's own, and its CPU dry run (everything but SGLang's engine) trains, exports and
evaluates an MLA drafter for Kimi-K2.5's kind of target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.paths import REPO
from support.repo_scripts import load_module

SCRIPT = REPO / "scripts" / "gpu_check_sglang_mla.py"


def _script():
    return load_module(SCRIPT)


def test_the_engine_arguments_are_sglang_server_args():
    from eyas.sglang_args import SERVER_ARGS

    args = _script().engine_args(Path("/t"), Path("/d"), "KimiK25ForConditionalGeneration", 0.5)
    assert set(args) <= SERVER_ARGS, set(args) - SERVER_ARGS
    assert args["speculative_algorithm"] == "EAGLE3"
    assert "language_model_only" not in args  # SGLang 0.5.23 refuses it for Kimi's wrapper
    assert args["speculative_num_draft_tokens"] == args["speculative_num_steps"] + 1


@pytest.mark.slow
def test_dry_run_trains_exports_and_evaluates_an_mla_drafter(capsys):
    assert _script().main(["--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["dry_run"] and out["passed"] and out["offline_tau"] >= 1.0
    assert out["architecture"] == "KimiK25ForConditionalGeneration"
