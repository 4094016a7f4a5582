"""tasks.slot_holders: telling whether a recorded process still runs (real processes of this
machine), the record's round trip through a Prefect Variable, and reclaiming a dead holder's
slots exactly once even when two runs try at the same time."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading

import pytest

from tasks.slot_holders import (
    ProcessRef,
    SlotHolder,
    duration,
    read_holders,
    reclaim_dead,
    write_record,
)


def _exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_this_process_runs_and_an_exited_one_is_gone():
    me = ProcessRef.current()
    assert me.is_gone() is False
    assert dataclasses.replace(me, pid=_exited_pid()).is_gone() is True


def test_a_reused_pid_is_not_taken_for_the_recorded_process():
    me = ProcessRef.current()
    if me.started is None:
        pytest.skip("no /proc here: process start times are not known")
    # Same pid, another start time: the recorded process ended and the pid went to another one.
    assert dataclasses.replace(me, started=me.started - 1).is_gone() is True


def test_a_reboot_ends_every_recorded_process_and_other_machines_are_not_judged():
    me = ProcessRef.current()
    if me.boot_id is None:
        pytest.skip("no boot id here")
    assert dataclasses.replace(me, boot_id="another-boot").is_gone() is True
    assert dataclasses.replace(me, host=me.host + "-elsewhere").is_gone() is None
    assert dataclasses.replace(me, pid_ns="pid:[1]").is_gone() is None  # another container


def test_durations_read_as_a_person_says_them():
    assert duration(4.7) == "4 s"
    assert duration(432) == "7 min 12 s"
    assert duration(3 * 3600 + 300) == "3 h 05 min"


def _holder(lease_id: str, limit: str, process: ProcessRef) -> SlotHolder:
    return SlotHolder(lease_id=lease_id, limits=[limit], occupy=1, process=process,
                      since="2026-01-02T03:04:05+00:00", flow_run_id=None,
                      flow_run_name="fast-fox", task_run_name="train-drafter-offline")


def _take(client, name: str) -> str:
    resp = client.increment_concurrency_slots_with_lease(
        names=[name], slots=1, mode="concurrency", lease_duration=300)
    return resp.json()["lease_id"]


def test_a_dead_holders_slot_is_given_back_once_even_by_two_runs_at_a_time(prefect_client):
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    name = "eyas-test-reclaim-once"
    prefect_client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=2))
    live = _holder(_take(prefect_client, name), name, ProcessRef.current())
    dead = _holder(_take(prefect_client, name), name,
                   dataclasses.replace(ProcessRef.current(), pid=_exited_pid()))
    write_record(prefect_client, live)
    write_record(prefect_client, dead)
    assert {h.lease_id for h in read_holders(prefect_client, [name])} == {live.lease_id, dead.lease_id}
    assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 2

    from prefect.client.orchestration import get_client

    results: list[list[SlotHolder]] = []

    def reclaim() -> None:
        with get_client(sync_client=True) as client:
            results.append(reclaim_dead(client, [name]))

    # Each thread runs in a copy of this context, so it reaches the same test server.
    import contextvars

    threads = [threading.Thread(target=contextvars.copy_context().run, args=(reclaim,))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(len(r) for r in results) == [0, 1]  # one claimant, not two
    freed = next(r for r in results if r)[0]
    assert freed.lease_id == dead.lease_id and freed.flow_run_name == "fast-fox"
    # Exactly one slot came back: the live holder's is still counted.
    assert prefect_client.read_global_concurrency_limit_by_name(name).active_slots == 1
    assert [h.lease_id for h in read_holders(prefect_client, [name])] == [live.lease_id]
    assert reclaim_dead(prefect_client, [name]) == []  # the live one is left alone
    prefect_client.release_concurrency_slots_with_lease(lease_id=live.lease_id)


def test_a_holders_command_line_names_the_eyas_command_and_is_shortened():
    """What a waiting run shows of the holder: its command as a person typed it (which
    workdir: the GPU limit is shared by every run on the machine)."""
    from tasks.slot_holders import COMMAND_CHARS, command_line

    assert command_line(["/src/eyas/cli.py", "train", "--workdir", "/data/my run"]) == (
        "eyas train --workdir '/data/my run'")
    assert command_line(["/venv/bin/eyas", "extract"]) == "eyas extract"
    assert command_line(["/venv/bin/prefect", "worker", "start"]) == (
        "/venv/bin/prefect worker start")
    long = command_line(["eyas", "x" * 1000])
    assert len(long) == COMMAND_CHARS and long.endswith("...")
