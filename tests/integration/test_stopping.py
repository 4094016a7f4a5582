"""Stopping cleanly (`eyas.stopping`): the signal handling in a process of its own, and SIGTERM
sent to a real ``eyas train`` mid-training, to its whole process group as ``timeout`` and
container runtimes do -- the exit status and its line, the time it took, no process left
behind (training, the temporary Prefect server), and a rerun that resumes from the step it
saved and finishes."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from support.fault_drill import drill_env
from support.paths import REPO
from support.terminal import as_in_a_terminal
from support.train_fixtures import merged_run, recipe

MECHANICS = textwrap.dedent("""
    import os, signal, sys, time
    from eyas import stopping

    def kill_self():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)  # the handler runs before this ends

    stopping.install()
    # In code that checks at its boundaries, a first SIGTERM only asks; a second raises.
    with stopping.deferred():
        kill_self()
        print("asked", stopping.requested())
        try:
            kill_self()
            print("second: not raised")
        except stopping.StopRequested as exc:
            print("second raised", exc.exit_code)
    stopping.reset()
    # Elsewhere the first one raises.
    try:
        kill_self()
    except stopping.StopRequested as exc:
        print("raised", exc.exit_code)
    stopping.reset()
    # Under another handler (Prefect's own, while a flow runs) the request is still seen.
    class Termination(BaseException):
        pass

    def prefect_like(signum, frame):
        raise Termination

    signal.signal(signal.SIGTERM, prefect_like)
    try:
        kill_self()
    except Termination:
        pass
    deadline = time.monotonic() + 5
    while stopping.requested() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    print("under another handler", stopping.requested())
""")


def test_signals_ask_at_boundaries_raise_elsewhere_and_are_seen_under_any_handler():
    out = subprocess.run([sys.executable, "-c", MECHANICS], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["asked 15", "second raised 143", "raised 143",
                                       "under another handler 15"], out.stdout + out.stderr
    assert "stopping at the next step boundary" in out.stderr


WATCH_ONLY = textwrap.dedent("""
    import os, signal, threading, time
    from eyas import stopping

    class Termination(BaseException):
        pass

    def prefect_like(signum, frame):
        raise Termination

    signal.signal(signal.SIGTERM, prefect_like)  # a deployment's flow-run process: Prefect's
    assert stopping.watch() and stopping.watch()  # idempotent; installs no handler
    assert signal.getsignal(signal.SIGTERM) is prefect_like
    seen = []
    worker = threading.Thread(target=lambda: seen.append(stopping.wait(60)))
    worker.start()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)
    except Termination:
        pass
    worker.join(10)
    print("worker saw", seen, stopping.requested())
