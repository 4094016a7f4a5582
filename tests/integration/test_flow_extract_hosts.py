"""The extract-hidden-states flow over several hosts and with engine jobs, on the tiny target:
two loopback sshd "hosts", each with its own data root (shards placed by weight, the merged
input staged, shards delivered to the first host and verified, a failed shard retried where it
was placed) or sharing one folder; one job per engine for many shards, with the HF backend
standing in for SGLang (SGLang needs a GPU), locally and on the hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.flow_states import task_runs
from support.sshd_fixtures import sshd, sshd2  # noqa: F401
from test_flow_extract import TINY_VOCAB, recipe, set_token, table_rows

from eyas.extract.store import list_shards
from eyas.io import sha256_file

pytestmark = [pytest.mark.slow]


def _shards_table(client, state) -> dict[str, dict]:
    """The shards table artifact of the flow run of `state`, by shard."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    arts = client.read_artifacts(artifact_filter=ArtifactFilter(
        key=ArtifactFilterKey(any_=["extract-tiny-extract-train-shards"]),
        flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])))
    assert len(arts) == 1, arts
    return {r["shard"]: r for r in table_rows(arts[0])}


def _jobs(data_root: Path, prefix: str = "") -> list[Path]:
    root = data_root / ".eyas" / "jobs"
    return sorted(p for p in root.iterdir() if p.name.startswith(prefix)) if root.exists() else []


def _merged(workdir: Path, n: int) -> Path:
    from support.extract_fixtures import write_merged

    return write_merged(workdir / "merged" / "train.jsonl", n, vocab=TINY_VOCAB, max_len=16)


@pytest.fixture
def hf_stands_in_for_sglang(monkeypatch):
    """Engine jobs for the HF backend: the path SGLang takes, with a backend that runs here."""
    import flows.extract

    monkeypatch.setattr(flows.extract, "one_job_per_engine", lambda cfg: True)


