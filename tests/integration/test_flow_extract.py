"""The extract-hidden-states flow under the session's Prefect test server, on the tiny target:
locally (shards, a real failure, only_failed, skip on rerun, artifacts, the GPU slot pool,
`eyas extract`) and over SSH to the test sshd (shards run as detached jobs there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support.extract_fixtures import write_merged
from support.flow_logs import streamed_lines
from support.flow_states import task_runs
from support.paths import REPO
from support.sshd_fixtures import sshd  # noqa: F401

from eyas.extract.store import iter_samples, list_shards, read_shard_manifest
from eyas.io import dumps_line, iter_jsonl
from tasks.limits import pool_size

TINY_VOCAB = 4100

pytestmark = [pytest.mark.slow]


def recipe(tmp_path: Path, **extract) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml").read_text())
    raw["name"] = "tiny-extract"
    raw["extract"] = {"shard_size": 3, "batch_tokens": 512, "device": "cpu",
                      "storage": "compact", "topk": 8, **extract}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def workdir_with_data(tmp_path: Path, n: int = 8) -> Path:
    workdir = tmp_path / "run"
    write_merged(workdir / "merged" / "train.jsonl", n, vocab=TINY_VOCAB, max_len=24)
    return workdir


def set_token(path: Path, ordinal: int, token: int) -> None:
    """Rewrite record `ordinal` of a merged file with its first token id replaced."""
    records = [obj for _, obj in iter_jsonl(path)]
    records[ordinal]["input_ids"][0] = token
    path.write_bytes(b"".join(dumps_line(r) for r in records))


def artifact(client, key: str, state=None):
    """The artifact `key` of the flow run of `state` (a key is reused by every run: the newest
    by creation time is not always the one listed last on a busy server); any run's without."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    run = (ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
           if state is not None else None)
    arts = client.read_artifacts(artifact_filter=ArtifactFilter(
        key=ArtifactFilterKey(any_=[key]), flow_run_id=run))
    assert arts, f"no artifact {key}"
    return arts[-1]


def table_rows(art) -> list[dict]:
    data = json.loads(art.data) if isinstance(art.data, str) else art.data
    return data


def test_flow_shards_failure_only_failed_and_rerun(tmp_path, tiny_target, prefect_client):
    from flows.extract import extract_hidden_states

    cfg_path = recipe(tmp_path)
    workdir = workdir_with_data(tmp_path)
    merged = workdir / "merged" / "train.jsonl"
    # A token id the target has no embedding for, in shard 1 (records 3-5): a real failure of
    # that shard's forward pass, on every attempt.
    set_token(merged, 4, TINY_VOCAB + 50)

    state = extract_hidden_states(str(cfg_path), str(workdir), splits=["train"], retries=1,
                                  retry_delay_seconds=[0.1], return_state=True)
    assert state.is_failed()
    assert "shard 00001" in state.message
    out = workdir / "hidden" / "train"
    assert [p.name for p in list_shards(out)] == ["shard-00000", "shard-00002"]
    runs = {tr.name: tr for tr in task_runs(prefect_client, state)}
    assert runs["extract-train-shard-00001"].state.name == "Failed"
    assert runs["extract-train-shard-00001"].run_count == 2  # retried once with backoff
    assert runs["extract-train-shard-00000"].state.name == "Completed"
    rows = {r["shard"]: r for r in table_rows(artifact(prefect_client, "extract-tiny-extract-train-shards", state))}
    assert rows["shard-00001"]["status"] == "failed" and "index" in rows["shard-00001"]["message"]
    assert rows["shard-00000"]["status"] == "extracted" and rows["shard-00000"]["bytes"] > 0
    # Two of three shards done: a failed run never shows 100 %.
    assert abs(artifact(prefect_client, "extract-tiny-extract-train-progress", state).data - 200 / 3) < 1e-6
    assert "estimated" in artifact(prefect_client, "extract-tiny-extract-plan", state).data
    assert pool_size("eyas-gpu-local") >= 1

    # Fix the input; only the failed shard is submitted.
    set_token(merged, 4, 7)
    before = (out / "shard-00000" / "data.safetensors").stat().st_mtime_ns
    state2 = extract_hidden_states(str(cfg_path), str(workdir), splits=["train"], only_failed=True,
                                   return_state=True)
    assert state2.is_completed(), state2.message
    summary = state2.result()["train"]
    assert [(r["shard"], r["status"]) for r in summary["shards"]] == [("shard-00001", "extracted")]
    assert summary["left_out_complete"] == 2
    assert {tr.name for tr in task_runs(prefect_client, state2)} >= {"extract-train-shard-00001"}
    assert "extract-train-shard-00000" not in {tr.name for tr in task_runs(prefect_client, state2)}
    assert (out / "shard-00000" / "data.safetensors").stat().st_mtime_ns == before
    assert len(list_shards(out)) == 3
    # The shards left out are still in the table, and the bytes line counts every shard.
    rows = {r["shard"]: r["status"] for r in table_rows(
        artifact(prefect_client, "extract-tiny-extract-train-shards", state2))}
    assert rows == {"shard-00000": "complete", "shard-00001": "extracted",
                    "shard-00002": "complete"}
    assert "3/3 shard(s) done" in artifact(prefect_client, "extract-tiny-extract-train-bytes", state2).data
    assert artifact(prefect_client, "extract-tiny-extract-train-progress", state2).data == 100.0
    m = read_shard_manifest(out / "shard-00001")
    assert m["storage"] == "compact" and m["num_samples"] == 3
    sample = next(iter_samples(out / "shard-00001"))
    assert sample["aux_hidden"].shape[1] == 3 * 256 and sample["topk_ids"].shape[1] == 8
    assert 0.9 < summary["actual_over_estimate"] < 1.2


