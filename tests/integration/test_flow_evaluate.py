"""The evaluate-drafter flow under the session's Prefect test server, on the tiny target: the
report files, the artifacts (summary with pictures, τ per dataset, link to the page), and
`eyas evaluate`'s output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.evaluate_fixtures import export_random_drafter
from support.train_fixtures import merged_run, recipe
from test_flow_train import artifacts_of, data_of

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
    from eyas.manifest import verify_manifest
    from flows.evaluate import evaluate_drafter_flow

    cfg = evaluate_recipe(tmp_path, "tiny-evaluate")
    workdir = merged_run(tmp_path, tiny_target)
    export_random_drafter(tiny_target, workdir / "drafter" / "export")
    (workdir / "merged" / "stats.json").write_text(json.dumps(  # as `eyas prepare` writes it
        {"records": 12, "tokens": 960, "supervised_tokens": 400, "max_seq_len": 96,
         "train": {"records": 8}, "eval": {"records": 4}, "excluded": {"big": "exclude"},
         "datasets": {"tiny": {"selected": True, "after": {"records": 12, "tokens": 960,
                                                           "supervised_tokens": 400}}}}))
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
    # Here as on a GPU host: one detached `python -m eyas.evaluate.run` job, in the run's folder.
    jobs = sorted((workdir / ".eyas" / "jobs").iterdir())
    assert [j.name.startswith("evaluate-tiny-evaluate-") for j in jobs] == [True]
    assert "-m eyas.evaluate.run --model" in (jobs[0] / "cmd").read_text()
    assert (jobs[0] / "exit_code").read_text().strip() == "0"

    arts = artifacts_of(prefect_client, state)
    key = "evaluate-tiny-evaluate"
    md = arts[f"{key}-summary"].data
    assert md.count("data:image/png;base64,") == 2 and "on this device (cpu)" in md
    rows = data_of(arts[f"{key}-datasets"])
    assert [r["dataset"] for r in rows] == ["all", "eval_prompts", "tiny"]
    assert rows[0]["tau_eagle3"] == round(report["acceptance_length"], 4)
    assert f"({(out / 'report.html').resolve().as_uri()})" in arts[f"{key}-report"].data

    # The export's model card: target, data, training, τ per dataset, the command serving it.
    export = workdir / "drafter" / "export"
    card = (export / "README.md").read_text()
    assert result["model_card"] == str(export / "README.md")
    assert "| tiny | 12 | 960 | 400 |" in card and "| big | excluded (exclude) | | |" in card
    assert f"**{report['acceptance_length']:.3f}**" in card
    assert f"| eval_prompts | 2 | {report['per_dataset']['eval_prompts']['eagle3']:.3f} |" in card
    # ... with its 95 % interval over prompts, overall and per dataset, and the comparison
    # with each baseline only as far as the interval of the difference allows.
    lo, hi = report["acceptance_length_ci95"]
    assert f"**{report['acceptance_length']:.3f}** (95 % interval {lo:.2f}–{hi:.2f})" in card
    ds = report["per_dataset"]["eval_prompts"]
    ci = ds["ci95"]["eagle3"]
    assert (f"| eval_prompts | 2 | {ds['eagle3']:.3f} | {ci[0]:.2f}–{ci[1]:.2f} | "
            f"{ds['trained_is']['untrained']} | {ds['trained_is']['ngram']} |") in card
    assert "| vs untrained | vs ngram |" in card and "not computed" not in card
    assert "| drafter | llama |" in card and "| fc_norm | False |" in card  # the kind trained
    assert "| ttt_steps | 3 |" in card and "acc_i 0.500, 0.400, 0.300" in card
    assert (f"python3 -m sglang.launch_server --model-path {tiny_target} --host 127.0.0.1 "
            f"--port 30000 --tp-size 1 --incremental-streaming-output "
            f"--speculative-algorithm EAGLE3 "
            f"--speculative-draft-model-path {export} --speculative-num-steps 3 "
            "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4") in card
    assert "## Served with SGLang\n\nNot measured" in card
    assert verify_manifest(export) == []  # the card is outside the export's verified set

    capsys.readouterr()
    assert main(["evaluate", "--config", str(cfg), "--workdir", str(workdir)]) == 0
    printed = capsys.readouterr().out
    assert "acceptance length τ" in printed and "baselines: untrained" in printed
    assert "speedup on this device (cpu): predicted from its costs" in printed
    assert "serving speedup not predicted: no draft and verification costs" in printed
    assert "acceptance length τ" in printed and "[95 % " in printed
    assert str(out / "report.html") in printed
