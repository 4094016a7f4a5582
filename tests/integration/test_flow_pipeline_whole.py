"""The whole job as one flow (`eyas-pipeline`) on the tiny target, under the session's Prefect
test server: generation (a real `transformers serve` on 127.0.0.1) to the evaluation, then
reruns. Caching never lies: every cached task x {output deleted, corrupted, code changed,
settings changed} runs again (or, for answers made with other settings, refuses), and the
next run is Cached again; a failed shard is redone alone, with what depends on it.

The module's tests share one run folder and run in order: each leaves it whole again.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from support.flow_states import task_states
from support.pipeline_fixtures import small_recipe

from eyas.config import PipelineConfig, load_config
from eyas.io import iter_jsonl, read_json
from eyas.manifest import verify_manifest

pytestmark = [pytest.mark.slow, pytest.mark.serve]

CACHED_TASKS = ("generate-demo_chat", "tokenize-demo_chat", "tokenize-demo_sharegpt",
                "tokenize-demo_reasoning", "tokenize-demo_long", "merge",
                "train-drafter-offline", "evaluate-drafter")


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_target, prefect_harness):
    """The run folder, its config, and a `go(cfg=None)` running the whole pipeline there,
    returning ``(state, {task: state name}, seconds)``."""
    from prefect.client.orchestration import get_client

    from flows.pipeline import run_pipeline

    root = tmp_path_factory.mktemp("whole")
    cfg = load_config(small_recipe(root / "recipe.yaml"))
    workdir = root / "run"

    def go(config: PipelineConfig | None = None):
        t0 = time.monotonic()
        state = run_pipeline(config or cfg, str(workdir), return_state=True)
        seconds = time.monotonic() - t0
        with get_client(sync_client=True) as client:
            return state, task_states(client, state), seconds

    first = go()
    return {"cfg": cfg, "workdir": workdir, "go": go, "first": first}


def all_cached(states: dict[str, str]) -> None:
    """Every cached task Cached, every shard Skipped."""
    for name in CACHED_TASKS:
        assert states[name] == "Cached", (name, states)
    shards = {k: v for k, v in states.items() if k.startswith("extract-")}
    assert shards and set(shards.values()) == {"Skipped"}, shards


def test_whole_job_then_a_rerun_from_caches(run, capsys):
    state, states, seconds = run["first"]
    assert state.is_completed(), state.message
    workdir = run["workdir"]
    result = state.result()
    for folder in ("generated/demo_chat", "prepared/demo_long", "merged", "drafter/export",
                   "evaluate"):
        assert verify_manifest(workdir / folder) == [], folder
    assert [r["status"] for r in result["extract"]["train"]["shards"]] == ["extracted"] * len(
        result["extract"]["train"]["shards"])
    assert result["train"]["status"] == "trained" and result["train"]["steps"] == 4
    assert result["evaluate"]["acceptance_length"] is not None
    assert result["status_before"]["next_phase"] == "generate/tokenize"
    assert result["status_after"]["next_phase"] == "extract"
    for name in CACHED_TASKS:
        assert states[name] == "Completed", (name, states)
    # What the UI shows for the run: the statistics table, the training picture, the report.
    assert {"whole-test-datasets", "whole-test-summary", "train-whole-test-summary",
            "evaluate-whole-test-report", "pipeline-whole-test"} <= _artifact_keys(state)

    again, states2, seconds2 = run["go"]()
    assert again.is_completed(), again.message
    all_cached(states2)
    assert again.result()["train"]["status"] == "complete"
    assert again.result()["status_before"]["next_phase"] == "done"
    with capsys.disabled():
        print(f"\nwhole pipeline (test size): first run {seconds:.1f} s, cached rerun "
              f"{seconds2:.1f} s")


def _artifact_keys(state) -> set[str]:
    """Keys of the artifacts the flow run behind `state` (or its tasks) published."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    return {a.key for a in arts}


# -- the cache matrix: each cached task x what can happen to it -----------------------------
def _first_line_changed(path: Path) -> None:
    """Same size, other bytes: a digit of the first line's first number changed."""
    data = bytearray(path.read_bytes())
    i = next(i for i, b in enumerate(data) if chr(b).isdigit())
    data[i] = ord("1") if chr(data[i]) != "1" else ord("2")
    path.write_bytes(bytes(data))


def _drop_last_line(path: Path) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))


