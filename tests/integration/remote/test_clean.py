"""Safe deletion: every guard, dry run, idempotence; on LocalHost and over SSH."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.disk import human_bytes
from eyas.errors import RemoteError
from eyas.remote.clean import CleanItem, execute_clean, is_within, plan_clean, refusal
from eyas.remote.hosts import HostSpec, LocalHost, SSHHost
from eyas.remote.jobs import cancel, start_job

ROOT = "/data"


def _item(path, real=None, kind="dir", target=None):
    return CleanItem(path, real or path, kind, 10, target)


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (_item("/data/old"), None),
        (_item("old", "/root/old"), "not an absolute path"),
        (_item("/data"), "data root itself"),
        (_item("/data/", "/data"), "data root itself"),
        (_item("/data/../etc", "/etc"), "outside data_root"),
        (_item("/database", "/database"), "outside data_root"),  # prefix, not a parent
        (_item("/data/l", "/data/l", "symlink", "/etc"), "symlink leading outside"),
        (_item("/data/l", "/data/l", "symlink", "/data/old"), "name the target itself"),
        (_item("/data/.eyas/jobs"), "job records"),
        (_item("/data/run"), "in use by the current run (/data/run/merged)"),  # contains it
        (_item("/data/run/merged/x"), "in use by the current run"),  # lies inside it
        (_item("/data/run/other"), None),
    ],
)
def test_refusal_guards_on_resolved_strings(item, reason):
    got = refusal(item, real_root=ROOT, in_use={"/data/run/merged": "the current run"})
    assert (got is None) if reason is None else (reason in got)


def test_is_within_and_human_bytes():
    assert is_within("/data/a", "/data") and is_within("/data", "/data/")
    assert not is_within("/data2", "/data") and is_within("/x", "/")
    assert human_bytes(999) == "999 B" and human_bytes(924_000_000_000) == "924.0 GB"


def _layout(base: Path) -> dict[str, Path]:
    root = base / "data"
    outside = base / "outside"
    (root / "runs" / "old" / "hidden_states").mkdir(parents=True)
    (root / "runs" / "old" / "hidden_states" / "0.pt").write_bytes(b"x" * 3000)
    (root / "runs" / "old" / "hidden_states" / "1.pt").write_bytes(b"y" * 2000)
    (root / "runs" / "new" / "merged").mkdir(parents=True)
    (root / "runs" / "new" / "merged" / "train.jsonl").write_text("{}\n")
    (root / "runs" / "jobdir").mkdir()
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    (root / "escape").symlink_to(outside)
    (root / "inner-link").symlink_to(root / "runs" / "old")
    return {"root": root, "outside": outside}


def _check_guards(host, base: Path) -> None:
    p = _layout(base)
    root, outside = p["root"], p["outside"]
    job = start_job(host, "sleep 60", job_id="user-job", cwd=str(root / "runs" / "jobdir"))
    try:
        wanted = [
            str(root / "runs" / "old" / "hidden_states"),  # the one allowed
            str(outside / "precious"),  # outside
            str(root / "runs" / ".." / ".." / "outside"),  # `..` escape
            str(root / "escape"),  # symlink leading out
            str(root / "escape" / "precious"),  # through a symlink
            str(root / "inner-link"),  # symlink inside
            str(root),  # the root itself
            str(root / "runs" / "new"),  # in use by the current run
            str(root / "runs" / "jobdir"),  # cwd of a running job
            str(root / "runs" / "gone"),  # absent: nothing to do
        ]
        plan = plan_clean(host, wanted, data_root=str(root),
                          in_use=[str(root / "runs" / "new" / "merged")])
        by_path = {i.path: i for i in plan.items}
        assert [i.path for i in plan.to_delete] == [wanted[0]]
        assert plan.bytes == 5000
        assert "outside data_root" in by_path[wanted[1]].refused
        assert "outside data_root" in by_path[wanted[2]].refused
        assert "symlink leading outside" in by_path[wanted[3]].refused
        assert "outside data_root" in by_path[wanted[4]].refused
        assert "name the target itself" in by_path[wanted[5]].refused
        assert "data root itself" in by_path[wanted[6]].refused
        assert "current run" in by_path[wanted[7]].refused
        assert "running job user-job" in by_path[wanted[8]].refused
        assert by_path[wanted[9]].kind == "absent" and by_path[wanted[9]].refused is None
        assert "5.0 kB" in plan.text()

        dry = execute_clean(host, plan)  # no confirm: nothing happens
        assert dry.dry_run and dry.bytes_freed == 5000
        assert (root / "runs" / "old" / "hidden_states" / "0.pt").exists()

        done = execute_clean(host, plan, confirm=True)
        assert done.deleted == [str(root / "runs" / "old" / "hidden_states")]
        assert done.bytes_freed == 5000
        assert not (root / "runs" / "old" / "hidden_states").exists()
        assert (outside / "precious").read_text() == "keep me"
        assert (root / "runs" / "new" / "merged" / "train.jsonl").exists()
        assert (root / "runs" / "jobdir").exists() and root.exists()

        again = execute_clean(host, plan_clean(host, wanted, data_root=str(root),
                                               in_use=[str(root / "runs" / "new" / "merged")]),
                              confirm=True)
        assert again.deleted == [] and again.bytes_freed == 0
    finally:
        cancel(host, job.job_id, grace=1)


def test_local_clean_guards_dry_run_idempotent(tmp_path):
    host = LocalHost(HostSpec(kind="local", data_root=str(tmp_path / "data"), known_hosts=None))
    _check_guards(host, tmp_path)


def test_plan_revalidates_before_deleting(tmp_path):
    p = _layout(tmp_path)
    host = LocalHost(HostSpec(kind="local", data_root=str(p["root"]), known_hosts=None))
    target = str(p["root"] / "runs" / "old" / "hidden_states")
    plan = plan_clean(host, [target])
    # Between plan and execution, a job starts using the folder.
    job = start_job(host, "sleep 60", job_id="late", uses=[target])
    try:
        report = execute_clean(host, plan, confirm=True)
        assert report.deleted == [] and "running job late" in report.refused[0][1]
        assert (p["root"] / "runs" / "old" / "hidden_states" / "0.pt").exists()
    finally:
        cancel(host, job.job_id, grace=1)


def test_a_parent_swapped_for_a_symlink_after_the_last_plan_deletes_nothing_outside(tmp_path,
                                                                                  monkeypatch):
    """The race: between the last plan and the deletion job, a folder on the path to delete
    (``runs/old``) is replaced by a symlink to a folder outside data_root that holds the same
    names. The job re-checks every component where it deletes: it refuses, and deletes
    nothing; outside data_root, everything is still there. (The swap is made by wrapping the
    job start, the only way to hit the window deterministically.)"""
    import shutil

    import eyas.remote.clean as clean

    p = _layout(tmp_path)
    host = LocalHost(HostSpec(kind="local", data_root=str(p["root"]), known_hosts=None))
    target = str(p["root"] / "runs" / "old" / "hidden_states")
    plan = plan_clean(host, [target])
    decoy = tmp_path / "outside" / "old"
    (decoy / "hidden_states").mkdir(parents=True)
    (decoy / "hidden_states" / "precious.pt").write_text("keep me")
    real_start = clean.start_job

    def swap_then_start(*args, **kwargs):
        shutil.rmtree(p["root"] / "runs" / "old")
        (p["root"] / "runs" / "old").symlink_to(decoy)
        return real_start(*args, **kwargs)

    monkeypatch.setattr(clean, "start_job", swap_then_start)
    with pytest.raises(RemoteError, match="changed since the plan"):
        execute_clean(host, plan, confirm=True)
    assert (decoy / "hidden_states" / "precious.pt").read_text() == "keep me"
    assert (tmp_path / "outside" / "precious").read_text() == "keep me"


@pytest.mark.ssh
def test_ssh_clean_guards_dry_run_idempotent(sshd, tmp_path):
    base = sshd.data_root.parent / "clean-case"
    base.mkdir()
    with SSHHost(sshd.spec(data_root=str(base / "data"))) as host:
        _check_guards(host, base)


_CLIENT = """
import json, sys
import eyas.remote.clean as clean
from eyas.remote.hosts import HostSpec, connect

