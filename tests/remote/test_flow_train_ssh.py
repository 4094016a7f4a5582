"""The train-drafter flow against a host reached over SSH (the test sshd on 127.0.0.1):
training runs there as a detached job (``python -m eyas.train.run``), its log streams into the
flow run, the picture lands in the run's folder on the host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flow_logs import streamed_lines
from flow_states import task_states
from train_fixtures import PNG_MAGIC, STEPS, merged_run, recipe

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_train_flow_over_ssh_runs_a_detached_job_and_streams_its_log(
        tmp_path, tiny_target, sshd, prefect_client):
    from blocks.gpu_host import GpuHost
    from flows.train import train_drafter_flow

    data_root = sshd.data_root / "train-ssh"  # its own jobs folder, apart from other tests'
    spec = sshd.spec(data_root=str(data_root))
    GpuHost(**spec.model_dump()).save("test-sshd-train", overwrite=True)
    cfg = recipe(tmp_path, "tiny-train-ssh")
    workdir = merged_run(tmp_path, tiny_target)  # the 'host' shares this filesystem
    state = train_drafter_flow(str(cfg), str(workdir), host_block="test-sshd-train",
                               data="online", return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    login = f"{spec.user}@127.0.0.1:{sshd.port}"
    assert summary["host"] == login and summary["status"] == "trained"
    assert summary["steps"] == STEPS and summary["export"] == str(workdir / "drafter" / "export")
    assert json.loads((workdir / "drafter" / "export" / "config.json").read_text())[
        "architectures"] == ["LlamaForCausalLMEagle3"]
    assert (workdir / "reports" / "training.png").read_bytes()[:8] == PNG_MAGIC
    jobs = list((data_root / ".eyas" / "jobs").iterdir())
    assert len(jobs) == 1 and (jobs[0] / "exit_code").read_text().strip() == "0"
    assert "eyas.train.run" in (jobs[0] / "cmd").read_text()
    # The job names the run and the flow run (a restarted flow re-attaches; cancelling stops it).
    flow_tag = "fr" + str(state.state_details.flow_run_id).replace("-", "")[:12]
    assert jobs[0].name.startswith("train-tiny-train-ssh-") and f"-{flow_tag}-" in jobs[0].name

    def evaluated(lines: list[str]) -> bool:
        return any(m.startswith(f"[{login}] eval @    {STEPS}") for m in lines)

    # The job's JSON step records came back as the readable lines a person would see.
    streamed = streamed_lines(prefect_client, state.state_details.flow_run_id, login, evaluated)
    assert any(m.startswith(f"[{login}] step      {STEPS}") for m in streamed), streamed[-5:]
    assert any(m.startswith(f"[{login}] eval @    {STEPS}") for m in streamed), streamed[-5:]
    assert Path(summary["picture"]) == workdir / "reports" / "training.png"
    assert not any(m.startswith(f'[{login}] {{"kind"') for m in streamed), "records not rendered"

    # A rerun is Cached: the policy checked the export and the stamp on the host; a deleted
    # export is made again (the job resumes the finished checkpoint and exports).
    again = train_drafter_flow(str(cfg), str(workdir), host_block="test-sshd-train",
                               data="online", return_state=True)
    assert task_states(prefect_client, again)["train-drafter-online"] == "Cached"
    assert again.result()["status"] == "complete"
    import shutil

    shutil.rmtree(workdir / "drafter" / "export")
    third = train_drafter_flow(str(cfg), str(workdir), host_block="test-sshd-train",
                               data="online", return_state=True)
    assert third.is_completed(), third.message
    assert task_states(prefect_client, third)["train-drafter-online"] == "Completed"
    assert (workdir / "drafter" / "export" / "config.json").is_file()
