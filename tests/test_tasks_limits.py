"""tasks.limits: slots held by a process that was killed come back to the next run, a run
waiting for a slot says what it waits for and who holds it, and the limits behave as Prefect's
do (missing or too small: an error, not a wait without end). Holders are real processes
against the session's Prefect test server; killed ones really get SIGKILL."""

from __future__ import annotations

import contextvars
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eyas.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent

HOLDER = """
import sys, time
from tasks.limits import ensure_limit, hold_slots
name = sys.argv[1]
ensure_limit(name, 1)
with hold_slots([name]):
    print("held", flush=True)
    time.sleep(600)
"""


def _api_env() -> dict[str, str]:
    """This process's environment, pointed at the session's Prefect test server."""
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value(), PYTHONPATH=str(REPO))
    env.pop("PREFECT__SERVER_EPHEMERAL", None)
    return env


def _start_holder(name: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, name], cwd=REPO, env=_api_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "held":
        proc.kill()
        raise AssertionError(f"the holder did not take the slot: {line!r} {proc.stderr.read()}")
    return proc


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


def _in_thread(fn, seconds: float) -> tuple[bool, list]:
    """Run `fn` in a daemon thread (in this context: same test server); ``(finished, result)``."""
    out: list = []
    ctx = contextvars.copy_context()
    thread = threading.Thread(target=ctx.run, args=(lambda: out.append(fn()),), daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), out


def test_the_slot_of_a_killed_holder_comes_back_to_the_next_run(prefect_client, slot_log):
    from tasks.limits import hold_slots

    name = "eyas-test-killed-holder"
    holder = _start_holder(name)
    assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 1
    holder.send_signal(signal.SIGKILL)  # no finally block runs: the slot stays taken
    holder.wait()
    assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 1

    def take() -> float:
        t0 = time.monotonic()
        with hold_slots([name], wait_log_s=1.0):
            return time.monotonic() - t0

    finished, waited = _in_thread(take, 60)
    assert finished, "the next run still waits for the dead holder's slot"
    assert waited[0] < 30
    gave_back = [m for m in slot_log if "gave back" in m]
    assert len(gave_back) == 1 and f"pid {holder.pid}" in gave_back[0], gave_back
    assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 0


_events: dict[str, threading.Event] = {}
_names: dict[str, str] = {}


def test_a_waiting_run_says_which_limit_who_holds_it_and_how_long(prefect_client, slot_log):
    from prefect import flow
    from prefect.runtime import flow_run

    from tasks.limits import ensure_limit, hold_slots

    name = "eyas-test-waiting"
    ensure_limit(name, 1)
    _events.update(held=threading.Event(), release=threading.Event())

    @flow(name="slot-holder")
    def holder_flow() -> None:
        with hold_slots([name]):
            _names["flow_run"] = flow_run.name
            _events["held"].set()
            _events["release"].wait(60)

    holding = threading.Thread(target=contextvars.copy_context().run, args=(holder_flow,),
                               daemon=True)
    holding.start()
    assert _events["held"].wait(60)
    threading.Timer(3.0, _events["release"].set).start()
    t0 = time.monotonic()
    with hold_slots([name], wait_log_s=1.0):
        waited = time.monotonic() - t0
    holding.join(30)
    assert waited >= 2.5
    lines = list(slot_log)
    waiting = [m for m in lines if m.startswith(f"waiting for 1 slot(s) of {name} ")]
    assert len(waiting) >= 2, lines  # repeated while it waits
    import socket

    who = (f"{name} has 1/1 slot(s) in use, held by flow run {_names['flow_run']!r} on "
           f"host {socket.gethostname()}, pid {os.getpid()}, since ")
    assert all(who in m for m in waiting), waiting
    assert waiting[0].startswith(f"waiting for 1 slot(s) of {name} (waited 0 s)")
    assert "(waited 1 s)" in waiting[1] or "(waited 2 s)" in waiting[1], waiting
    assert any(m.startswith(f"got 1 slot(s) of {name} after waiting") for m in lines), lines
    assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 0


def test_slots_held_with_no_record_are_named_with_the_way_to_free_them(prefect_client):
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    from tasks.limits import ensure_limit, waiting_text

    name = "eyas-test-unrecorded"
    ensure_limit(name, 1)
    # What a server that forgot a dead holder's lease leaves: a count and nobody behind it.
    prefect_client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(active_slots=1))
    text = waiting_text(prefect_client, [name], 1, 75)
    assert text.startswith(f"waiting for 1 slot(s) of {name} (waited 1 min 15 s): {name} has 1/1")
    assert "1 slot(s) held with no eyas record" in text
    assert f"prefect gcl update {name} --active-slots 0" in text


