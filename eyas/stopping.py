"""Stopping cleanly on SIGTERM and Ctrl-C: one stop request per process, honoured at safe points.

`install` (called in the main thread of an entry point: the ``eyas`` command, ``python -m
eyas.train.run``) makes SIGTERM and SIGINT *request* a stop, and raise `StopRequested` (a
`KeyboardInterrupt`) in the main thread. Signals reach the main thread only; the work of a
Prefect flow runs in its task runner's worker threads, and Prefect waits for them before the
flow ends. So each long-running loop asks `requested` (or calls `check`) at its own safe
points, and stops there:

- the trainer at each step boundary, after writing its checkpoint (`eyas.train.trainer`);
- `eyas.remote.jobs.attach` at each poll, cancelling the job it follows;
- an SSH command while it waits (`eyas.remote.hosts.SSHHost`), closing its channel, which
  makes the host stop the command;
- `eyas.train.launch.run_child`, sending SIGTERM to its child (which checkpoints itself);
- the extraction after each forward batch, abandoning the shard under way (`eyas.extract.shards`);
- phase 1 every `eyas.prepare.generate.STOP_POLL_S`, abandoning the answers in flight;
- tokenization per batch, the evaluation per generation, a check of preflight
  (`eyas.preflight.proc`), a starting `transformers serve`, a wait for a concurrency slot
  (`eyas.slots`) or a device.

docs/stopping.md says what each command keeps. The flows call `watch` (a deployment's flow
run has no ``eyas`` entry point: Prefect's handler runs, the watcher still sees the signal).

Clean-up that must still run (`eyas.remote.jobs.cancel`, removing temporary files) runs
`shielded`. In code that checks at its boundaries (`deferred`, main thread), the first signal
only requests the stop; a second one raises at once. While Prefect runs a flow it installs its
own SIGTERM handler (raising its ``TerminationSignal``); a wakeup fd (`signal.set_wakeup_fd`)
tells a watcher thread of every signal whichever handler runs, so the worker threads still
learn of it.

An entry point that caught `StopRequested` prints one line and returns `StopRequested.exit_code`
(128 + the signal: 143 for SIGTERM, 130 for Ctrl-C; `run_main` does it for a plain ``main``);
`exit_within` bounds the time the interpreter may then take to wind down, and
``install(deadline_s=...)`` the whole stop. `exit_now` is that wind-down for an entry point's
main thread: what the interpreter runs at exit (its threads joined, the workers that flush
Prefect's events and logs, ``atexit``: servers stopped, log files flushed), then the exit,
without the interpreter's finalization -- a garbage collection of every module (torch,
transformers, Prefect), seconds of CPU on a loaded machine, that a stop need not wait for.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that request a stop (what `timeout`, systemd, container runtimes, schedulers and
Ctrl-C send)."""

_requested = threading.Event()
_signum: int | None = None
_handled = 0
_deferring = 0
_watcher: threading.Thread | None = None
_local = threading.local()
_deadline_s: float | None = None


class StopRequested(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM, Ctrl-C); raised where the work stops."""

    def __init__(self, signum: int = signal.SIGTERM, detail: str = "") -> None:
        self.signum = int(signum)
        self.detail = detail
        super().__init__(f"stopped by {signal_name(self.signum)}" + (f": {detail}" if detail else ""))

    @property
    def exit_code(self) -> int:
        """128 + the signal, as a shell reports a process that a signal ended."""
        return 128 + self.signum


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def request(signum: int = signal.SIGTERM) -> None:
    """Ask every loop of this process to stop at its next safe point (the first request's
    signal is kept)."""
    global _signum
    if not _requested.is_set():
        _signum = int(signum)
        _requested.set()
        if _deadline_s is not None:
            exit_within(_deadline_s, 128 + _signum, f"{signal_name(_signum)} came")


def requested() -> int | None:
    """The signal of the stop request, None when no stop was requested."""
    return _signum if _requested.is_set() else None


def check(detail: str = "") -> None:
    """Raise `StopRequested` when a stop was requested (a safe point), except in a `shielded`
    block of this thread."""
    signum = requested()
    if signum is not None and not getattr(_local, "shielded", 0):
        raise StopRequested(signum, detail)


def wait(timeout: float) -> bool:
    """Sleep up to `timeout` seconds, waking early on a stop request; True when one came (never
    in a `shielded` block: there it sleeps the whole time)."""
    if getattr(_local, "shielded", 0):
        time.sleep(timeout)
        return False
    return _requested.wait(timeout)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Clean-up that must run after a stop request (cancelling a job, stopping a server):
    inside, this thread's `check` does not raise and `wait` sleeps."""
    _local.shielded = getattr(_local, "shielded", 0) + 1
    try:
        yield
    finally:
        _local.shielded -= 1


def reset() -> None:
    """Forget the stop request (tests that run several stops in one process)."""
    global _signum, _handled
    _requested.clear()
    _signum, _handled = None, 0


