"""A child process started as from a terminal, whatever started the tests."""

from __future__ import annotations

import signal


def as_in_a_terminal() -> None:
    """Ctrl-C's default action in a child (a ``preexec_fn``), even when the tests run as a
    background job: that ignores SIGINT, and a Python started ignoring it never raises
    KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
