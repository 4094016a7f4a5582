"""Engine queues (eyas/remote/engines.py) against real detached jobs on this machine, with a shell
command standing in for ``eyas.extract.run --shards ... --keep-going`` (it prints the same
per-shard events): batching, a retry in the next job, errors that keep their class, a job that
ends before a shard, and re-attaching to a job a previous flow left running."""

from __future__ import annotations

import contextlib
import json
import logging
import shlex

import pytest

from eyas.errors import ConfigError
from eyas.remote.engines import EngineQueue, ShardJobError
from eyas.remote.hosts import HostSpec, LocalHost
from eyas.remote.jobs import new_job_id, start_job

LOG = logging.getLogger("test-engines")


def fake_command(tmp_path, *, fail_once=(), config_error=(), skip=(), sleep: float = 0):
    """A command builder: for each index, one event line like eyas.extract.run's. Shards in
    `fail_once` fail the first time (a marker file remembers), `config_error` always fail with
    a ConfigError, `skip` are never reported."""
    def command(indices: list[int]) -> str:
        lines = [f"sleep {sleep}"] if sleep else []
        lines.append("echo extraction log line")
        for i in indices:
            done = {"event": "shard", "index": i, "shard": f"shard-{i:05d}", "status": "extracted",
                    "samples": 1, "tokens": 5, "quarantined": 0, "bytes": 10}
            bad = {"event": "shard-failed", "index": i, "shard": f"shard-{i:05d}",
                   "error": "IndexError: index out of range", "error_type": "IndexError"}
            if i in skip:
                continue
            if i in config_error:
                bad.update(error="ConfigError: layer 99", error_type="ConfigError")
                lines.append(f"echo {shlex.quote(json.dumps(bad))}")
            elif i in fail_once:
                marker = shlex.quote(str(tmp_path / f"failed-{i}"))
                lines.append(f"if [ -e {marker} ]; then echo {shlex.quote(json.dumps(done))}; "
                             f"else : > {marker}; echo {shlex.quote(json.dumps(bad))}; fi")
            else:
                lines.append(f"echo {shlex.quote(json.dumps(done))}")
        return "\n".join(lines) + "\n"
    return command


@pytest.fixture
def local(tmp_path):
    spec = HostSpec.local(data_root=str(tmp_path / "root"))
    (tmp_path / "root").mkdir()
    return spec


class Held:
    """A `hold` that counts how often it was taken, and whether it is held now."""

    def __init__(self) -> None:
        self.taken, self.now = 0, False

    @contextlib.contextmanager
    def __call__(self):
        assert not self.now, "one engine's jobs run one at a time"
        self.taken, self.now = self.taken + 1, True
        try:
            yield
        finally:
            self.now = False


def _queue(spec, command, name="extract-test-train-engine0", hold=None):
    return EngineQueue(spec, name=name, command=command, env={}, uses=[], logger=LOG,
                       gather_s=0.2, poll_interval=0.2, **({"hold": hold} if hold else {}),
                       job_id=lambda prefix: new_job_id(prefix, "frtest"))


def _cmd_of(spec, job_id: str) -> str:
    from pathlib import Path

    return (Path(spec.data_root) / ".eyas" / "jobs" / job_id / "cmd").read_text()


def test_one_job_for_many_shards_then_the_retry_in_the_next(tmp_path, local):
    held = Held()
    q = _queue(local, fake_command(tmp_path, fail_once={1}), hold=held)
    try:
        q.submit([0, 1, 2])
        assert q.result(0)["status"] == "extracted"
        with pytest.raises(ShardJobError, match="shard-00001: IndexError"):
            q.result(1)
        assert q.result(2)["shard"] == "shard-00002"
        assert len(q.jobs) == 1 and "shard-00002" in _cmd_of(local, q.jobs[0])
        assert q.result(1)["status"] == "extracted"  # handed out once already: a retry
        assert len(q.jobs) == 2
        assert "shard-00001" in _cmd_of(local, q.jobs[1])
        assert "shard-00000" not in _cmd_of(local, q.jobs[1])
        assert held.taken == 2 and not held.now  # each job held the engine's slots, then let go
        assert all("-frtest-" in job for job in q.jobs)  # named by the caller's job ids
    finally:
        q.close()


def test_errors_keep_their_class_and_unreported_shards_fail(tmp_path, local):
    q = _queue(local, fake_command(tmp_path, config_error={0}, skip={1}))
    try:
        q.submit([0, 1])
        with pytest.raises(ConfigError, match="layer 99"):
            q.result(0)
        with pytest.raises(ShardJobError, match="exited with 0 before this shard was done"):
            q.result(1)
    finally:
        q.close()


def test_a_restarted_flow_reattaches_to_the_running_engine_job(tmp_path, local):
    command = fake_command(tmp_path)
    name = "extract-test-train-engine0"
    earlier = start_job(LocalHost(local), command([0, 1]).replace("echo extraction", "sleep 2; echo extraction", 1)
                        + "# --shards 0,1\n", job_id=new_job_id(name))
    q = _queue(local, command, name)
    try:
        q.submit([0, 1, 2])
        assert [q.result(i)["status"] for i in (0, 1, 2)] == ["extracted"] * 3
        assert q.jobs[0] == earlier.job_id  # shards 0 and 1 came from the running job
        assert len(q.jobs) == 2 and "shard-00002" in _cmd_of(local, q.jobs[1])
    finally:
        q.close()