def _on_signal(signum: int, frame: object) -> None:
    global _handled
    request(signum)
    _handled += 1
    if _deferring and _handled == 1:
        print(f"{signal_name(signum)}: stopping at the next step boundary, after a checkpoint "
              "(send it again to stop at once)", file=sys.stderr, flush=True)
        return
    raise StopRequested(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside, in the main thread, a first SIGTERM/SIGINT only requests the stop: the code
    checks `requested` at its boundaries (the training loop). Elsewhere: no effect."""
    global _deferring
    main = threading.current_thread() is threading.main_thread()
    if main:
        _deferring += 1
    try:
        yield
    finally:
        if main:
            _deferring -= 1


def install(signals: tuple[int, ...] = STOP_SIGNALS, *, deadline_s: float | None = None) -> bool:
    """Make `signals` request a stop and raise `StopRequested` in the main thread; start the
    watcher that sees them under any handler. A signal ignored at start (``nohup``, a
    background job) stays ignored. With `deadline_s`, the process exits (128 + the signal) at
    the latest that many seconds after the first request, whatever still runs (a backstop).
    False, doing nothing, outside the main thread."""
    global _deadline_s
    if threading.current_thread() is not threading.main_thread():
        return False
    _deadline_s = deadline_s
    for sig in signals:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _on_signal)
    _watch(signals)
    return True


def watch(signals: tuple[int, ...] = STOP_SIGNALS) -> bool:
    """Learn of `signals` whichever handler runs them, installing none: the process of a
    deployment's flow run (Prefect's own, whose SIGTERM handler a cancellation meets) then
    stops its worker threads' work as the ``eyas`` command does. Idempotent; False, doing
    nothing, outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    _watch(signals)
    return True


def _watch(signals: tuple[int, ...]) -> None:
    """Every signal with a Python handler writes its number to the wakeup fd, whichever
    handler then runs (Prefect's own during a flow): the thread reading it requests the stop."""
    global _watcher
    if _watcher is not None and _watcher.is_alive():
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main thread after all
        os.close(r)
        os.close(w)
        return
    if previous != -1:  # someone else reads them (an asyncio loop): leave it theirs
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        return
    wanted = {int(s) for s in signals}

    def read() -> None:
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in wanted:
                    request(signum)

    _watcher = threading.Thread(target=read, name="eyas-stop-watcher", daemon=True)
    _watcher.start()


def exit_within(seconds: float, code: int, since: str = "stopped") -> None:
    """Make sure this process ends within `seconds`: after them, `os._exit(code)` (threads
    that still wind down, an API that no longer answers, are not waited for)."""

    def force() -> None:
        print(f"eyas: still winding down {seconds:g} s after {since}; exiting now ({code})",
              file=sys.stderr, flush=True)
        os._exit(code)

    timer = threading.Timer(seconds, force)
    timer.daemon = True
    timer.start()


def exit_now(code: int) -> None:
    """End this process with `code` as an interpreter's exit does, less its finalization: join
    the other non-daemon threads and run what ``threading`` runs at exit (Prefect's event and
    log workers drain there, into a server that still runs), then the ``atexit`` handlers (a
    temporary Prefect server stopped, log handlers flushed and closed), flush stdout and
    stderr, and ``os._exit(code)``. Finalization -- tearing down every module, a full garbage
    collection of the heap -- is skipped: seconds of CPU on a loaded machine (measured: 4.5 s
    of a 5.3 s stop at load 5, docs/stopping.md) that write nothing (every eyas writer has
    closed its file, or left a temporary that no reader takes for complete). Call it from the
    main thread of an entry point, after the stop was reported; `exit_within` still bounds
    it."""
    import atexit

    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx runs first
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


EXIT_WITHIN_S = 30.0
"""Once stopped, the seconds an entry point may take to wind down (Prefect reporting the run's
state, threads ending) before it exits regardless (`exit_within`)."""


def run_main(main: Callable[[], int], name: str, *, signals: bool = True) -> int:
    """Run an entry point's `main` (``python -m eyas.extract.run``, ``eyas.prepare``,
    ``eyas.evaluate.run``: what a host runs) under `install`: a stop (SIGTERM, Ctrl-C) unwinds
    it -- its ``finally`` blocks stop what it started -- and becomes one line on stderr and the
    exit code 128 + the signal. The process then winds down as the ``eyas`` command's does:
    within `EXIT_WITHIN_S`, and through `exit_now` (no interpreter finalization), so this call
    does not return after a stop.

    `signals` False (a test calling it in its own process) installs nothing and returns the
    exit code after a stop, the process left to go on."""
    installed = install() if signals else False
    try:
        return main()
    except StopRequested as exc:
        print(f"{name}: {exc}", file=sys.stderr, flush=True)
        if installed:  # the program (main thread, handlers ours): skip the finalization
            exit_within(EXIT_WITHIN_S, exc.exit_code)
            exit_now(exc.exit_code)
        return exc.exit_code