def test_eyas_extract_cli_then_rerun_skips_everything(tmp_path, tiny_target, prefect_harness, capsys):
    from eyas.cli import main

    cfg_path = recipe(tmp_path, storage="final")
    workdir = workdir_with_data(tmp_path, n=5)
    argv = ["extract", "--config", str(cfg_path), "--workdir", str(workdir), "--split", "train", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)["train"]
    assert [r["status"] for r in first["shards"]] == ["extracted", "extracted"]
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)["train"]
    assert [r["status"] for r in again["shards"]] == ["skipped", "skipped"]
    assert again["actual_bytes"] == first["actual_bytes"]


@pytest.mark.ssh
def test_flow_runs_shards_as_jobs_over_ssh(tmp_path, tiny_target, prefect_client, sshd):  # noqa: F811
    from blocks.gpu_host import GpuHost
    from flows.extract import extract_hidden_states

    spec = sshd.spec()
    GpuHost(**spec.model_dump()).save("test-sshd-extract", overwrite=True)
    cfg_path = recipe(tmp_path, topk=4)
    workdir = workdir_with_data(tmp_path, n=4)  # the 'host' shares this filesystem
    state = extract_hidden_states(str(cfg_path), str(workdir), host_block="test-sshd-extract",
                                  splits=["train"], shards=[1], return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()["train"]
    assert summary["host"] == f"{spec.user}@127.0.0.1:{sshd.port}"
    assert [(r["shard"], r["status"], r["samples"]) for r in summary["shards"]] == [
        ("shard-00001", "extracted", 1)]
    out = workdir / "hidden" / "train"
    assert [p.name for p in list_shards(out)] == ["shard-00001"]
    jobs = list((Path(spec.data_root) / ".eyas" / "jobs").iterdir())
    assert len(jobs) == 1 and (jobs[0] / "exit_code").read_text().strip() == "0"
    assert pool_size(f"eyas-gpu-127.0.0.1-{sshd.port}") == 1
    # The job's own output (its summary line) reached the flow run's logs through the stream.
    streamed = streamed_lines(prefect_client, state.state_details.flow_run_id, summary["host"],
                              lambda lines: any('"num_shards": 1' in m for m in lines))
    assert any('"num_shards": 1' in m for m in streamed), streamed[-5:]


def test_disk_task_refuses_and_says_so_in_its_artifact(prefect_client):
    from prefect import flow

    from eyas.extract.plan import DiskSpaceError
    from tasks.extract import disk_task

    @flow(name="disk-check-test")
    def check(free: int, key: str) -> int:
        plan = {"specs": [{"num_tokens": 1000}], "todo": [0], "storage": "compact",
                "hidden_size": 7168, "aux_layers": [1, 29, 57], "estimated_bytes": 21_713_000,
                "needed_bytes": 21_713_000, "free_bytes": free, "out": "/data/run/hidden/train"}
        return disk_task({"train": plan}, 0.10, "train@gpu:22", key)

    state = check(20_000_000, "extract-disk-test", return_state=True)
    assert state.is_failed()
    with pytest.raises(DiskSpaceError, match="margin"):
        state.result()
    md = artifact(prefect_client, "extract-disk-test-plan").data
    assert "REFUSED" in md and "/data/run/hidden/train" in md
    assert check(10**9, "extract-disk-test-ok") == 10**9
