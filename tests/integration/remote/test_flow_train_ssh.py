"""The train-drafter flow against a host reached over SSH (the test sshd on 127.0.0.1):
training runs there as a detached job (``python -m eyas.train.run``), its log streams into the
flow run, the picture lands in the run's folder on the host. A host block with 2 GPUs gets
torchrun over 2 processes (gloo on this CPU), equal to one process with the same global
batch; a restarted flow re-attaches to that job, and cancelling the flow leaves no rank."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from support.flow_logs import streamed_lines
from support.flow_states import task_states
from support.train_fixtures import (
    PNG_MAGIC,
    REPO,
    STEPS,
    merged_run,
    processes_with,
    recipe,
    split_launcher,
    wait_until,
)

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

def _final_weights(workdir: Path) -> dict[str, torch.Tensor]:
    return torch.load(workdir / "drafter" / "checkpoint" / "state.pt", weights_only=True)["model"]


def test_train_flow_over_ssh_launches_one_process_per_gpu_of_the_host(
        tmp_path, tiny_target, sshd, prefect_client):
    """The block says 2 GPUs and the config names no process count: the job is torchrun over
    2 workers (gloo here), its one log stream carries each step once, and the drafter equals
    one process accumulating the same global batch (weights rtol 1e-4 / atol 1e-5)."""
    from blocks.gpu_host import GpuHost
    from flows.train import train_drafter_flow

    torch.set_num_threads(1)
    for sub in ("one", "two"):
        (tmp_path / sub).mkdir()
    data_root = sshd.data_root / "train-ssh-2gpu"
    GpuHost(**sshd.spec(data_root=str(data_root), num_gpus=2).model_dump()).save(
        "test-sshd-train-2gpu", overwrite=True)
    cfg = recipe(tmp_path / "two", "tiny-train-ssh-2gpu", device="auto")
    workdir = merged_run(tmp_path / "two", tiny_target)
    state = train_drafter_flow(str(cfg), str(workdir), host_block="test-sshd-train-2gpu",
                               data="online", return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["processes"] == 2 and summary["status"] == "trained"
    (job,) = (data_root / ".eyas" / "jobs").iterdir()
    assert "--processes 2" in (job / "cmd").read_text()
    log = (job / "log").read_text().splitlines()
    assert [json.loads(x)["step"] for x in log if x.startswith('{"kind": "train"')] == list(
        range(1, STEPS + 1))
    assert sum(x.startswith('{"steps"') for x in log) == 1
    assert not any(x.startswith("error") for x in log), log[-20:]

    single = recipe(tmp_path / "one", "tiny-train-ssh-1p", processes=1, grad_accum=2)
    single_workdir = merged_run(tmp_path / "one", tiny_target)
    assert train_drafter_flow(str(single), str(single_workdir), data="online")["processes"] == 1
    two, one = _final_weights(workdir), _final_weights(single_workdir)
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=1e-4, atol=1e-5, msg=k)


def test_a_two_process_training_job_is_reattached_and_cancelled_with_its_ranks(
        tmp_path, tiny_target, sshd, prefect_harness):
    """The job a flow run left running on the host (torchrun over 2 workers) is the one a
    restarted flow re-attaches to; the flow's cancellation hook stops it, and every rank
    with it (the workers live in sessions of their own: they end with their agent)."""
    from blocks.gpu_host import GpuHost
    from eyas.remote.hosts import connect
    from eyas.remote.jobs import OFFLINE_ENV, job_status, start_job, start_or_reattach
    from eyas.train import run as core
    from tasks.jobs import _flow_run_tag, cancel_remote_jobs

    data_root = sshd.data_root / "train-ssh-cancel"
    spec = sshd.spec(data_root=str(data_root), num_gpus=2)
    GpuHost(**spec.model_dump()).save("test-sshd-train-cancel", overwrite=True)
    workdir = merged_run(tmp_path, tiny_target)
    config_file = tmp_path / "train.yaml"
    config_file.write_text("steps: 100000\nlog_every: 1\nttt_steps: 2\nmicro_batch: 1\n"
                           "draft_vocab_size: 4100\nmax_len: 64\ndevice: cpu\n")
    cmd = core.command(spec.eyas_python, data="online", train=str(workdir / "merged/train.jsonl"),
                       eval_=str(workdir / "merged/eval.jsonl"), model=str(tiny_target),
                       out=str(workdir / "drafter"), config_file=str(config_file), processes=2)
    run_id = uuid.uuid4()
    prefix = "train-tiny-train-ssh-cancel"
    with connect(spec) as host:
        job = start_job(host, cmd, env=OFFLINE_ENV,
                        job_id=f"{prefix}-20261130T000000-{_flow_run_tag(run_id)}-aa").job_id
        try:
            wait_until(lambda: '"kind": "train"' in (data_root / ".eyas" / "jobs" / job / "log")
                       .read_text(), 300, "the job's first step")
            launcher, workers = split_launcher(processes_with("EYAS_JOB_ID", job))
            assert launcher is not None and len(workers) == 2
            # A restarted flow run finds it instead of starting the same work again.
            assert start_or_reattach(host, "echo never", prefix=prefix) == (job, True)
            cancel_remote_jobs(None, SimpleNamespace(id=run_id, parameters={
                "host_block": "test-sshd-train-cancel"}), None)
            assert job_status(host, job).state in {"cancelled", "exited"}
            wait_until(lambda: not processes_with("EYAS_JOB_ID", job), 30,
                       "every rank of the cancelled job ending")
        finally:
            for p in processes_with("EYAS_JOB_ID", job):
                p.kill()


def test_a_cancelled_two_process_training_job_checkpoints_its_step_and_exits_143(
        tmp_path, tiny_target, sshd):
    """Cancelling a training job (what a stopped `eyas train --host-block` does, with
    `STOP_GRACE_S`): the agent passes the TERM on, both ranks end the same step, rank 0 writes
    its checkpoint, and the job's exit code, written once they are gone, is 143."""
    from eyas.remote.hosts import connect
    from eyas.remote.jobs import OFFLINE_ENV, cancel, job_status, start_job
    from eyas.train import run as core

    data_root = sshd.data_root / "train-ssh-stop"
    spec = sshd.spec(data_root=str(data_root), num_gpus=2)
    workdir = merged_run(tmp_path, tiny_target)
    config_file = tmp_path / "train.yaml"
    config_file.write_text("steps: 100000\nlog_every: 1\nttt_steps: 2\nmicro_batch: 1\n"
                           "checkpoint_every: 100000\ndraft_vocab_size: 4100\nmax_len: 64\n"
                           "device: cpu\n")
    cmd = core.command(spec.eyas_python, data="online", train=str(workdir / "merged/train.jsonl"),
                       eval_=str(workdir / "merged/eval.jsonl"), model=str(tiny_target),
                       out=str(workdir / "drafter"), config_file=str(config_file), processes=2)
    with connect(spec) as host:
        # The host runs this checkout's code (an SSH session does not inherit PYTHONPATH).
        job = start_job(host, cmd, env={**OFFLINE_ENV, "PYTHONPATH": str(REPO)}).job_id
        log = data_root / ".eyas" / "jobs" / job / "log"
        try:
            wait_until(lambda: '"kind": "train"' in log.read_text(), 300, "the job's first step")
            ranks = processes_with("EYAS_JOB_ID", job)
            st = cancel(host, job, grace=120)
            assert (st.state, st.exit_code) == ("exited", 143), log.read_text()[-2000:]
            assert not [p for p in ranks if p.is_running() and p.status() != "zombie"]
        finally:
            for p in processes_with("EYAS_JOB_ID", job):
                p.kill()
    text = log.read_text()
    stopped = [line for line in text.splitlines() if "training stopped at step" in line]
    assert len(stopped) == 1, text[-2000:]  # rank 0's line; rank 1 stopped silently
    saved = json.loads((workdir / "drafter" / "checkpoint" / "meta.json").read_text())["step"]
    assert f"training stopped at step {saved}, its checkpoint written" in stopped[0]
    assert "error: training stopped: its launcher got SIGTERM" in text
    assert job_status(host, job).exit_code == 143
