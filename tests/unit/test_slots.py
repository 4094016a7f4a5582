"""eyas.slots: a slot is a flock the kernel frees -- a holder killed with SIGKILL leaves its slot
free for the very next taker --, a waiting run names the holders and how long it has waited,
a stop ends the wait at once, and pools are made once and never waited on in vain. Holders are
real processes holding real locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import REPO
from support.slot_support import start_holder, stop_the_wait

from eyas import stopping
from eyas.errors import ConfigError
from eyas.slots import (
    COMMAND_CHARS,
    SETTLE_S,
    Holder,
    command_line,
    duration,
    ensure_pool,
    hold,
    holders,
    is_held,
    main,
    pool_slots,
    try_take,
)

HOLDER = """
import sys, time
from pathlib import Path
from eyas.slots import hold
with hold({Path(sys.argv[1]): int(sys.argv[2])}, who="the test's holder"):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _start_holder(pool: Path, n: int = 1, seconds: float = 600) -> subprocess.Popen:
    return start_holder([sys.executable, "-c", HOLDER, str(pool), str(n), str(seconds)], cwd=REPO)


def test_a_holder_killed_with_sigkill_leaves_its_slot_free_for_the_next_taker(tmp_path):
    pool = ensure_pool("eyas-gpu-test", 1, tmp_path)
    holder = _start_holder(pool)
    assert [s.name for s, _ in holders(pool)] == ["slot-0"]
    assert try_take({pool: 1}, Holder.current()) is None  # held: nothing to take
    holder.send_signal(signal.SIGKILL)  # no finally block runs: only the kernel lets go
    holder.wait()
    assert not is_held(pool / "slot-0")
    t0 = time.monotonic()
    said: list[str] = []
    with hold({pool: 1}, say=said.append) as holding:
        assert holding.slots == [pool / "slot-0"]
        assert time.monotonic() - t0 < 1.0 and said == []  # no wait, nothing to repossess
        assert holders(pool)[0][1].pid != holder.pid
    assert holders(pool) == []


def test_a_waiting_run_names_the_holder_and_how_long_it_waits(tmp_path):
    pool = ensure_pool("eyas-gpu-test", 1, tmp_path)
    holder = _start_holder(pool, seconds=3.0)
    said: list[str] = []
    t0 = time.monotonic()
    with hold({pool: 1}, say=said.append, poll_s=0.2, wait_log_s=1.0):
        waited = time.monotonic() - t0
    holder.wait(30)
    assert waited >= 1.5, said
    waiting = [m for m in said if m.startswith("waiting for 1 slot(s) of eyas-gpu-test ")]
    assert len(waiting) >= 2, said  # repeated while it waits
    who = ("eyas-gpu-test has 1/1 slot(s) in use, held by the test's holder on host ")
    assert all(who in m and f", pid {holder.pid}, since " in m for m in waiting), waiting
    assert all("running `-c " in m for m in waiting), waiting  # the holder's command line
    assert waiting[0].startswith("waiting for 1 slot(s) of eyas-gpu-test (waited 0 s): ")
    assert "(waited 1 s)" in waiting[1] or "(waited 2 s)" in waiting[1], waiting
    assert said[-1].startswith("got 1 slot(s) of eyas-gpu-test after waiting "), said


def test_a_stop_ends_the_wait_for_a_slot_at_once_and_takes_nothing(tmp_path):
    """SIGTERM / Ctrl-C while a run waits for a slot (`eyas.stopping.request`, what their
    handler and watcher call, from another thread as a flow's worker sees it)."""
    pool = ensure_pool("eyas-gpu-test", 2, tmp_path)
    holder = _start_holder(pool, 2)
    try:
        said: list[str] = []
        outcome, took = stop_the_wait(lambda: hold({pool: 1}, say=said.append),
                                      lambda: bool(said), start_s=30)
        assert took < 1.5, f"{took:.1f} s from the stop to the end"
        assert len(outcome) == 1 and isinstance(outcome[0], stopping.StopRequested), outcome
        assert "for 1 slot(s) of eyas-gpu-test" in str(outcome[0]) and outcome[0].exit_code == 143
        assert "has 2/2 slot(s) in use" in said[0], said
        assert sorted(s.name for s, _ in holders(pool)) == ["slot-0", "slot-1"]  # the holder's
    finally:
        holder.kill()
        holder.wait()


def test_slots_of_several_pools_are_taken_all_at_once_or_not_at_all(tmp_path):
    host, gpu = ensure_pool("eyas-host-test", 2, tmp_path), ensure_pool("eyas-gpu-test", 1, tmp_path)
    holder = _start_holder(gpu)
    try:
        assert try_take({host: 1, gpu: 1}, Holder.current()) is None
        assert holders(host) == []  # the host slot it could take was let go
        holding = try_take({host: 2}, Holder.current())
        assert holding is not None and len(holders(host)) == 2
        holding.release()
        assert holders(host) == [] and (host / "slot-0").read_text() == ""
    finally:
        holder.kill()
        holder.wait()