def _flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(len(data) - 64, len(data) - 32):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


DELETED = {
    "generate-demo_chat": lambda w: shutil.rmtree(w / "generated" / "demo_chat"),
    "tokenize-demo_long": lambda w: shutil.rmtree(w / "prepared" / "demo_long"),
    "merge": lambda w: (w / "merged").rename(w / "merged-moved-away"),
    "train-drafter-offline": lambda w: shutil.rmtree(w / "drafter" / "export"),
    "evaluate-drafter": lambda w: shutil.rmtree(w / "evaluate"),
}
CORRUPTED = {
    "generate-demo_chat": lambda w: _drop_last_line(w / "generated/demo_chat/responses.jsonl"),
    "tokenize-demo_long": lambda w: _first_line_changed(w / "prepared/demo_long/tokenized_data.jsonl"),
    "merge": lambda w: _first_line_changed(w / "merged" / "train.jsonl"),
    "train-drafter-offline": lambda w: _flip_bytes(w / "drafter/export/model.safetensors"),
    "evaluate-drafter": lambda w: _first_line_changed(w / "evaluate" / "report.json"),
}
SETTINGS = {  # a change each task's output depends on
    "tokenize-demo_long": {"tokenize": {"on_bad_record": "reject"}},
    "merge": {"merge": {"outlier_token_share_ratio": 2.4}},
    "train-drafter-offline": {"train": {"lr": 2e-3}},
    "evaluate-drafter": {"evaluate": {"max_new_tokens": 6}},
}
TASK_OBJECTS = {"generate-demo_chat": "tasks.prepare:generate_task",
                "tokenize-demo_long": "tasks.prepare:tokenize_task",
                "merge": "tasks.prepare:merge_task",
                "train-drafter-offline": "tasks.train:train_task",
                "evaluate-drafter": "tasks.evaluate:evaluate_task"}


def _changed(cfg: PipelineConfig, update: dict) -> PipelineConfig:
    data = cfg.model_dump(mode="json")
    for section, fields in update.items():
        data[section].update(fields)
    return PipelineConfig.model_validate(data)


def _holds(task: str, states: dict[str, str]) -> None:
    assert states[task] != "Cached", (task, states)
    assert states[task] in ("Completed", "Skipped"), (task, states)


