"""The train-drafter flow under the session's Prefect test server, on the tiny target: online
(the target in process) and offline (extraction shards), the export, the picture, the
artifacts, a rerun that trains nothing, `eyas train`, and the throttled progress artifact;
with 2 gloo processes (torchrun as the flow's child): equal to one process with the same
global batch, and resumed exactly after its launcher was killed, leaving no rank behind."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file
from support.train_fixtures import (
    PNG_MAGIC,
    STEPS,
    merged_run,
    processes_with,
    recipe,
    split_launcher,
    wait_until,
)

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


# -- several processes (torchrun over 2 gloo workers on CPU) ---------------------------------
MULTI_STEPS = 6  # room to stop a run after its first checkpoint (step 2) and resume it


def _final_weights(workdir: Path) -> dict[str, torch.Tensor]:
    return torch.load(workdir / "drafter" / "checkpoint" / "state.pt", weights_only=True)["model"]


def _records(workdir: Path) -> list[dict]:
    """history.json without the wall-clock field."""
    history = json.loads((workdir / "drafter" / "history.json").read_text())
    return [{k: v for k, v in r.items() if k != "tok_s"} for r in history]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory, tiny_target, prefect_harness):
    """The online tiny run trained by the flow with ``processes: 2`` (micro-batch 2 each):
    (workdir, flow run state)."""
    from flows.train import train_drafter_flow

    root = tmp_path_factory.mktemp("two-processes")
    cfg = recipe(root, "tiny-train-2p", processes=2, steps=MULTI_STEPS)
    workdir = merged_run(root, tiny_target)
    state = train_drafter_flow(str(cfg), str(workdir), data="online", return_state=True)
    assert state.is_completed(), state.message
    return workdir, state


def test_flow_on_two_gloo_processes_equals_one_process_with_the_same_global_batch(
        tmp_path, tiny_target, two_process_run, prefect_client):
    """2 processes x 1 micro-batch of 2 = 1 process x 2 accumulated micro-batches of 2: the
    same samples in each step (rank r takes global micro-batches r, r+2, ...), gradients
    averaged in another order. Tolerance: weights rtol 1e-4 / atol 1e-5 (float32 sums in
    another order over 6 AdamW steps), losses 1e-5 relative; token and hit counts equal."""
    from support.flow_logs import run_messages

    from flows.train import train_drafter_flow

    workdir2, state2 = two_process_run
    summary2 = state2.result()
    assert summary2["processes"] == 2 and summary2["status"] == "trained"
    assert summary2["steps"] == MULTI_STEPS

    cfg1 = recipe(tmp_path, "tiny-train-1p", processes=1, grad_accum=2, steps=MULTI_STEPS)
    workdir1 = merged_run(tmp_path, tiny_target)
    summary1 = train_drafter_flow(str(cfg1), str(workdir1), data="online")
    assert summary1["processes"] == 1

    one, two = _final_weights(workdir1), _final_weights(workdir2)
    assert one.keys() == two.keys()
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-5, msg=k)
    r1, r2 = _records(workdir1), _records(workdir2)
    assert [(r["kind"], r["step"], r["tokens"]) for r in r2] == [
        (r["kind"], r["step"], r["tokens"]) for r in r1]
    assert [r["acc"] for r in r2] == [r["acc"] for r in r1]
    assert [r["loss"] for r in r2] == pytest.approx([r["loss"] for r in r1], rel=1e-5)

    # One stream: rank 0's records, each once, as readable lines in the flow run's log.
    readable = ("step ", "eval @ ")

    def complete(lines: list[str]) -> bool:
        return sum(m.startswith("eval @ ") for m in lines) >= MULTI_STEPS // 2

    lines = run_messages(prefect_client, state2.state_details.flow_run_id, complete,
                         keep=lambda m: m.startswith(readable))
    steps = [int(m.split()[1]) for m in lines if m.startswith("step ")]
    assert steps == list(range(1, MULTI_STEPS + 1)), lines
    assert [m.split()[2] for m in lines if m.startswith("eval @ ")] == ["2", "4", "6"]


def test_flow_resumes_a_killed_two_process_run_exactly_and_no_rank_survives(
        tmp_path, tiny_target, two_process_run, monkeypatch):
    """The launcher (torchrun's agent) is killed outright after the first checkpoint: its two
    workers end with it, the task's retry starts a new launch that resumes the checkpoint,
    and the run ends with the weights and history of the run that was never stopped, bit for
    bit (same processes, same order of sums)."""
    from flows.train import train_drafter_flow

    marker = uuid.uuid4().hex
    monkeypatch.setenv("EYAS_TEST_MARK", marker)  # the launch inherits it: how we find it
    cfg = recipe(tmp_path, "tiny-train-2p-killed", processes=2, steps=MULTI_STEPS)
    workdir = merged_run(tmp_path, tiny_target)
    meta = workdir / "drafter" / "checkpoint" / "meta.json"
    killed: dict = {}

    def kill_after_first_checkpoint() -> None:
        wait_until(meta.is_file, 600, "the first checkpoint")
        launcher, workers = split_launcher(processes_with("EYAS_TEST_MARK", marker))
        killed.update(at=json.loads(meta.read_text())["step"], procs=[launcher, *workers])
        launcher.kill()

    killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
    killer.start()
    summary = train_drafter_flow(str(cfg), str(workdir), data="online")
    killer.join(timeout=5)
    assert len(killed["procs"]) == 3 and killed["at"] < MULTI_STEPS
    gone, alive = psutil.wait_procs(killed["procs"], timeout=5)
    assert not alive, f"ranks outlived their killed launcher: {alive}"
    assert summary["status"] == "resumed" and summary["resumed_from"] >= killed["at"]
    assert summary["steps"] == MULTI_STEPS

    uninterrupted, _ = two_process_run
    for k, v in _final_weights(uninterrupted).items():
        assert torch.equal(_final_weights(workdir)[k], v), k
    assert _records(workdir) == _records(uninterrupted)
