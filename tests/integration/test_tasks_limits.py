"""tasks.limits: the task's side of `eyas.slots` -- pools named per host, the holder named by its
flow run and task, the wait logged by the task, SIGTERM ending a wait at once, and a holder
killed with SIGKILL leaving nothing taken. Holders are real processes; killed ones really get
SIGKILL."""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from support.paths import REPO
from support.slot_support import start_holder, stop_the_wait

from eyas.remote.hosts import HostSpec

HOLDER = """
import sys, time
from tasks.limits import ensure_pool, hold_slots
name = sys.argv[1]
ensure_pool(name, 1)
with hold_slots({name: 1}):
    print("held", flush=True)
    time.sleep(600)
"""


def _start_holder(name: str) -> subprocess.Popen:
    return start_holder([sys.executable, "-c", HOLDER, name], cwd=REPO,
                        env=dict(os.environ, PYTHONPATH=str(REPO)))


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def slot_log():
    """What `hold_slots` logs outside a flow run (logger ``eyas.slots``)."""
    logger, handler = logging.getLogger("eyas.slots"), _Lines()
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(old)


def test_pools_are_named_per_host_and_made_with_a_slot_per_gpu(slots_root):
    from tasks.limits import HOST_JOBS, gpu_pool_name, host_pool_name, host_slot, pool_size

    ssh = HostSpec(host="192.0.2.10", port=2222, num_gpus=8)
    assert (host_pool_name(ssh), gpu_pool_name(ssh)) == ("eyas-host-192.0.2.10-2222",
                                                         "eyas-gpu-192.0.2.10-2222")
    assert gpu_pool_name(HostSpec.local()) == "eyas-gpu-local"
    with host_slot(ssh, gpu=True):
        assert (slots_root / "eyas-gpu-192.0.2.10-2222" / "slot-7").exists()
    assert (pool_size(host_pool_name(ssh)), pool_size(gpu_pool_name(ssh))) == (HOST_JOBS, 8)
    assert pool_size("eyas-gpu-never-made") == 0


def test_a_killed_holder_leaves_no_slot_taken_the_next_run_takes_it_at_once(slot_log):
    from eyas.slots import holders, pool_dir
    from tasks.limits import hold_slots

    name = "eyas-test-killed-holder"
    holder = _start_holder(name)
    assert [h.pid for _, h in holders(pool_dir(name))] == [holder.pid]
    holder.send_signal(signal.SIGKILL)  # no finally block runs: the kernel frees the lock
    holder.wait()
    assert holders(pool_dir(name)) == []
    t0 = time.monotonic()
    with hold_slots({name: 1}):
        assert time.monotonic() - t0 < 1.0
    assert not [m for m in slot_log if m.startswith("waiting")], slot_log


_events: dict[str, threading.Event] = {}
_names: dict[str, str] = {}


def test_a_waiting_run_names_the_holders_flow_run_and_task_and_how_long_it_waits(
        prefect_client, slot_log):
    from prefect import flow, task
    from prefect.runtime import flow_run

    from tasks.limits import ensure_pool, hold_slots

    name = "eyas-test-waiting"
    ensure_pool(name, 1)
    _events.update(held=threading.Event(), release=threading.Event())

    @task(name="slot-holding-task")
    def holding_task() -> None:
        with hold_slots({name: 1}):
            _names["flow_run"] = flow_run.name
            _events["held"].set()
            _events["release"].wait(60)

    @flow(name="slot-holder")
    def holder_flow() -> None:
        holding_task()

    holding = threading.Thread(target=contextvars.copy_context().run, args=(holder_flow,),
                               daemon=True)
    holding.start()
    assert _events["held"].wait(60)
    threading.Timer(3.0, _events["release"].set).start()
    t0 = time.monotonic()
    with hold_slots({name: 1}, wait_log_s=1.0):
        waited = time.monotonic() - t0
    holding.join(30)
    assert waited >= 2.5
    lines = list(slot_log)
    waiting = [m for m in lines if m.startswith(f"waiting for 1 slot(s) of {name} ")]
    assert len(waiting) >= 2, lines  # repeated while it waits
    who = (f"{name} has 1/1 slot(s) in use, held by flow run {_names['flow_run']!r} (task "
           f"'slot-holding-task-")
    where = f" on host {socket.gethostname()}, pid {os.getpid()}, since "
    assert all(who in m and where in m for m in waiting), waiting
    assert waiting[0].startswith(f"waiting for 1 slot(s) of {name} (waited 0 s)")
    assert "(waited 1 s)" in waiting[1] or "(waited 2 s)" in waiting[1], waiting
    assert any(m.startswith(f"got 1 slot(s) of {name} after waiting") for m in lines), lines


def test_a_stop_ends_the_wait_for_a_slot_at_once_and_the_wait_names_the_holders_command(
        slot_log):
    """SIGTERM / Ctrl-C while a run waits for a GPU slot (`eyas.stopping.request`, what their
    handler and watcher call, from another thread as a flow's worker sees it): the wait ends
    within a second or two -- it used to go on until the 420 s backstop --, no slot is taken,
    and the holder keeps its own. The wait names the holder's command line (its workdir):
    the pool is shared by every run on the machine."""
    from eyas import stopping
    from eyas.slots import holders, pool_dir
    from tasks.limits import hold_slots

    name = "eyas-test-stop-while-waiting"
    holder = _start_holder(name)
    try:
        outcome, took = stop_the_wait(
            lambda: hold_slots({name: 1}, wait_log_s=1.0),
            lambda: any(m.startswith(f"waiting for 1 slot(s) of {name}") for m in slot_log),
            start_s=60)
        assert took < 3.0, f"{took:.1f} s from the stop to the end of the wait"
        assert len(outcome) == 1 and isinstance(outcome[0], stopping.StopRequested), outcome
        assert f"for 1 slot(s) of {name}" in str(outcome[0]) and outcome[0].exit_code == 143
        waiting = [m for m in slot_log if m.startswith(f"waiting for 1 slot(s) of {name}")]
        assert f"pid {holder.pid}, since " in waiting[0], waiting
        assert f"running `-c {name}`" in waiting[0], waiting  # the holder's command line
        assert [h.pid for _, h in holders(pool_dir(name))] == [holder.pid]  # still its own
    finally:
        holder.kill()
        holder.wait()
