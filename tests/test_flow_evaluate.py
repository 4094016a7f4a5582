"""The evaluate-drafter flow under the session's Prefect test server, on the tiny target: the
report files, the artifacts (summary with pictures, τ per dataset, link to the page), and
`eyas evaluate`'s output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from evaluate_fixtures import export_random_drafter
from test_flow_train import artifacts_of, data_of
from train_fixtures import merged_run, recipe

pytestmark = [pytest.mark.slow]


def evaluate_recipe(tmp_path: Path, name: str) -> Path:
    path = recipe(tmp_path, name)
    raw = yaml.safe_load(path.read_text())
    raw["evaluate"] = {"prompt_files": ["eyas:demo/eval_prompts.jsonl"], "prompts_per_dataset": 2,
                       "max_new_tokens": 12, "threads": 1, "device": "cpu"}
    path.write_text(yaml.safe_dump(raw))
    return path


def test_flow_without_a_drafter_names_the_folder(tmp_path, tiny_target, prefect_harness):
    from eyas.errors import DataError
    from flows.evaluate import evaluate_drafter_flow

    cfg = evaluate_recipe(tmp_path, "tiny-evaluate-missing")
    workdir = merged_run(tmp_path, tiny_target)
    with pytest.raises(DataError, match=r"drafter/export"):
        evaluate_drafter_flow(str(cfg), str(workdir))


# Runs after a flow test without capsys: Prefect's console log handler is created at the first
# flow run of the process and would otherwise write to this test's closed capture stream.
def test_flow_evaluates_publishes_artifacts_and_cli_prints_the_figures(
        tmp_path, tiny_target, prefect_client, capsys):
    from eyas.cli import main
    from flows.evaluate import evaluate_drafter_flow

    cfg = evaluate_recipe(tmp_path, "tiny-evaluate")
    workdir = merged_run(tmp_path, tiny_target)
    export_random_drafter(tiny_target, workdir / "drafter" / "export")
    state = evaluate_drafter_flow(str(cfg), str(workdir), return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    out = workdir / "evaluate"
    report = json.loads((out / "report.json").read_text())
    assert result["acceptance_length"] == report["acceptance_length"]
    assert result["lossless"] is True and result["host"] == "local"
    assert result["html"] == str(out / "report.html") and (out / "report.html").is_file()
    assert report["prompts"]["per_dataset"] == {"eval_prompts": 2, "tiny": 2}
    assert report["run"] == "tiny-evaluate"

    arts = artifacts_of(prefect_client, state)
    key = "evaluate-tiny-evaluate"
    md = arts[f"{key}-summary"].data
    assert md.count("data:image/png;base64,") == 2 and "predicted" in md
    rows = data_of(arts[f"{key}-datasets"])
    assert [r["dataset"] for r in rows] == ["all", "eval_prompts", "tiny"]
    assert rows[0]["tau_eagle3"] == round(report["acceptance_length"], 4)
    assert f"({(out / 'report.html').resolve().as_uri()})" in arts[f"{key}-report"].data

    capsys.readouterr()
    assert main(["evaluate", "--config", str(cfg), "--workdir", str(workdir)]) == 0
    printed = capsys.readouterr().out
    assert "acceptance length τ" in printed and "baselines: untrained" in printed
    assert "predicted speedup" in printed and str(out / "report.html") in printed