def test_a_missing_or_too_small_limit_is_an_error_not_an_endless_wait(prefect_client):
    from tasks.limits import ensure_limit, hold_slots

    with pytest.raises(ConfigError, match="eyas-test-never-created.*do not exist"):
        with hold_slots(["eyas-test-never-created"]):
            pass
    ensure_limit("eyas-test-small", 1)
    with pytest.raises(ConfigError, match="cannot take 2 slot"):
        with hold_slots(["eyas-test-small"], 2):
            pass
    assert prefect_client.read_global_concurrency_limit_by_name("eyas-test-small").active_slots == 0


def test_slots_no_lease_accounts_for_come_back_when_the_leases_are_on_disk(
        prefect_client, slot_log, tmp_path, monkeypatch):
    """The temporary server keeps every lease on disk. Of 3 slots in use -- one behind a live
    lease, one behind an expired lease (a holder that stopped renewing), one behind nothing (a
    holder killed before it recorded itself, or a server that forgot its lease) -- the expired
    lease is released and the two dead slots are freed; the live lease's slot is kept."""
    import json
    import uuid

    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    import tasks.limits
    from tasks.limits import ensure_limit, hold_slots
    from tasks.slot_holders import unaccounted_slots

    name = "eyas-test-orphaned"
    ensure_limit(name, 3)
    limit_id = str(prefect_client.read_global_concurrency_limit_by_name(name).id)
    prefect_client.update_global_concurrency_limit(
        name, GlobalConcurrencyLimitUpdate(active_slots=3))

    def lease(expiration: str) -> str:
        lease_id = str(uuid.uuid4())
        (tmp_path / f"{lease_id}.json").write_text(json.dumps({
            "id": lease_id, "resource_ids": [limit_id], "metadata": {"slots": 1},
            "expiration": expiration, "created_at": "2026-12-01T00:00:00+00:00"}))
        return lease_id

    lease("2999-01-01T00:00:00+00:00")
    expired = lease("2026-01-01T00:00:00+00:00")
    (tmp_path / "expirations.json").write_text("{}")
    assert unaccounted_slots(prefect_client, [name], tmp_path) == {name: 2}
    monkeypatch.setattr(tasks.limits, "leases_on_disk", lambda: tmp_path)

    def take() -> bool:
        with hold_slots([name], wait_log_s=1.0):
            return True

    finished, _ = _in_thread(take, 60)
    assert finished, "still waiting for slots no live lease accounts for"
    assert any(m.startswith(f"released lease {expired} of {name}") for m in slot_log), slot_log
    assert [m for m in slot_log if m.startswith("freed")] == [
        f"freed 2 slot(s) of {name} that no lease accounts for (a holder that died before "
        "recording itself, or a server that forgot its lease)"], slot_log
    # The live lease's slot is still counted once the taker gave its own back.
    assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 1


def test_a_stop_ends_the_wait_for_a_slot_at_once_and_the_wait_names_the_holders_command(
        prefect_client, slot_log):
    """SIGTERM / Ctrl-C while a run waits for a GPU slot (`eyas.stopping.request`, what their
    handler and watcher call, from another thread as a flow's worker sees it): the wait ends
    within a second or two -- it used to go on until the 420 s backstop --, no slot is taken,
    and the holder keeps its own. The wait names the holder's command line (its workdir):
    the limit is shared by every run on the machine."""
    from eyas import stopping
    from tasks.limits import hold_slots

    name = "eyas-test-stop-while-waiting"
    holder = _start_holder(name)
    try:
        outcome: list = []

        def wait() -> None:
            try:
                with hold_slots([name], wait_log_s=1.0):
                    outcome.append("took the slot")
            except stopping.StopRequested as exc:
                outcome.append(exc)

        ctx = contextvars.copy_context()
        thread = threading.Thread(target=ctx.run, args=(wait,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not any(m.startswith(f"waiting for 1 slot(s) of {name}") for m in slot_log):
            assert time.monotonic() < deadline, slot_log
            time.sleep(0.05)
        try:
            asked = time.monotonic()
            stopping.request(signal.SIGTERM)
            thread.join(30)
            took = time.monotonic() - asked
        finally:
            stopping.reset()
        assert not thread.is_alive(), "still waiting after the stop"
        assert took < 3.0, f"{took:.1f} s from the stop to the end of the wait"
        assert len(outcome) == 1 and isinstance(outcome[0], stopping.StopRequested), outcome
        assert f"for 1 slot(s) of {name}" in str(outcome[0]) and outcome[0].exit_code == 143
        waiting = [m for m in slot_log if m.startswith(f"waiting for 1 slot(s) of {name}")]
        assert f"pid {holder.pid}, since " in waiting[0], waiting
        assert f"running `-c {name}`" in waiting[0], waiting  # the holder's command line
        assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 1
    finally:
        holder.kill()
        holder.wait()