def test_a_missing_or_too_small_pool_is_an_error_not_an_endless_wait(tmp_path):
    with pytest.raises(ConfigError, match="never-created.*do not exist"):
        with hold({tmp_path / "never-created": 1}):
            pass
    small = ensure_pool("small", 1, tmp_path)
    with pytest.raises(ConfigError, match="cannot take 2 slot\\(s\\) of small: it has 1"):
        with hold({small: 2}):
            pass
    with pytest.raises(ConfigError, match="one folder name"):
        ensure_pool("../elsewhere", 1, tmp_path)


def test_a_pool_is_made_once_and_resized_by_its_files(tmp_path):
    pool = ensure_pool("eyas-gpu-test", 3, tmp_path)
    assert [p.name for p in pool_slots(pool)] == ["slot-0", "slot-1", "slot-2"]
    assert ensure_pool("eyas-gpu-test", 8, tmp_path) == pool  # an existing pool stays as it is
    assert len(pool_slots(pool)) == 3
    (pool / "slot-2").unlink()  # an operator lowers it
    (pool / "notes.txt").write_text("not a slot")
    assert [p.name for p in pool_slots(pool)] == ["slot-0", "slot-1"]
    assert [p.name for p in tmp_path.iterdir()] == ["eyas-gpu-test"]  # no temporary left


def test_every_pool_and_holder_is_listed_for_a_person(tmp_path, capsys):
    pool = ensure_pool("eyas-gpu-test", 2, tmp_path)
    holder = _start_holder(pool)
    try:
        assert main([str(tmp_path)]) == 0
    finally:
        holder.kill()
        holder.wait()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "eyas-gpu-test: 1/2 slot(s) in use"
    assert out[1].startswith("  slot-0: the test's holder on host ") and f"pid {holder.pid}" in out[1]


def test_durations_read_as_a_person_says_them():
    assert duration(4.7) == "4 s"
    assert duration(432) == "7 min 12 s"
    assert duration(3 * 3600 + 300) == "3 h 05 min"


def test_a_holders_command_line_names_the_eyas_command_and_is_shortened():
    assert command_line(["/src/eyas/cli.py", "train", "--workdir", "/data/my run"]) == (
        "eyas train --workdir '/data/my run'")
    assert command_line(["/venv/bin/eyas", "extract"]) == "eyas extract"
    assert command_line(["/venv/bin/prefect", "worker", "start"]) == (
        "/venv/bin/prefect worker start")
    long = command_line(["eyas", "x" * 1000])
    assert len(long) == COMMAND_CHARS and long.endswith("...")


def test_a_slot_being_taken_or_given_back_is_read_as_it_settles(tmp_path):
    """A held slot whose file is empty (a holder between its lock and its record, or between
    emptying the file and letting go): `holders` reads it again until it settles, so a waiting
    run names the holder that comes, or leaves out the one that went."""
    import fcntl
    import json
    import os
    import threading
    from dataclasses import asdict

    pool = ensure_pool("eyas-gpu-test", 1, tmp_path)
    slot = pool / "slot-0"
    me = Holder.current()

    def locked_empty() -> int:
        fd = os.open(slot, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        return fd

    fd = locked_empty()  # taken, the record written 50 ms later
    threading.Timer(0.05, os.pwrite, (fd, json.dumps(asdict(me)).encode(), 0)).start()
    assert [(s.name, h.pid) for s, h in holders(pool)] == [("slot-0", me.pid)]
    os.close(fd)

    fd = locked_empty()  # emptied, let go 50 ms later
    threading.Timer(0.05, os.close, (fd,)).start()
    assert holders(pool) == []

    fd = locked_empty()  # held and never written: said so, after the settling time
    t0 = time.monotonic()
    assert holders(pool) == [(slot, None)]
    assert time.monotonic() - t0 >= SETTLE_S
    os.close(fd)


def test_a_wait_says_nothing_of_a_pool_whose_slots_came_free(tmp_path):
    """Given back between a try and the wait's message: no message (the run tries again)."""
    from eyas.slots import waiting_text

    pool = ensure_pool("eyas-gpu-test", 1, tmp_path)
    assert waiting_text({pool: 1}, 2.0) is None
    with hold({pool: 1}, say=lambda _: None):
        text = waiting_text({pool: 1}, 2.0)
    assert text.startswith("waiting for 1 slot(s) of eyas-gpu-test (waited 2 s): ")
    assert f"pid {os.getpid()}" in text