slow = clean.deletion_script
clean.deletion_script = lambda paths: "sleep 3\\n" + slow(paths)  # time to kill this process
spec = HostSpec.model_validate(json.loads(sys.argv[1]))
with connect(spec) as host:
    plan = clean.plan_clean(host, [sys.argv[2]])
    clean.execute_clean(host, plan, confirm=True, say=print)
"""


@pytest.mark.ssh
def test_ssh_deletion_outlives_the_process_that_started_it(sshd, tmp_path):
    """`eyas clean --yes` deletes as a detached job: the client SIGKILLed mid-deletion (a
    dropped connection, a closed laptop) does not stop it halfway; a later clean waits for it
    and finds nothing left to do."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from eyas.remote.jobs import list_jobs

    from .helpers import wait_dead, wait_for

    base = sshd.data_root.parent / "clean-detached"
    base.mkdir()
    p = _layout(base)
    target = p["root"] / "runs" / "old" / "hidden_states"
    spec = sshd.spec(data_root=str(p["root"]))
    jobs = p["root"] / ".eyas" / "jobs"
    client = subprocess.Popen([sys.executable, "-c", _CLIENT, spec.model_dump_json(),
                               str(target)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: jobs.exists() and any((d / "pid").exists() for d in jobs.iterdir()),
                 60, "the deletion job starting")
        assert target.exists()  # the job sleeps first: nothing deleted yet
        os.kill(client.pid, signal.SIGKILL)
        assert wait_dead(client.pid)
    finally:
        client.kill()
        client.wait()
    wait_for(lambda: not target.exists(), 30, "the deletion finishing without its client")
    (job,) = [d for d in jobs.iterdir() if d.name.startswith("clean-")]
    wait_for(lambda: (job / "exit_code").exists(), 15, "the job's exit code")
    assert (job / "exit_code").read_text().strip() == "0"
    assert f"deleted {target}" in (job / "log").read_text()
    assert (p["outside"] / "precious").read_text() == "keep me"
    with SSHHost(spec) as host:
        assert [j.state for j in list_jobs(host)] == ["exited"]
        again = execute_clean(host, plan_clean(host, [str(target)]), confirm=True)
    assert again.deleted == [] and again.bytes_freed == 0
    json.dumps(again.plan.to_dict())
