"""Every flow holds the run folder's lock (`eyas.workdir_lock`) for its run, under the
session's Prefect test server: a folder held by another process (a real flock in a real
process) is refused naming the holder, by each of the six flows a deployment runs; a hold in
this process -- what ``eyas <command>`` does before it runs the flow in process -- is
re-entered; a holder killed with SIGKILL leaves the folder free."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from support.sshd_fixtures import sshd  # noqa: F401
from support.train_fixtures import merged_run, recipe

from eyas.errors import DataError
from eyas.workdir_lock import WorkdirBusy, workdir_lock

pytestmark = [pytest.mark.slow]

HOLD = ("import sys, time; from pathlib import Path; from eyas.workdir_lock import workdir_lock\n"
        "with workdir_lock(Path(sys.argv[1]), 'eyas train'):\n"
        "    print('held', flush=True); time.sleep(600)")
TRY = ("import sys; from pathlib import Path; from eyas.workdir_lock import workdir_lock, WorkdirBusy\n"
       "try:\n"
       "    with workdir_lock(Path(sys.argv[1]), 'probe'): print('free')\n"
       "except WorkdirBusy as exc: print('busy', exc)")


def holder(workdir) -> subprocess.Popen:
    """Another process holding `workdir`'s lock (as ``eyas train``), once it said so."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def from_another_process(workdir) -> str:
    """What another process finds: ``free`` (it took the lock and let it go) or ``busy ...``."""
    return subprocess.run([sys.executable, "-c", TRY, str(workdir)], capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()


def flow_call(name: str):
    from flows.evaluate import evaluate_drafter_flow
    from flows.extract import extract_hidden_states
    from flows.pipeline import run_pipeline
    from flows.preflight import preflight_flow
    from flows.prepare import prepare_data
    from flows.train import train_drafter_flow

    return {"eyas-pipeline": run_pipeline, "prepare-data": prepare_data,
            "preflight": preflight_flow, "extract-hidden-states": extract_hidden_states,
            "train-drafter": train_drafter_flow, "evaluate-drafter": evaluate_drafter_flow}[name]


@pytest.mark.parametrize("name", ["eyas-pipeline", "prepare-data", "preflight",
                                  "extract-hidden-states", "train-drafter", "evaluate-drafter"])
def test_each_flow_refuses_a_folder_another_process_holds_naming_it(tmp_path, name,
                                                                    prefect_harness):
    cfg = recipe(tmp_path, "tiny-lock")
    workdir = tmp_path / "run"
    proc = holder(workdir)
    try:
        with pytest.raises(WorkdirBusy, match=rf"pid {proc.pid}: eyas train, since "):
            flow_call(name)(str(cfg), str(workdir))
        assert not (workdir / "merged").exists() and not (workdir / "logs").exists()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert from_another_process(workdir) == "free"  # no stale lock after a kill -9


def test_a_hold_in_this_process_is_reentered_and_the_outer_one_releases(
        tmp_path, tiny_target, prefect_harness):
    """As ``eyas evaluate`` does: the lock held, then the flow run in this process. The flow
    gets past the lock (it fails on the missing drafter, as it does unlocked) and leaves the
    outer hold in place; only its end frees the folder."""
    from flows.evaluate import evaluate_drafter_flow

    cfg = recipe(tmp_path, "tiny-lock-nested")
    workdir = merged_run(tmp_path, tiny_target)
    with workdir_lock(workdir, "eyas evaluate"):
        with pytest.raises(DataError, match=r"drafter/export"):
            evaluate_drafter_flow(str(cfg), str(workdir))
        busy = from_another_process(workdir)
        assert busy.startswith("busy") and "eyas evaluate" in busy, busy
    assert from_another_process(workdir) == "free"
    with pytest.raises(DataError, match=r"drafter/export"):  # the flow alone: taken, then freed
        evaluate_drafter_flow(str(cfg), str(workdir))
    assert from_another_process(workdir) == "free"


# After the flow tests above, which ran without capsys (Prefect's console handler is bound to
# the stream of the first flow run's test).
def test_the_eyas_command_runs_its_flow_under_its_own_lock(tmp_path, tiny_target,
                                                            prefect_harness, capsys):
    from eyas.cli import main

    cfg = recipe(tmp_path, "tiny-lock-cli")
    workdir = merged_run(tmp_path, tiny_target)
    assert main(["evaluate", "--config", str(cfg), "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert "drafter/export" in err and "in use by another eyas run" not in err
    assert from_another_process(workdir) == "free"


HOLD_ON_HOST = (
    "import sys, time; from eyas.remote.hosts import HostSpec\n"
    "from eyas.remote.workdir_lock import host_workdir_lock\n"
    "with host_workdir_lock(HostSpec.model_validate_json(sys.argv[2]), sys.argv[1], 'eyas train'):\n"
    "    print('held', flush=True); time.sleep(600)")


def wait_free(workdir, seconds: float = 30.0) -> str:
    """What another process finds, polled until ``free`` or `seconds` have passed."""
    import time

    deadline = time.monotonic() + seconds
    while (found := from_another_process(workdir)) != "free" and time.monotonic() < deadline:
        time.sleep(0.5)
    return found


@pytest.mark.ssh
def test_a_folder_on_an_ssh_host_is_locked_there_for_the_flow_run(tmp_path, prefect_client,
                                                                  sshd):  # noqa: F811
    """Over SSH the lock is the host's ``<workdir>/.eyas-lock`` (this test's host shares the
    filesystem, so a local lock of the folder meets it), held through an SSH channel: a flow
    run on a folder that another process holds there is refused naming it (its pid and
    machine); the holder killed with SIGKILL, its connection closes and the host frees it."""
    import socket

    from blocks.gpu_host import GpuHost
    from eyas.remote.workdir_lock import host_workdir_lock
    from flows.train import train_drafter_flow

    spec = sshd.spec()
    GpuHost(**spec.model_dump()).save("test-sshd-lock", overwrite=True)
    cfg = recipe(tmp_path, "tiny-lock-ssh")
    workdir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", HOLD_ON_HOST, str(workdir),
                             spec.model_dump_json()], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        busy = from_another_process(workdir)  # the same file as a local lock's
        assert busy.startswith("busy") and f"pid {proc.pid}: eyas train from " in busy, busy
        with pytest.raises(WorkdirBusy, match=rf"{spec.login}:{workdir} is in use by another "
                           rf"eyas run \(pid {proc.pid}: eyas train from "
                           rf"{socket.gethostname()}, since "):
            train_drafter_flow(str(cfg), str(workdir), host_block="test-sshd-lock")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert wait_free(workdir) == "free"  # the host saw the connection close

    with host_workdir_lock(spec, str(workdir), "eyas train"):
        with host_workdir_lock(spec, str(workdir), "flow train-drafter"):  # re-entered
            pass
        assert from_another_process(workdir).startswith("busy")  # the outer hold stands
    assert from_another_process(workdir) == "free"  # released when the block ended
