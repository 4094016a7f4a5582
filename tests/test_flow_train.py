"""The train-drafter flow under the session's Prefect test server, on the tiny target: online
(the target in process) and offline (extraction shards), the export, the picture, the
artifacts, a rerun that trains nothing, `eyas train`, and the throttled progress artifact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_fixtures import PNG_MAGIC, STEPS, merged_run, recipe

from eyas.train.tiny_data import extract_shards

pytestmark = [pytest.mark.slow]


def artifacts_of(client, state) -> dict[str, object]:
    """The flow run's artifacts by key (latest version of each)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    arts = client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    return {a.key: a for a in sorted(arts, key=lambda a: a.updated or a.created)}


def data_of(art):
    return json.loads(art.data) if isinstance(art.data, str) else art.data


def test_flow_trains_online_publishes_artifacts_and_rerun_trains_nothing(
        tmp_path, tiny_target, prefect_client):
    from flows.train import train_drafter_flow

    torch.set_num_threads(1)
    cfg = recipe(tmp_path, "tiny-train-online")
    workdir = merged_run(tmp_path, tiny_target)
    state = train_drafter_flow(str(cfg), str(workdir), data="online", return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["status"] == "trained" and summary["steps"] == STEPS
    assert summary["resumed_from"] is None and summary["data"] == "online"

    export = workdir / "drafter" / "export"
    assert Path(summary["export"]) == export
    tensors = load_file(str(export / "model.safetensors"))
    assert {"fc.weight", "d2t", "t2d", "lm_head.weight"} <= set(tensors)
    picture = workdir / "reports" / "training.png"
    assert Path(summary["picture"]) == picture and picture.read_bytes()[:8] == PNG_MAGIC

    history = json.loads((workdir / "drafter" / "history.json").read_text())
    evals = [r for r in history if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    best = max(evals, key=lambda r: r["simulated_acceptance_length"])
    assert summary["simulated_acceptance_length"] == best["simulated_acceptance_length"]

    arts = artifacts_of(prefect_client, state)
    key = "train-tiny-train-online"
    assert data_of(arts[f"{key}-progress"]) == 100.0
    md = arts[f"{key}-summary"].data
    assert "data:image/png;base64," in md and "simulated acceptance length" in md
    rows = data_of(arts[f"{key}-eval"])
    assert [r["draft_step"] for r in rows] == ["0", "1", "2", "simulated acceptance length"]
    assert [r["acc"] for r in rows[:3]] == [round(a, 4) for a in best["acc"]]
    assert rows[-1]["all_accepted_through_step"] == round(best["simulated_acceptance_length"], 4)
    assert f"({export.resolve().as_uri()})" in arts[f"{key}-export"].data

    # A rerun finds the finished checkpoint: nothing is trained, the history stays as it was.
    again = train_drafter_flow(str(cfg), str(workdir), data="online")
    assert again["status"] == "complete" and again["resumed_from"] == STEPS
    assert json.loads((workdir / "drafter" / "history.json").read_text()) == history


def test_flow_trains_offline_from_shards_and_cli_reports_it(tmp_path, tiny_target,
                                                            prefect_client, capsys):
    from eyas.cli import main
    from flows.train import train_drafter_flow

    torch.set_num_threads(1)
    cfg = recipe(tmp_path, "tiny-train-offline")
    workdir = merged_run(tmp_path, tiny_target)
    for split in ("train", "eval"):
        extract_shards(tiny_target, workdir / "merged" / f"{split}.jsonl",
                       workdir / "hidden" / split, storage="topk", shard_size=4)
    summary = train_drafter_flow(str(cfg), str(workdir))
    assert summary["status"] == "trained" and summary["data"] == "offline"
    config = json.loads((workdir / "drafter" / "export" / "config.json").read_text())
    shard = json.loads((workdir / "hidden" / "train" / "shard-00000" / "manifest.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == shard["shard"]["aux_layers"]
    assert (workdir / "reports" / "training.png").read_bytes()[:8] == PNG_MAGIC

    capsys.readouterr()
    assert main(["train", "--config", str(cfg), "--workdir", str(workdir)]) == 0
    out = capsys.readouterr().out
    assert f"simulated acceptance length {summary['simulated_acceptance_length']:.3f}" in out
    assert f"training: complete at step {STEPS}" in out
    assert f"exported drafter: {workdir / 'drafter' / 'export'}" in out


def test_flow_refuses_missing_shards_naming_the_folder(tmp_path, tiny_target, prefect_harness):
    from eyas.errors import DataError
    from flows.train import train_drafter_flow

    cfg = recipe(tmp_path, "tiny-train-missing")
    workdir = tmp_path / "empty-run"
    with pytest.raises(DataError, match=r"hidden/train"):
        train_drafter_flow(str(cfg), str(workdir))
