"""Phase 6 for a target that fits no single device, as the Kimi recipe runs it: the offline
evaluator is skipped (`evaluate.offline: auto`), the serving benchmark runs (against the SGLang
stand-in: SGLang needs GPUs) and the report, the artifacts and `eyas evaluate`'s lines say what
was measured and what was not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from support.paths import REPO
from support.serving_fixtures import STANDIN, leftovers

from eyas.evaluate.serving_config import ServingConfig

pytestmark = [pytest.mark.slow]

KIMI_TEXT = {"hidden_size": 7168, "num_hidden_layers": 61, "first_k_dense_replace": 1,
             "n_routed_experts": 384, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
             "n_shared_experts": 1, "intermediate_size": 18432, "num_attention_heads": 64,
             "num_key_value_heads": 64, "vocab_size": 163840, "torch_dtype": "bfloat16"}


def kimi_run(tmp_path: Path, port: int, accept: str) -> tuple[Path, Path]:
    """The Kimi recipe pointed at a config-only Kimi-shaped target (~1T parameters declared),
    its serving section at the stand-in; a run folder with held-out prompts and an export
    whose training evaluation predicts τ ~2.7."""
    target = tmp_path / "Kimi-K2.5"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(
        {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": KIMI_TEXT}))
    workdir = tmp_path / "run"
    export = workdir / "drafter" / "export"
    export.mkdir(parents=True)
    (export / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (export / "manifest.json").write_text(json.dumps(
        {"phase": "train-export", "complete": True, "outputs": {},
         "counts": {"metrics": {"acc": [0.8, 0.7, 0.6], "step": 6132}}}))
    (workdir / "merged").mkdir()
    (workdir / "merged" / "eval.jsonl").write_text("".join(
        json.dumps({"id": f"e{i}", "input_ids": list(range(10 * i, 10 * i + 9)),
                    "loss_mask": [0] * 5 + [1] * 4}) + "\n" for i in range(3)))

    raw = yaml.safe_load((REPO / "recipes" / "kimi-k2.5.yaml").read_text())
    raw["target"]["model"] = str(target)
    serving = raw["evaluate"]["serving"]
    assert (serving["tp_size"], serving["num_steps"], raw["evaluate"]["offline"]) == (8, [3], "auto")
    serving.update(batch_sizes=[1], num_prompts=2, warmup_requests=0, max_tokens=24, port=port,
                   sglang_python=sys.executable, eyas_python=sys.executable,
                   server_env={"PYTHONPATH": str(STANDIN), "EYAS_STANDIN_ACCEPT": accept},
                   startup_timeout_s=60, stop_grace_s=3, request_timeout_s=60, run_timeout_s=120)
    ServingConfig(**serving)
    cfg = tmp_path / "kimi.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    return cfg, workdir


def test_kimi_phase6_skips_offline_reaches_serving_and_flags_accept_length_one(
        tmp_path, prefect_client):
    """The stand-in accepts no draft token (SGLang's accept length 1.0, as with
    ``--speculative-algorithm EAGLE`` given an EAGLE-3 drafter): the report flags it."""
    from prefect import flow

    from eyas.cli import evaluation_lines
    from eyas.config import load_config
    from eyas.manifest import verify_manifest
    from eyas.proc import free_port
    from eyas.remote.hosts import HostSpec
    from flows.evaluate import evaluate_stage

    cfg_path, workdir = kimi_run(tmp_path, free_port(), accept="0")
    cfg = load_config(cfg_path)
    host = HostSpec.local(data_root=str(tmp_path))

    @flow
    def phase6():
        return evaluate_stage(cfg, str(workdir), host)

    result = phase6()
    out = workdir / "evaluate"
    report = json.loads((out / "report.json").read_text())
    assert report["offline"]["run"] is False and report["offline"]["setting"] == "auto"
    assert "skipped" in report["offline"]["reason"] and "parameters from config.json" in \
        report["offline"]["reason"]
    assert report["acceptance_length"] is None and report["baselines"] == {}
    rows = report["serving"]["rows"]
    assert [(r["mode"], r["num_steps"]) for r in rows] == [("baseline", None), ("ngram", None),
                                                           ("eagle3", 3)]
    assert rows[2]["accept_length"] == 1.0 and rows[2]["repeats"] == 3
    assert "--speculative-algorithm NGRAM" in report["serving"]["servers"][1]["command"]
    assert "--tp-size 8" in report["serving"]["servers"][2]["command"]
    assert report["serving"]["draft_cost_measured"]["target_step_ms"] > 0
    check = report["accept_check"]
    assert check["served"] == 1.0 and check["reference"] == "training's simulated τ"
    assert check["flagged"] and "--speculative-algorithm EAGLE" in check["causes"][0]
    assert verify_manifest(out) == []

    page = (out / "report.html").read_text()
    assert "Offline evaluation not run: evaluate.offline auto: skipped" in page
    assert page.count("data:image/png;base64,") == 1  # the served throughput only
    assert "--speculative-algorithm EAGLE" in page

    assert result["offline"].startswith("not run: evaluate.offline auto: skipped")
    assert result["acceptance_length"] is None and result["accept_check_flagged"]
    lines = evaluation_lines(result)
    assert lines.startswith("offline evaluation: not run: evaluate.offline auto: skipped")
    assert "accept length: SGLang 1.000 -- FLAGGED" in lines
    # The drafter folder's model card: the verdict, the reason, the command that serves it.
    card = (workdir / "drafter" / "export" / "README.md").read_text()
    assert result["model_card"] == str(workdir / "drafter" / "export" / "README.md")
    assert "Offline evaluation not run: evaluate.offline auto: skipped" in card
    assert report["serving"]["verdict"] in card and "**Flagged**" in card
    assert "--tp-size 8 --incremental-streaming-output --trust-remote-code " \
        "--speculative-algorithm EAGLE3" in card
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1 " \
        "--speculative-num-draft-tokens 4 --mem-fraction-static 0.85" in card
    assert "No `merged/stats.json` in the run" in card and "step 6132" in card
    assert verify_manifest(workdir / "drafter" / "export") == []  # the card is outside it
    assert leftovers(str(tmp_path)) == []


def test_kimi_phase6_without_a_host_says_what_is_missing(tmp_path, prefect_client):
    """Offline skipped and no GPU host for the serving benchmark: a ConfigError naming both,
    before anything runs (here the target's size is read on this machine)."""
    from prefect import flow

    from eyas.config import load_config
    from eyas.errors import ConfigError
    from flows.evaluate import evaluate_stage

    cfg_path, workdir = kimi_run(tmp_path, 30000, accept="0.6")
    cfg = load_config(cfg_path)

    @flow
    def phase6():
        return evaluate_stage(cfg, str(workdir), None)

    with pytest.raises(ConfigError, match=r"evaluate.offline auto: skipped.*needs a GPU host"):
        phase6()
    assert not (workdir / "evaluate").exists()
