"""The temporary Prefect server of a command run without ``PREFECT_API_URL``.

Prefect starts it (a ``uvicorn`` subprocess on a random loopback port) on the first API call
and stops it at exit. `start_tied`, called by eyas before any flow runs, makes it fit a
pipeline whose runs may be killed: it gets SIGTERM when the command's process dies in a way
that runs no exit code (SIGKILL, the OOM killer). Prefect's own start leaves it running
forever then, about 230 MB each time. It runs in a session of its own, so a signal to the
command's process group (Ctrl-C in a terminal, ``timeout``, a container's stop) reaches the
command only: the command stops cleanly, reporting to the server as it goes (`eyas.stopping`),
and stops the server last, at its exit. (In the command's group, the server died first and
every report after it waited out the client's retries: minutes.)
"""

from __future__ import annotations

import subprocess


def start_tied() -> bool:
    """Start the temporary server now, tied to this process and to the calling thread (which
    must live as long as the command: call it from the main thread). Returns False, doing
    nothing, when a server is configured (``PREFECT_API_URL``) or the temporary one runs.

    Uses Prefect's own start (its command, port and readiness check); only the child's
    ``preexec_fn`` and its own session are added, by wrapping ``subprocess.Popen`` for the one
    call that spawns it.
    """
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return False
    from prefect.server.api import server as prefect_server

    from eyas.proc import dies_with_this_process

    preexec = dies_with_this_process()
    instance = prefect_server.SubprocessASGIServer()
    if instance.running or preexec is None:
        return False
    spawn = instance._run_uvicorn_command

    def tied_spawn() -> subprocess.Popen:
        popen = subprocess.Popen
        subprocess.Popen = lambda *a, **kw: popen(  # type: ignore[misc]
            *a, preexec_fn=preexec, start_new_session=True, **kw)
        try:
            return spawn()
        finally:
            subprocess.Popen = popen  # type: ignore[misc]

    instance._run_uvicorn_command = tied_spawn  # type: ignore[method-assign]
    instance.start()
    return True
