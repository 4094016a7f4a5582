"""tasks.jobs: job ids that name the flow run, a remote job's log streamed (and re-rendered),
its last JSON line read back. The 'host' is this machine (LocalHost): same code as over SSH."""

from __future__ import annotations

import re
import uuid

import pytest

from eyas.errors import RemoteError
from eyas.remote.hosts import HostSpec
from eyas.remote.jobs import last_json_line
from tasks.jobs import _flow_run_tag, flow_job_id, run_remote_job


class _Logger:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, fmt: str, *args) -> None:
        self.lines.append(fmt % args)


def test_job_ids_carry_the_flow_run_or_say_local():
    assert re.fullmatch(r"merge-\d{8}T\d{6}-local-[0-9a-f]{8}", flow_job_id("merge"))
    run = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
    assert _flow_run_tag(run) == "fr123456789abc"


def test_a_job_streams_its_lines_and_on_line_may_render_them(tmp_path):
    spec = HostSpec.local(data_root=str(tmp_path))
    logger = _Logger()
    seen: list[str] = []

    def on_line(line: str) -> str | None:
        seen.append(line)
        return f"step {line[4:]}" if line.startswith("raw ") else None

    cmd = "echo hello; echo 'raw 1'; echo '{\"done\": true}'"
    job_id, lines = run_remote_job(spec, cmd, prefix="t", logger=logger, poll_interval=0.05,
                                   on_line=on_line)
    assert lines == seen == ["hello", "raw 1", '{"done": true}']
    login = spec.login
    assert logger.lines[1:] == [f"[{login}] hello", f"[{login}] step 1", f'[{login}] {{"done": true}}']
    assert logger.lines[0].startswith(f"started job {job_id} on {login}")
    assert last_json_line(lines) == {"done": True}
    assert last_json_line(["no json here"]) is None


def test_a_failed_job_names_host_job_code_and_log_tail(tmp_path):
    spec = HostSpec.local(data_root=str(tmp_path))
    with pytest.raises(RemoteError, match=r"exited with 3; log tail:\nbroken"):
        run_remote_job(spec, "echo broken; exit 3", prefix="t", logger=_Logger(),
                       poll_interval=0.05)
