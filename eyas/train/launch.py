"""Start the training processes of one host: one plain process, or torchrun over its GPUs.

``python -m eyas.train.run --processes N ...`` with N > 1 makes that process torchrun's agent
(`launch`: ``torch.distributed.run`` in process, ``--standalone``, one node, no restarts), which
starts N workers running ``python -m eyas.train.run`` with the same arguments: one per GPU
(NCCL), or N gloo processes on CPU. Every worker takes its own micro-batches
(`eyas.train.data.Batches`: rank r of w takes global micro-batches r, r+w, ...), so one
optimizer step sees ``N × grad_accum × micro_batch`` samples.

The workers write to the agent's stdout and stderr: one stream, in which only rank 0 prints
progress records and the summary, and any rank prints its own error (``error (rank r of w):
...``); when a worker fails, the agent stops the others and `launch` names the failed ranks
with their exit codes and errors.

No rank outlives its launch. torchrun starts each worker in a session of its own, so a signal
to the launcher's process group (a cancelled job) reaches the agent only: the agent stops its
workers on SIGTERM/SIGINT, and each worker asks the kernel to kill it when the agent dies
(`die_with_parent`, Linux), which covers an agent killed outright (SIGKILL, OOM). With
``--die-with-parent`` the agent itself ends when the process that started it does (an
orchestrator running it as a child process).

Stopping: the workers get the agent's SIGTERM/SIGINT, end the step under way, write the
checkpoint and exit (`eyas.train.run`); the agent waits `STOP_GRACE_S` for that before SIGKILL
(torchrun's ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, unless set). `run_child` stops its child the
same way when this process is asked to stop (`eyas.stopping`), from whichever thread runs it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

from eyas import stopping
from eyas.errors import ConfigError
from eyas.proc import die_with_parent, stop_group

LAUNCHER_PID = "EYAS_LAUNCHER_PID"
"""Environment variable a worker finds its agent's pid in (set by `launch`)."""
STOP_GRACE_S = 300
"""Seconds a stopped training's processes get to end their step and write the checkpoint
(at the Kimi-K2.5 width: a step of seconds, a 14.3 GB checkpoint) before SIGKILL."""


def resolve_processes(requested: int | None, gpus: int) -> int:
    """How many training processes: `requested` (``train.processes``), else one per GPU of
    `gpus`, at least 1."""
    if requested is not None:
        return requested
    return max(1, gpus)


def check_processes(processes: int, *, cuda: bool, visible_gpus: int) -> None:
    """Raise ConfigError when `processes` GPU processes (`cuda`) exceed the `visible_gpus`."""
    if cuda and processes > visible_gpus:
        raise ConfigError(f"{processes} training processes need {processes} GPUs, but "
                          f"{visible_gpus} are visible here (CUDA_VISIBLE_DEVICES?)",
                          where="train.processes")