def _refused(state, task: str) -> bool:
    """Whether `task`'s own cache policy refused its stored result in that flow run (its log
    says so): the output check caught the damage, not a change upstream."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterTaskRunId,
    )
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
        ids = [tr.id for tr in runs if tr.name == task]
        for _ in range(50):
            logs = client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=ids)))
            if any("cached result refused" in x.message for x in logs):
                return True
            time.sleep(0.2)
    return False


@pytest.mark.parametrize("damage", ["deleted", "corrupted"])
def test_damaged_outputs_are_made_again(run, damage):
    """All five cached tasks' outputs damaged at once: each task's own check refuses its
    cached result, the task runs, the output holds again; the next run is Cached."""
    for perturb in (DELETED if damage == "deleted" else CORRUPTED).values():
        perturb(run["workdir"])
    state, states, _ = run["go"]()
    assert state.is_completed(), state.message
    for task in DELETED:
        _holds(task, states)
        assert _refused(state, task), f"{task}: its cache policy did not refuse ({damage})"
    if damage == "deleted":  # the probe saw the merge missing, not "done"
        assert state.result()["status_before"]["next_phase"] == "generate/tokenize"
        assert (run["workdir"] / "merged" / "train.jsonl").is_file()
        shutil.rmtree(run["workdir"] / "merged-moved-away")
    for folder in ("generated/demo_chat", "prepared/demo_long", "merged", "drafter/export",
                   "evaluate"):
        assert verify_manifest(run["workdir"] / folder) == [], folder
    _, again, _ = run["go"]()
    all_cached(again)


def test_merged_moved_away_is_merged_again_and_never_called_done(run):
    (run["workdir"] / "merged").rename(run["workdir"] / "merged-moved-away")
    state, states, _ = run["go"]()
    assert state.is_completed(), state.message
    assert states["merge"] == "Completed" and _refused(state, "merge")
    assert state.result()["status_before"]["next_phase"] == "merge"
    assert state.result()["status_after"]["next_phase"] == "done"
    assert states["train-drafter-offline"] == "Cached"  # the same data again: nothing else
    shutil.rmtree(run["workdir"] / "merged-moved-away")


def test_changed_code_runs_the_tasks_again(run, monkeypatch):
    import importlib

    for where in TASK_OBJECTS.values():
        module, name = where.split(":")
        obj = getattr(importlib.import_module(module), name)
        monkeypatch.setattr(obj, "source_code", obj.source_code + "\n# changed\n")
    state, states, _ = run["go"]()
    assert state.is_completed(), state.message
    for task in TASK_OBJECTS:
        # The task ran; its manifest says the work is done, so it did nothing: "Skipped".
        assert states[task] == "Skipped", (task, states)
    _, again, _ = run["go"]()
    for task in TASK_OBJECTS:
        assert again[task] == "Cached", (task, again)


def test_changed_settings_run_the_tasks_again(run):
    changed = run["cfg"]
    for update in SETTINGS.values():
        changed = _changed(changed, update)
    state, states, _ = run["go"](changed)
    assert state.is_completed(), state.message
    for task in SETTINGS:
        _holds(task, states)
        assert states[task] != "Skipped", (task, states)  # made anew, not found done
    assert list(run["workdir"].glob("drafter.replaced-*"))  # trained otherwise: kept aside
    _, again, _ = run["go"](changed)
    for task in SETTINGS:
        assert again[task] == "Cached", (task, again)
    state, states, _ = run["go"]()  # back to the recipe's settings: made anew again
    assert state.is_completed(), state.message
    for task in SETTINGS:
        _holds(task, states)


def test_answers_made_with_other_settings_are_never_overwritten(run):
    before = (run["workdir"] / "generated" / "demo_chat" / "responses.jsonl").read_bytes()
    changed = _changed(run["cfg"], {"generation": {"max_tokens": 12}})
    state, states, _ = run["go"](changed)
    assert state.is_failed()
    assert states["generate-demo_chat"] == "Failed"
    assert "other settings" in state.message
    assert (run["workdir"] / "generated" / "demo_chat" / "responses.jsonl").read_bytes() == before


def test_a_failed_shard_is_redone_alone_with_what_depends_on_it(run, monkeypatch):
    import flows.extract
    from eyas.remote import extract_job

    workdir = run["workdir"]
    from eyas.manifest import manifest_identity

    shard = workdir / "hidden" / "train" / "shard-00001"
    made = manifest_identity(shard / "manifest.json")
    shutil.rmtree(shard)
    real = extract_job.extract_shard

    def broken(spec, *args, **kwargs):
        if spec.index == 1 and "train" in str(args[1]):
            raise RuntimeError("CUDA error: an illegal memory access (a fault drill)")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(extract_job, "extract_shard", broken)
    monkeypatch.setattr(flows.extract, "SHARD_RETRY_DELAYS", [0.1, 0.1])
    failed, states, _ = run["go"]()
    assert failed.is_failed() and "train shard 00001" in failed.message
    assert "train-drafter-offline" not in states
    monkeypatch.setattr(extract_job, "extract_shard", real)

    state, states, _ = run["go"]()
    assert state.is_completed(), state.message
    assert states["extract-train-shard-00001"] == "Completed"
    others = {k: v for k, v in states.items()
              if k.startswith("extract-") and k != "extract-train-shard-00001"}
    assert set(others.values()) == {"Skipped"}, others
    for name in CACHED_TASKS[:6]:  # phases 1-3 untouched
        assert states[name] == "Cached", (name, states)
    # What depends on the shard is redone only if the shard came out different: the training
    # reads its manifest by what it says was made (`manifest_identity`), not by when.
    if manifest_identity(shard / "manifest.json") == made:
        assert states["train-drafter-offline"] in ("Cached", "Skipped"), states
        assert states["evaluate-drafter"] in ("Cached", "Skipped"), states
    else:
        assert states["train-drafter-offline"] not in ("Cached", "Skipped"), states
        assert states["evaluate-drafter"] not in ("Cached", "Skipped"), states


def test_everything_cached_at_the_end(run):
    state, states, _ = run["go"]()
    assert state.is_completed(), state.message
    all_cached(states)
    report = read_json(run["workdir"] / "evaluate" / "report.json")
    assert report["run"] == "whole-test"
    assert [o for _, o in iter_jsonl(run["workdir"] / "merged" / "eval.jsonl")]
    assert json.loads((run["workdir"] / "drafter" / "settings.json").read_text())["data"]
