"""NCCL settings given once reach every job eyas starts on a host; training's collectives wait
a bounded time."""

import datetime

import pytest

from eyas.errors import ConfigError
from eyas.remote.hosts import HostSpec, LocalHost
from eyas.remote.jobs import attach, start_job
from eyas.train.run import COLLECTIVE_TIMEOUT_ENV, collective_timeout
from tasks.hosts import resolve_run


def test_the_hosts_gpu_env_reaches_every_job_and_the_recipes_adds_to_it(tmp_path):
    spec = HostSpec(kind="local", data_root=str(tmp_path / "data"), known_hosts=None,
                    gpu_env={"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "WARN"})
    host = LocalHost(spec)
    start_job(host, 'echo "$NCCL_P2P_DISABLE $NCCL_DEBUG"', job_id="j1",
              env={"NCCL_DEBUG": "INFO"})  # the job's own env wins
    lines: list[str] = []
    assert attach(host, "j1", stream=lines.append, poll_interval=0.1) == 0
    assert lines == ["1 INFO"]


def test_the_recipes_gpu_env_goes_onto_the_host_of_a_run():
    ssh = HostSpec(host="192.0.2.10", known_hosts=None, gpu_env={"A": "block"})
    _, host = resolve_run("/data/run", ssh, {"A": "recipe", "B": "1"})
    assert host.gpu_env == {"A": "recipe", "B": "1"}
    _, host = resolve_run("/data/run", ssh, {})
    assert host.gpu_env == {"A": "block"}


def test_training_collectives_time_out(monkeypatch):
    monkeypatch.delenv(COLLECTIVE_TIMEOUT_ENV, raising=False)
    assert collective_timeout() == datetime.timedelta(minutes=10)
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "90")
    assert collective_timeout() == datetime.timedelta(seconds=90)
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match="gpu_env"):
        collective_timeout()


def test_every_host_of_a_placed_extraction_gets_the_recipes_gpu_env():
    from support.paths import REPO

    from eyas.config import load_config
    from flows.extract import run_hosts

    cfg = load_config(REPO / "recipes" / "tiny-demo.yaml").model_copy(
        update={"gpu_env": {"NCCL_P2P_DISABLE": "1"}})
    a = HostSpec(host="192.0.2.10", known_hosts=None, gpu_env={"NCCL_DEBUG": "WARN"})
    b = HostSpec(host="192.0.2.11", known_hosts=None)
    run = run_hosts([a, b], "runs/x", "runs/x", None, cfg, shared_storage=False)
    assert [s.gpu_env for s in run.specs] == [{"NCCL_DEBUG": "WARN", "NCCL_P2P_DISABLE": "1"},
                                              {"NCCL_P2P_DISABLE": "1"}]
