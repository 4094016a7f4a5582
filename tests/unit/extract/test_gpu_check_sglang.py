"""scripts/gpu_check_sglang.py: the comparison it prints, and its CPU dry run (everything but
SGLang's engine, which needs a GPU)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from support.paths import REPO
from support.repo_scripts import load_module

SCRIPT = REPO / "scripts" / "gpu_check_sglang.py"


def _module():
    return load_module(SCRIPT)


def _sample(t, h=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"aux_hidden": torch.randn(t, 3 * h, generator=g).to(torch.bfloat16),
            "topk_ids": torch.randint(0, 50, (t, 4), generator=g, dtype=torch.int32)}


def test_compare_scores_agreement_and_closeness():
    gc = _module()
    want = {"a": _sample(10), "b": _sample(5, seed=1)}
    same = gc.compare(want, want)
    assert (same["top1"], same["cos_mean"], same["rel_err_max"], same["tokens"]) == (1.0, 1.0, 0.0, 15)
    assert gc.passed(same)
    shifted = {k: dict(v) for k, v in want.items()}
    shifted["a"]["aux_hidden"] = _sample(10, seed=7)["aux_hidden"]  # another layer's states
    shifted["a"]["topk_ids"] = want["a"]["topk_ids"].clone()
    shifted["a"]["topk_ids"][:4, 0] += 1
    bad = gc.compare(want, shifted)
    assert bad["top1"] == round(11 / 15, 4) and bad["cos_mean"] < 0.5 and not gc.passed(bad)
    missing = gc.compare(want, {"a": want["a"]})
    assert missing["missing"] == ["b"] and not gc.passed(missing)


@pytest.mark.slow
def test_dry_run_builds_the_tiny_deepseek_and_the_engine_arguments(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--workdir", str(tmp_path)],
                         capture_output=True, text=True, env=env, timeout=900, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    # Kimi-K2.5's layout: the wrapper class, the text model under text_config, language_model.*
    assert out["architecture"] == "KimiK25ForConditionalGeneration" and out["passed"]
    config = json.loads(next(tmp_path.glob("*-deepseek-v3/config.json")).read_text())
    assert config["text_config"]["num_hidden_layers"] >= 8
    assert out["sglang_layer_ids"] == [3, 5, 7]  # DeepSeek rule: first id not 1 -> ids + 1
    assert max(out["lengths"]) > 1024 and out["self_check"]["tokens"] == sum(out["lengths"])
    args = out["engine_args"]
    assert args[args.index("--chunked-prefill-size") + 1] == "2048"
    assert "--language-model-only" not in args  # SGLang 0.5.23 refuses it for Kimi's wrapper
    hooks = json.loads(args[args.index("--forward-hooks") + 1])
    assert hooks[0]["hook_factory"] == "eyas.extract.sglang_hook:capture_hook"
    assert out["sglang_parser"] in ("accepted", "not installed")
