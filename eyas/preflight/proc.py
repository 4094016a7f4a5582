"""Child processes under a time limit: a check that starts processes never outlives its limit."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eyas import stopping
from eyas.proc import stop_group


@dataclass
class Finished:
    """How a bounded process ended: its exit code (None: stopped at the limit) and its lines."""

    code: int | None
    lines: list[str] = field(default_factory=list)

    @property
    def timed_out(self) -> bool:
        return self.code is None

    def tail(self, n: int = 15) -> str:
        return "\n".join(self.lines[-n:])


def run_bounded(argv: Sequence[str], *, timeout_s: float, env: Mapping[str, str] | None = None,
                on_line: Callable[[str], None] | None = None, grace_s: float = 5.0,
                cwd: str | None = None) -> Finished:
    """Run `argv` in a session of its own, its stdout and stderr as one stream of lines, for at
    most `timeout_s`; then its whole process group gets SIGTERM, SIGKILL after `grace_s`.
    Interrupted (KeyboardInterrupt, a cancelled run, a stop request of this process seen
    from any thread: `eyas.stopping`) it is stopped the same way."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None,
                            text=True, bufsize=1, errors="replace", start_new_session=True,
                            cwd=cwd)
    done = Finished(None)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            done.lines.append(line)
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                done.code = proc.wait(timeout=max(0.0, min(0.25, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    stop_group(proc, grace_s)
                    done.code = None
                    break
                # A stop of this process (SIGTERM, Ctrl-C), seen from a flow's worker thread.
                stopping.check(f"stopped {Path(argv[0]).name} (pid {proc.pid})")
    except BaseException:
        stop_group(proc, grace_s)
        raise
    reader.join(5.0)
    return done