def test_engine_jobs_run_many_shards_per_job_locally_with_hf_standing_in_for_sglang(
        tmp_path, tiny_target, prefect_client, hf_stands_in_for_sglang):
    from flows.extract import extract_hidden_states

    cfg_path = recipe(tmp_path, storage="final")
    workdir = tmp_path / "run"
    merged = _merged(workdir, 8)  # 3 shards of 3, 3, 2 records
    set_token(merged, 4, TINY_VOCAB + 50)  # shard 1 fails in the job, on every attempt
    state = extract_hidden_states(str(cfg_path), str(workdir), splits=["train"], retries=1,
                                  retry_delay_seconds=[0.1], return_state=True)
    assert state.is_failed() and "shard 00001" in state.message
    jobs = _jobs(workdir, "extract-tiny-extract-train-engine0-")
    # One job for the three shards (one engine load), then one for the retry of shard 1.
    assert len(jobs) == 2, [j.name for j in jobs]
    cmds = sorted((j / "cmd").read_text() for j in jobs)
    assert {c.split("--shards ")[1].split()[0] for c in cmds} == {"0,1,2", "1"}
    assert all("--keep-going" in c for c in cmds)
    runs = {tr.name: tr for tr in task_runs(prefect_client, state)}
    assert runs["extract-train-shard-00001"].state.name == "Failed"
    assert runs["extract-train-shard-00001"].run_count == 2
    assert runs["extract-train-shard-00000"].state.name == "Completed"
    rows = _shards_table(prefect_client, state)
    assert rows["shard-00001"]["status"] == "failed" and "index" in rows["shard-00001"]["message"]
    assert rows["shard-00002"]["status"] == "extracted"
    out = workdir / "hidden" / "train"
    assert [p.name for p in list_shards(out)] == ["shard-00000", "shard-00002"]

    # Fixed input: only shard 1 runs, in one more job; then a rerun runs nothing at all.
    set_token(merged, 4, 7)
    state = extract_hidden_states(str(cfg_path), str(workdir), splits=["train"],
                                  only_failed=True, return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()["train"]
    assert [(r["shard"], r["status"]) for r in summary["shards"]] == [("shard-00001", "extracted")]
    assert len(_jobs(workdir, "extract-tiny-extract-train-engine0-")) == 3
    again = extract_hidden_states(str(cfg_path), str(workdir), splits=["train"])["train"]
    assert [r["status"] for r in again["shards"]] == ["skipped"] * 3
    assert again["engine_jobs"] == [] and len(_jobs(workdir, "extract-tiny-extract-train-engine0-")) == 3
    assert [p.name for p in list_shards(out)] == ["shard-00000", "shard-00001", "shard-00002"]


def _save_host(server, name: str, **fields) -> object:
    from blocks.gpu_host import GpuHost

    spec = server.spec(**fields)
    GpuHost(**spec.model_dump()).save(name, overwrite=True)
    return spec


@pytest.mark.ssh
def test_two_hosts_place_stage_deliver_and_retry_where_placed(
        tmp_path, tiny_target, prefect_client, sshd, sshd2):  # noqa: F811
    """Host A (no GPU: weight 1) and B (2 GPUs: weight 2), each its own data root. The run
    lives on A; B gets the merged input (verified) and delivers its shards to A."""
    from flows.extract import extract_hidden_states

    a = _save_host(sshd, "test-host-a", num_gpus=0)
    b = _save_host(sshd2, "test-host-b", num_gpus=2)
    cfg_path = recipe(tmp_path, storage="compact", topk=4, shard_size=2)
    wd_a, wd_b = Path(a.data_root) / "runs" / "two", Path(b.data_root) / "runs" / "two"
    merged = _merged(wd_a, 8)  # 4 shards; cycle [B, A, B]: 0 B, 1 A, 2 B, 3 B
    set_token(merged, 0, TINY_VOCAB + 50)  # shard 0 (on B) fails on every attempt
    state = extract_hidden_states(str(cfg_path), "runs/two", host_block="test-host-a",
                                  host_blocks=["test-host-b"], splits=["train"], retries=0,
                                  return_state=True)
    assert state.is_failed() and "shard 00000" in state.message
    record = json.loads((wd_a / "hidden" / "train" / "placement.json").read_text())
    assert record["shards"] == {"00000": b.login, "00001": a.login, "00002": b.login,
                                "00003": b.login}
    assert [h["weight"] for h in record["hosts"]] == [1, 2]
    assert sha256_file(wd_b / "merged" / "train.jsonl") == sha256_file(merged)
    # Every finished shard is on A, verified; B kept none of them.
    assert [p.name for p in list_shards(wd_a / "hidden" / "train")] == [
        "shard-00001", "shard-00002", "shard-00003"]
    assert not [p for p in (wd_b / "hidden" / "train").iterdir() if p.name.startswith("shard-")]
    assert {j.name.rsplit("-", 3)[0] for j in _jobs(Path(b.data_root), "extract-")} == {
        "extract-train-00000", "extract-train-00002", "extract-train-00003"}
    assert [j.name.rsplit("-", 3)[0] for j in _jobs(Path(a.data_root), "extract-")] == [
        "extract-train-00001"]
    rows = _shards_table(prefect_client, state)
    assert rows["shard-00002"]["host"] == b.login and rows["shard-00001"]["host"] == a.login

    # Fixed input: the failed shard runs again on B (its recorded host), with the input
    # staged there again (it changed), and lands on A.
    set_token(merged, 0, 7)
    state = extract_hidden_states(str(cfg_path), "runs/two", host_block="test-host-a",
                                  host_blocks=["test-host-b"], splits=["train"],
                                  only_failed=True, return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()["train"]
    assert [(r["shard"], r["status"], r["host"]) for r in summary["shards"]] == [
        ("shard-00000", "extracted", b.login)]
    assert sha256_file(wd_b / "merged" / "train.jsonl") == sha256_file(merged)
    assert len(list_shards(wd_a / "hidden" / "train")) == 4
    assert not [p for p in (wd_b / "hidden" / "train").iterdir() if p.name.startswith("shard-")]
    # Nothing left to do: a rerun starts no job anywhere.
    before = len(_jobs(Path(a.data_root))) + len(_jobs(Path(b.data_root)))
    again = extract_hidden_states(str(cfg_path), "runs/two", host_block="test-host-a",
                                  host_blocks=["test-host-b"], splits=["train"])["train"]
    assert [r["status"] for r in again["shards"]] == ["skipped"] * 4
    assert len(_jobs(Path(a.data_root))) + len(_jobs(Path(b.data_root))) == before
    assert again["samples"] == 8


@pytest.mark.ssh
def test_engine_jobs_on_two_hosts_with_shared_storage_with_hf_standing_in_for_sglang(
        tmp_path, tiny_target, prefect_client, sshd, sshd2, hf_stands_in_for_sglang):  # noqa: F811
    """Shared storage (one folder both hosts see): shards written in place. Host B has 4 GPUs
    and tp_size 2: two engines, each one job over its two GPUs for all its shards."""
    from flows.extract import extract_hidden_states

    a = _save_host(sshd, "test-host-a-shared", num_gpus=0, data_root=str(tmp_path / "root-a"))
    b = _save_host(sshd2, "test-host-b-shared", num_gpus=4, data_root=str(tmp_path / "root-b"))
    for spec in (a, b):
        Path(spec.data_root).mkdir()
    cfg_path = recipe(tmp_path, storage="final", shard_size=1, tp_size=2)
    workdir = tmp_path / "shared-run"
    _merged(workdir, 6)  # 6 shards; weights A 1 engine, B 2 engines: cycle [B, A, B]
    summary = extract_hidden_states(str(cfg_path), str(workdir), host_block="test-host-a-shared",
                                    host_blocks=["test-host-b-shared"], splits=["train"],
                                    shared_storage=True)["train"]
    assert [r["status"] for r in summary["shards"]] == ["extracted"] * 6
    assert summary["placement"] == {"00000": b.login, "00001": a.login, "00002": b.login,
                                    "00003": b.login, "00004": a.login, "00005": b.login}
    assert len(list_shards(workdir / "hidden" / "train")) == 6
    jobs_a, jobs_b = _jobs(Path(a.data_root), "extract-"), _jobs(Path(b.data_root), "extract-")
    assert len(jobs_a) == 1 and "--shards 1,4 " in (jobs_a[0] / "cmd").read_text()
    # B's four shards dealt to its two engines, each job on its own pair of GPUs.
    b_jobs = {(j / "cmd").read_text().split("--shards ")[1].split()[0]:
              (j / "run.sh").read_text() for j in jobs_b}
    assert set(b_jobs) == {"0,3", "2,5"}
    assert "CUDA_VISIBLE_DEVICES=0,1" in b_jobs["0,3"] and "CUDA_VISIBLE_DEVICES=2,3" in b_jobs["2,5"]
    assert sorted(summary["engine_jobs"]) == sorted(j.name for j in jobs_a + jobs_b)
    assert not (Path(b.data_root) / "runs").exists()  # nothing staged: the folder is shared