""")


def test_watch_lets_worker_threads_see_a_signal_that_prefects_handler_takes():
    """The flows call `stopping.watch`: a cancelled deployment run's SIGTERM meets Prefect's
    handler in the main thread, and the tasks' threads still learn of it."""
    out = subprocess.run([sys.executable, "-c", WATCH_ONLY], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "worker saw [True] 15", out.stdout + out.stderr


RUN_MAIN = textwrap.dedent("""
    import atexit, sys, time
    from eyas.stopping import run_main

    class Finalized:
        def __del__(self):  # runs in the interpreter's finalization, which a stop skips
            print("finalized", flush=True)

    FINALIZED = Finalized()
    atexit.register(print, "atexit ran", flush=True)

    def main():
        try:
            print("working", flush=True)
            time.sleep(60 if sys.argv[1] == "stop" else 0)
            return 0
        finally:
            print("cleaned up", flush=True)

    sys.exit(run_main(main, "demo"))
""")


def test_an_entry_point_under_run_main_unwinds_on_sigterm_and_exits_143():
    """``python -m eyas.extract.run`` / ``eyas.prepare`` / ``eyas.evaluate.run`` on a host: a
    SIGTERM runs their ``finally`` blocks (an extraction shuts its engines down), then the
    wind-down of the ``eyas`` command: the ``atexit`` handlers, no finalization
    (`stopping.exit_now`), exit 143 with one line on stderr."""
    proc = subprocess.Popen([sys.executable, "-c", RUN_MAIN, "stop"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "working"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and out.split() == ["cleaned", "up", "atexit", "ran"], out
    assert err.strip() == "demo: stopped by SIGTERM"


def test_an_entry_point_under_run_main_that_finishes_exits_as_an_interpreter_does():
    """The control of the test above: a run that is not stopped is finalized as usual."""
    out = subprocess.run([sys.executable, "-c", RUN_MAIN, "finish"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.split() == ["working", "cleaned", "up", "atexit", "ran", "finalized"]


def test_run_main_without_signals_returns_the_stop_s_exit_code(capsys):
    """A caller that is not the program (this test) gets the code back, its process kept."""
    from eyas.stopping import StopRequested, run_main

    def main() -> int:
        raise StopRequested(signal.SIGINT)

    assert run_main(main, "demo", signals=False) == 130
    assert capsys.readouterr().err == "demo: stopped by SIGINT\n"


def test_python_m_eyas_extract_run_stopped_by_sigterm_exits_143_with_its_line(tmp_path):
    """The entry point a GPU host runs for a shard job, stopped after its first shard (as
    cancelling the job does): exit 143, its one line last on stderr, no traceback; the shard
    finished before the stop is complete, and not every shard was made."""
    from support.extract_fixtures import build_llama, write_merged

    from eyas.extract.config import ExtractConfig
    from eyas.extract.run import command
    from eyas.extract.store import list_shards

    model = build_llama(tmp_path / "llama")
    merged = write_merged(tmp_path / "merged" / "train.jsonl", 2000)
    out = tmp_path / "hidden" / "train"
    cfg = ExtractConfig(shard_size=4, batch_tokens=256, device="cpu")
    cmd = command(sys.executable, merged=str(merged), out=str(out), model=str(model), cfg=cfg)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(shlex.split(cmd), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        first = json.loads(proc.stdout.readline())  # a shard's event: the work is under way
        assert first.get("shard") or first.get("status"), first
        os.killpg(proc.pid, signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    lines = err.strip().splitlines()
    assert proc.returncode == 143, err
    assert lines[-1] == "extraction: stopped by SIGTERM", err
    assert "Traceback" not in err and err.count("stopped by SIGTERM") == 1, err
    assert 1 <= len(list_shards(out)) < 500


# -- SIGTERM to `eyas train` -------------------------------------------------------------------
STEPS = 12
STOP_BOUND_S = 60.0
"""How long the stopped command may take to exit: a liveness bound, not a benchmark (a step
and the checkpoint take a few seconds here)."""
_STEP = re.compile(r" - step\s+(\d+)\s")


def _logged_step(log: Path) -> int:
    return max((int(m) for m in _STEP.findall(log.read_text(errors="replace"))), default=0)


def _alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline())[:120])
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "ctrl-c"])
def test_one_signal_stops_eyas_train_at_a_step_checkpointed_and_a_rerun_resumes(
        tmp_path, tiny_target, sig):
    """One signal to the command's process group -- SIGTERM as `timeout` sends it, SIGINT as a
    terminal's Ctrl-C does -- stops it at a step boundary."""
    cfg = recipe(tmp_path, "tiny-sigterm", steps=STEPS, eval_every=1000, checkpoint_every=1000)
    workdir = merged_run(tmp_path, tiny_target)
    env = drill_env(tmp_path / "prefect")  # no PREFECT_API_URL: its own temporary server
    argv = [sys.executable, "-m", "eyas.cli", "train", "--config", str(cfg), "--workdir",
            str(workdir), "--online"]
    log = tmp_path / "first.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=as_in_a_terminal)
        try:
            deadline = time.monotonic() + 600
            while _logged_step(log) < 2:
                assert proc.poll() is None, f"ended before step 2:\n{log.read_text()}"
                assert time.monotonic() < deadline, f"no step 2 in 600 s:\n{log.read_text()}"
                time.sleep(0.1)
            children = psutil.Process(proc.pid).children(recursive=True)
            assert children, "no temporary Prefect server?"
            os.killpg(proc.pid, sig)  # as `timeout` and a terminal do: the command's group
            sent = time.monotonic()
            code = proc.wait(timeout=STOP_BOUND_S + 60)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text(errors="replace")
    assert code == 128 + sig, text[-3000:]
    assert took < STOP_BOUND_S, f"took {took:.0f} s to stop"
    last = [line for line in text.splitlines() if line.startswith("eyas train: ")]
    assert last == [f"eyas train: stopped by {sig.name}; stopped cleanly (the checkpoint "
                    "written at the step under way is kept): run the same command again to "
                    "resume"], text[-3000:]
    deadline = time.monotonic() + 10
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(children) == [], "left running after the stop"

    saved = json.loads((workdir / "drafter" / "checkpoint" / "meta.json").read_text())["step"]
    assert 2 <= saved < STEPS  # written by the stop: checkpoint_every is 1000
    assert f"training stopped at step {saved}, its checkpoint written" in text

    again = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    out = again.stdout + again.stderr
    assert f"resumed from {workdir / 'drafter' / 'checkpoint'} at step {saved}" in out
    assert f"training: resumed at step {STEPS}" in out
    history = json.loads((workdir / "drafter" / "history.json").read_text())
    assert [r["step"] for r in history if r["kind"] == "train"] == list(range(1, STEPS + 1))
    assert (workdir / "drafter" / "export" / "manifest.json").is_file()