def is_worker() -> bool:
    """True in a process that torchrun started (it sets ``TORCHELASTIC_RUN_ID``)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def guard_worker() -> None:
    """In a torchrun worker: die with the agent, and exit now if the agent is already gone."""
    die_with_parent(signal.SIGKILL)
    expected = os.environ.get(LAUNCHER_PID)
    if expected is not None and os.getppid() != int(expected):
        sys.exit(f"error: the training launcher (pid {expected}) is gone; stopping")


def patient_group(hours: float = 24.0):
    """A gloo process group of every rank whose collectives wait up to `hours`: for ranks that
    wait while the first works alone (hashing terabytes of shards, building the vocabulary,
    exporting), longer than the default group's timeout (10 minutes for NCCL) allows. Every
    rank must call it, in the same order."""
    import datetime

    import torch.distributed as dist

    return dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=hours))


def torchrun_args(processes: int, module: str, args: Sequence[str]) -> list[str]:
    """torchrun's arguments that start `processes` workers running ``python -m module args``
    on this host (a rendezvous of its own on a free local port; a failure is not restarted)."""
    return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(processes),
            "--max-restarts", "0", "--module", module, *args]


def launch(processes: int, module: str, args: Sequence[str]) -> int:
    """Run torchrun in this process (its agent) over `processes` workers; return 0 when every
    worker succeeded, else the exit code of the lowest rank that failed with an error of its own
    (1-127); else 128 + the signal that killed a rank (the first to fail), the stop's own
    128 + n when every rank stopped on a signal, or when this process got SIGTERM/SIGINT and
    stopped the workers; after naming every failed rank and its error on stderr.

    The workers inherit this environment plus `LAUNCHER_PID`; gloo's traffic stays on the
    loopback interface unless ``GLOO_SOCKET_IFNAME`` says otherwise (one host), and each
    worker runs one OpenMP thread unless ``OMP_NUM_THREADS`` says otherwise (torchrun's default).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    os.environ[LAUNCHER_PID] = str(os.getpid())
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # torchrun's own default for several workers, set here so that it does not warn about it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Stopped, the workers end their step and write the checkpoint: wait for that.
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(STOP_GRACE_S))
    try:
        torchrun(torchrun_args(processes, module, args))
    except SignalException as exc:  # torchrun has stopped every worker by now
        print(f"error: training stopped: its launcher got {signal.Signals(exc.sigval).name}",
              file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        for rank, failure in sorted(exc.failures.items()):
            print(f"error: training rank {rank} of {processes} failed (exit code "
                  f"{failure.exitcode}): {_reason(failure.message)}", file=sys.stderr, flush=True)
        # A rank's own error (1..127) says why. Otherwise a rank killed by a signal (exit code
        # -n) is the cause: the agent then stops the others with SIGTERM, which they answer by
        # checkpointing and exiting 128+15 (`eyas.stopping`) -- a consequence, not the cause.
        # So is a rank's error that only says a peer vanished in a collective (gloo's
        # "Connection closed by peer"), when it is faster than the agent's SIGTERM.
        failures = sorted(exc.failures.items())
        killed = [f.exitcode for _, f in failures if f.exitcode < 0]
        own = [f.exitcode for _, f in failures if 0 < f.exitcode < 128
               and not (killed and peer_lost(f.message))]
        if own:
            return own[0]
        first = exc.get_first_failure()[1].exitcode
        if first < 0 or killed:
            return 128 - (first if first < 0 else killed[0])
        return failures[0][1].exitcode  # every rank stopped on a signal (128+n)
    return 0


# What a rank's collective raises when another rank is gone (gloo's TCP pair, NCCL's abort and
# watchdog): the rank did nothing wrong of its own.
_PEER_LOST = re.compile(
    r"Connection (closed|reset) by peer|remote worker crash|remote process exited"
    r"|Broken pipe|communicator was aborted|Watchdog caught collective operation timeout",
    re.IGNORECASE)


def peer_lost(message: object) -> bool:
    """Whether a failed rank's error (torchrun's message for it) only says a peer vanished."""
    return bool(_PEER_LOST.search(_reason(message)))


def _reason(message: object) -> str:
    # A worker's error file holds {"message": "<type>: <text>", "extraInfo": ...}; without one
    # torchrun makes up a pointer to its docs, or names the signal.
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message or "").strip()
    if not text or "elastic/errors" in text:
        return "see its output above"
    return text


def run_child(argv: Sequence[str], *, env: dict[str, str] | None = None,
              on_line: Callable[[str], None], grace: float = STOP_GRACE_S + 30) -> int:
    """Run `argv` as a child of this process (a session of its own), hand each line of its
    stdout and stderr (one stream) to `on_line`, and return its exit code.

    Run it with ``--die-with-parent`` (`eyas.train.run`): then nothing of it survives this
    process. When this call is interrupted (KeyboardInterrupt, a cancelled task, any error in
    `on_line`), the child's group gets SIGTERM, SIGKILL after `grace` seconds, and the error
    goes on. When this process is asked to stop (`eyas.stopping`, seen from any thread), the
    child's group gets SIGTERM (training then checkpoints and exits) and, once it has ended,
    `StopRequested` is raised.
    """
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, text=True, bufsize=1,
                            errors="replace", start_new_session=True)
    watcher = threading.Thread(target=_term_on_stop, args=(proc,), daemon=True,
                               name=f"eyas-stop-{proc.pid}")
    watcher.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        code = proc.wait()
        stopping.check(f"its child (pid {proc.pid}) exited with {code}")
        return code
    except BaseException:
        stop_group(proc, grace)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def _term_on_stop(proc: subprocess.Popen) -> None:
    """Until `proc` ends: on a stop request, SIGTERM to its group (once)."""
    while proc.poll() is None:
        if stopping.wait(0.5):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            return
