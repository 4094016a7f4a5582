"""`python -m eyas.evaluate.run` end to end on the tiny target: report.json's fields, the
lossless check, generations, manifest; a serving section attached afterwards; clear errors."""

from __future__ import annotations

import json

import pytest
from support.evaluate_fixtures import export_random_drafter

from eyas.evaluate.run import main
from eyas.manifest import verify_manifest
from eyas.train.tiny_data import tiny_records, write_jsonl

SERVING = {"rows": [
    {"mode": "baseline", "batch_size": 1, "num_steps": None, "eagle_topk": None,
     "num_draft_tokens": None, "output_tok_s": 90.0, "accept_length": None},
    {"mode": "eagle3", "batch_size": 1, "num_steps": 3, "eagle_topk": 1,
     "num_draft_tokens": 4, "output_tok_s": 150.5, "accept_length": 2.4}],
    "verdict": "beats the baseline at batch 1 by 1.67x"}


@pytest.fixture(scope="module")
def run(tiny_target, tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate-run")
    drafter = export_random_drafter(tiny_target, root / "drafter" / "export")
    train = write_jsonl(root / "merged" / "train.jsonl", tiny_records(tiny_target, 6))
    ev = write_jsonl(root / "merged" / "eval.jsonl",
                     tiny_records(tiny_target, 1) + tiny_records(tiny_target, 3, heldout=True))
    return {"root": root, "drafter": drafter, "train": train, "eval": ev, "model": tiny_target}


@pytest.fixture(scope="module")
def evaluated(run):
    """The evaluation folder written by the command (run once for the module)."""
    out = run["root"] / "evaluate"
    rc = main(["--model", str(run["model"]), "--drafter", str(run["drafter"]), "--out", str(out),
               "--eval-jsonl", str(run["eval"]), "--train-jsonl", str(run["train"]),
               "--prompt-file", "eyas:demo/eval_prompts.jsonl", "--prompts-per-dataset", "2",
               "--max-new-tokens", "16", "--threads", "1", "--device", "cpu"])
    assert rc == 0
    return out


def test_cli_writes_the_report_with_baselines_and_a_passed_lossless_check(evaluated):
    from eyas.evaluate.run import headline

    out = evaluated
    report = json.loads((out / "report.json").read_text())
    for key in ("acceptance_length", "baselines", "lossless", "per_position", "tokens_per_s",
                "predicted_speedup", "config"):
        assert key in report, key
    assert headline(report)["lossless"] is True
    # 2 of the 3 held-out eval records + 2 prompt-file prompts; the first eval record is a
    # training one (left out).
    assert report["prompts"]["count"] == 4
    assert report["prompts"]["per_dataset"] == {"eval_prompts": 2, "tiny": 2}
    assert report["prompts"]["left_out_training"] == 1
    assert set(report["baselines"]) == {"untrained", "ngram"}
    assert report["lossless"] == {**report["lossless"], "checked": True, "equal": True,
                                  "mismatches": []}
    assert report["config"]["draft_tokens"] == 3 and report["draft_tokens"] == 3
    assert [r["position"] for r in report["per_position"]] == [1, 2, 3]
    assert set(report["tokens_per_s"]) == {"target", "eagle3", "untrained", "ngram"}
    assert report["acceptance_length"] >= 1.0 and report["predicted_speedup_this_device"] > 0
    # Intervals over prompts (as the model card reads them), and no serving prediction
    # without costs measured on the serving engine.
    lo, hi = report["acceptance_length_ci95"]
    assert lo <= report["acceptance_length"] <= hi
    for m, s in report["baselines"].items():
        assert s["ci95"][0] <= s["acceptance_length"] <= s["ci95"][1], m
        assert s["trained_is"] in ("ahead", "behind", "within noise")
    for ds, v in report["per_dataset"].items():
        assert set(v["ci95"]) == {"eagle3", "untrained", "ngram"}, ds
        assert set(v["trained_is"]) == {"untrained", "ngram"}, ds
    assert report["predicted_speedup"] is None
    assert report["predicted_speedup_note"].startswith("not predicted")
    assert report["sampling"] is None and report["lossless"]["near_ties"] == 0
    assert report["simulated"]["available"]
    assert report["simulated"]["simulated_acceptance_length"] == pytest.approx(1 + .5 + .2 + .06)
    lines = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert len(lines) == 4 * 4
    by = {(x["id"], x["method"]): x["tokens"] for x in lines}
    assert all(by[(i, m)] == by[(i, "target")] for i, m in by)  # greedy: all equal
    assert (out / "report.html").read_text().startswith("<!doctype html>")
    assert verify_manifest(out) == []


def test_serving_rows_attach_to_the_report_and_bad_rows_are_named(evaluated, capsys, tmp_path):
    out = evaluated
    serving = tmp_path / "serving.json"
    serving.write_text(json.dumps(SERVING))
    assert main(["attach-serving", "--out", str(out), "--serving", str(serving)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["serving"] == SERVING and report["predicted_speedup"] is None
    # With costs measured on the serving engine the serving speedup is predicted from them.
    costs = {"engine": "SGLang", "batch_size": 1, "target_step_ms": 11.0, "draft_step_ms": 1.0,
             "verify_ms": 13.0, "method": "fit over num_steps (cycle = k · draft + verify)"}
    serving.write_text(json.dumps(SERVING | {"draft_cost_measured": costs}))
    assert main(["attach-serving", "--out", str(out), "--serving", str(serving)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["predicted_speedup"] == pytest.approx(
        report["acceptance_length"] * 11.0 / (3 * 1.0 + 13.0))
    assert "serving engine" in report["predicted_speedup_note"]
    serving.write_text(json.dumps(SERVING))
    assert main(["attach-serving", "--out", str(out), "--serving", str(serving)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["serving"] == SERVING
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 3
    assert verify_manifest(out) == []
    bad = json.loads(json.dumps(SERVING))
    bad["rows"][1]["output_tok_s"] = "fast"
    serving.write_text(json.dumps(bad))
    capsys.readouterr()
    assert main(["attach-serving", "--out", str(out), "--serving", str(serving)]) == 2
    assert "field 'output_tok_s'" in capsys.readouterr().err


def test_missing_drafter_and_no_prompts_are_clear_errors(run, tmp_path, capsys):
    rc = main(["--model", str(run["model"]), "--drafter", str(tmp_path / "nope"),
               "--out", str(tmp_path / "o"), "--eval-jsonl", str(run["eval"])])
    assert rc == 2 and "no drafter here" in capsys.readouterr().err
    rc = main(["--model", str(run["model"]), "--drafter", str(run["drafter"]),
               "--out", str(tmp_path / "o")])
    assert rc == 2 and "no prompts" in capsys.readouterr().err


def test_sampling_mode_models_sglangs_default_and_says_so(run, tmp_path):
    from eyas.evaluate.report import headline as page_headline

    out = tmp_path / "sampled"
    rc = main(["--model", str(run["model"]), "--drafter", str(run["drafter"]), "--out", str(out),
               "--prompt-file", "eyas:demo/eval_prompts.jsonl", "--merged-eval", "false",
               "--prompts-per-dataset", "2", "--max-new-tokens", "8", "--threads", "1",
               "--device", "cpu", "--mode", "sampling", "--temperature", "0.8",
               "--top-p", "0.9"])
    assert rc == 0
    report = json.loads((out / "report.json").read_text())
    assert report["sampling"] | {"rule": "target_only", "temperature": 0.8, "top_p": 0.9,
                                 "top_k": None} == report["sampling"]
    assert "SGLang's default" in report["sampling"]["describes"]
    assert report["lossless"]["checked"] is False and "argmax" in report["lossless"]["note"]
    assert "sampling mode (target_only)" in page_headline(report)
