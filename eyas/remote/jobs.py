"""Detached jobs: long commands that outlive the SSH connection that started them.

A job lives in a folder on the host, ``<data_root>/.eyas/jobs/<job_id>/`` (mode 700):

    cmd         the command, as given (for people)
    run.sh      what runs: ``cd`` to the job's cwd, exported variables, the command (its shell
                outwaits a TERM, so the exit code is the command's own, written once it ended)
    cwd, uses   the job's working folder and the paths it declared (deletion refuses them)
    pid         pid of the job's session leader = its process group id
    log         stdout and stderr of the command
    exit_code   written when the command ends (absent while it runs)
    cancelled   written by `cancel` before it signals the group

The job runs under ``nohup setsid``: its own session and process group, no controlling
terminal, stdin from /dev/null, so a dropped connection, a killed sshd child or a restarted flow
does not touch it. Anyone with the job id can re-attach (`attach`), read its state
(`job_status`) or stop the whole process group (`cancel`: TERM, and KILL after a grace that
lets a command save its state, as training does at its next step). Every call is one round
trip. A follower stopped (Ctrl-C, SIGTERM: `eyas.stopping`) cancels the job it follows.
"""

from __future__ import annotations

import datetime as _dt
import logging
import re
import secrets
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from eyas import stopping
from eyas.errors import USER_ERROR_EXIT, ConfigError, RemoteError
from eyas.remote.hosts import (
    KILL_GRACE_S,
    Host,
    HostSpec,
    LineSink,
    RemoteTimeoutError,
    check_env_name,
    connect,
)

JobState = Literal["running", "exited", "cancelled", "lost", "unknown"]
POLL_TIMEOUT_S = 30.0
"""A poll (one short status command) that has not answered by then is taken for a dead
connection -- a vanished host or a network path dropped without a reset leaves a channel
hanging open for hours -- and `attach` reconnects. Over SSH the wait lasts this plus the
backstop margin of `eyas.remote.hosts.SSHHost` (35 s)."""
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
log = logging.getLogger(__name__)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
"""Environment of every eyas job (and child process): no hub traffic, log lines as they come."""


class JobLostError(RemoteError):
    """The job's processes are gone but it left no exit code (killed, or the host rebooted)."""


def jobs_root(data_root: str) -> str:
    """Folder holding every job folder on a host."""
    return f"{data_root.rstrip('/')}/.eyas/jobs"


def job_dir(data_root: str, job_id: str) -> str:
    """The folder of one job; raises ConfigError for an id that is not a safe folder name."""
    if not _JOB_ID.fullmatch(job_id):
        raise ConfigError(f"job id {job_id!r} must be letters, digits, '_', '-', '.'", where="job_id")
    return f"{jobs_root(data_root)}/{job_id}"


def new_job_id(prefix: str = "job", tag: str | None = None) -> str:
    """A sortable, unique job id: ``<prefix>-YYYYmmddTHHMMSS[-<tag>]-<8 hex>``.

    `tag` names who started the job (an orchestrator's run), so that it finds its jobs again.
    """
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    return "-".join([prefix, stamp, *([tag] if tag else []), secrets.token_hex(4)])


@dataclass(frozen=True)
class JobHandle:
    """A started job: enough to find it again from any process."""

    job_id: str
    dir: str
    pid: int
    login: str


@dataclass(frozen=True)
class JobStatus:
    """A job's state at one poll; `exit_code` is set once it has exited."""

    job_id: str
    state: JobState
    exit_code: int | None = None
    log_bytes: int = 0
    cwd: str | None = None
    uses: tuple[str, ...] = field(default_factory=tuple)


def build_run_script(
    cmd: str, *, cwd: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The ``run.sh`` a job executes: cd, exports, then `cmd`. A failed cd exits 97.

    Its shell traps TERM (`cancel` signals the job's whole group): a shell waiting for a
    command runs a trap only once the command has ended, so the job's exit code is written
    when the command is really gone -- after a training has saved its checkpoint, say -- and
    is the command's own; nothing after it runs. The command gets TERM with its default
    action (or its own handler)."""
    lines = ["#!/bin/sh", "trap 'exit $?' TERM"]
    if cwd:
        lines.append(f"cd {shlex.quote(cwd)} || exit 97")
    for key in sorted(env or {}):
        lines.append(f"export {check_env_name(key)}={shlex.quote(str(env[key]))}")
    lines.append(cmd)
    return "\n".join(lines) + "\n"


def _launcher(d: str, job_id: str) -> str:
    """Shell text that starts the detached wrapper and waits for its pid file."""
    qd = shlex.quote(d)
    # The wrapper is the session leader (pid = pgid). Its trap makes it survive the TERM that
    # `cancel` sends to the group, so it can still record the command's exit code.
    wrapper = (
        'd="$EYAS_JOB_DIR"; echo $$ > "$d/pid.tmp" && mv -f "$d/pid.tmp" "$d/pid"; '
        "trap 'got=1' TERM INT HUP; "
        'sh "$d/run.sh" > "$d/log" 2>&1 < /dev/null; rc=$?; '
        'echo $rc > "$d/exit_code.tmp" && mv -f "$d/exit_code.tmp" "$d/exit_code"'
    )
    return (
        f"EYAS_JOB_DIR={qd} EYAS_JOB_ID={shlex.quote(job_id)} "
        f"nohup setsid sh -c {shlex.quote(wrapper)} > /dev/null 2>&1 < /dev/null & "
        f"i=0; while [ ! -s {qd}/pid ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
        f"cat {qd}/pid"
    )


def start_job(
    host: Host,
    cmd: str,
    *,
    job_id: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    uses: list[str] | None = None,
) -> JobHandle:
    """Start `cmd` on `host` detached from the connection; return as soon as it runs.

    `uses` lists paths the job reads or writes; `eyas.remote.clean` refuses to delete them
    while the job runs (its `cwd` too). The job's environment is the host's ``gpu_env``
    (`HostSpec`) with `env` over it. Raises RemoteError when the id is taken or the job
    did not start.
    """
    job_id = job_id or new_job_id()
    env = {**host.spec.gpu_env, **(env or {})}  # the host's GPU settings reach every job
    d = job_dir(host.spec.data_root, job_id)
    qd = shlex.quote(d)
    files = {
        "cmd": cmd,
        "run.sh": build_run_script(cmd, cwd=cwd, env=env),
        "cwd": cwd or "",
        "uses": "".join(f"{p}\n" for p in (uses or [])),
    }
    writes = " && ".join(f"printf %s {shlex.quote(v)} > {qd}/{k}" for k, v in files.items())
    script = (
        f"umask 077 && mkdir -p {shlex.quote(jobs_root(host.spec.data_root))} && "
        f"mkdir {qd} 2>/dev/null || {{ echo 'job id {job_id} is already taken' >&2; exit 3; }}; "
        f"{writes} && {_launcher(d, job_id)}"
    )
    res = host.run(script, check=False)
    if not res.ok or not res.stdout.strip().isdigit():
        raise RemoteError(
            f"{host.spec.login}: job {job_id} did not start (exit {res.exit_code}): "
            f"{(res.stderr or res.stdout).strip()}"
        )
    return JobHandle(job_id, d, int(res.stdout.strip()), host.spec.login)


def _status_script(d: str, job_id: str) -> str:
    """Shell text printing ``EYAS <state> <exit code or -> <log bytes>``."""
    qd = shlex.quote(d)
    marker = shlex.quote(f"EYAS_JOB_ID={job_id}")
    # Liveness is read BEFORE the exit code: the wrapper writes exit_code and only then exits,
    # so "not alive" followed by "no exit_code" really means the job died without one.
    return (
        f"d={qd}; c=-; a=0; "
        'p=$(cat "$d/pid" 2>/dev/null); '
        'if [ -n "$p" ] && kill -0 "$p" 2>/dev/null '
        '   && [ "$(cut -d" " -f3 /proc/$p/stat 2>/dev/null)" != Z ]; then '
        '  if [ ! -r /proc/$p/environ ] '
        f"     || tr '\\000' '\\n' < /proc/$p/environ | grep -qx {marker}; then a=1; fi; "
        "fi; "
        'if [ ! -d "$d" ]; then s=unknown; '
        'elif [ -s "$d/exit_code" ]; then s=exited; c=$(cat "$d/exit_code"); '
        "elif [ $a = 1 ]; then s=running; "
        'elif [ -e "$d/cancelled" ]; then s=cancelled; '
        "else s=lost; fi; "
        'n=0; if [ -f "$d/log" ]; then n=$(wc -c < "$d/log"); fi; echo "EYAS $s $c $n"'
    )


def _parse_status(job_id: str, line: str) -> JobStatus:
    parts = line.split()
    if len(parts) != 4 or parts[0] != "EYAS":
        raise RemoteError(f"job {job_id}: unexpected status line {line!r}")
    _, state, code, size = parts
    return JobStatus(job_id, state, None if code == "-" else int(code), int(size))  # type: ignore[arg-type]


def job_status(host: Host, job_id: str) -> JobStatus:
    """The job's state: running, exited (with its code), cancelled, lost, or unknown (no folder)."""
    d = job_dir(host.spec.data_root, job_id)
    script = _status_script(d, job_id) + '; cat "$d/cwd" 2>/dev/null; echo; cat "$d/uses" 2>/dev/null; true'
    out = host.run(script).stdout.split("\n")
    st = _parse_status(job_id, out[0])
    cwd = out[1] if len(out) > 1 and out[1] else None
    uses = tuple(p for p in out[2:] if p)
    return JobStatus(st.job_id, st.state, st.exit_code, st.log_bytes, cwd, uses)


def list_jobs(host: Host) -> list[JobStatus]:
    """Every job folder on the host with its state, sorted by id."""
    root = jobs_root(host.spec.data_root)
    res = host.run(f"ls -1 {shlex.quote(root)} 2>/dev/null || true")
    ids = sorted(x for x in res.stdout.split("\n") if _JOB_ID.fullmatch(x))
    return [job_status(host, j) for j in ids]


def running_jobs(host: Host, prefix: str = "", *, batch: int = 100) -> list[str]:
    """Ids of the running jobs whose id starts with `prefix`, sorted (a few round trips)."""
    root = jobs_root(host.spec.data_root)
    res = host.run(f"ls -1 {shlex.quote(root)} 2>/dev/null || true")
    ids = sorted(x for x in res.stdout.split("\n") if _JOB_ID.fullmatch(x) and x.startswith(prefix))
    running = []
    for i in range(0, len(ids), batch):
        chunk = ids[i:i + batch]
        script = "; ".join(f"({_status_script(job_dir(host.spec.data_root, j), j)})" for j in chunk)
        lines = host.run(script).stdout.split("\n")[: len(chunk)]
        if len(lines) != len(chunk):
            raise RemoteError(f"{host.spec.login}: job status listing was cut short")
        running += [j for j, line in zip(chunk, lines, strict=True)
                    if _parse_status(j, line).state == "running"]
    return running


def start_or_reattach(
    host: Host, cmd: str, *, prefix: str, job_id: str | None = None, **start_kw
) -> tuple[str, bool]:
    """The id of a running job for this work (`prefix`), else of a job started now.

    This is how a restarted flow picks up the job its predecessor left running instead of
    starting the same work twice. Returns ``(job_id, reattached)``.
    """
    running = running_jobs(host, prefix + "-")
    if running:
        return running[-1], True
    return start_job(host, cmd, job_id=job_id or new_job_id(prefix), **start_kw).job_id, False


def read_log(host: Host, job_id: str, offset: int = 0,
             timeout: float | None = None) -> tuple[JobStatus, str, int]:
    """One poll: the job's status, its log from byte `offset` to the current end, the new offset.

    The status is read first, so when it says exited the text returned is the whole rest.
    Raises RemoteTimeoutError when the poll does not answer within `timeout` seconds
    (default `POLL_TIMEOUT_S`).
    """
    d = job_dir(host.spec.data_root, job_id)
    script = (
        _status_script(d, job_id)
        + f'; if [ "$n" -gt {int(offset)} ]; then tail -c +{int(offset) + 1} "$d/log" '
        f'| head -c $((n - {int(offset)})); fi'
    )
    out = host.run(script, timeout=POLL_TIMEOUT_S if timeout is None else timeout).stdout
    head, _, text = out.partition("\n")
    st = _parse_status(job_id, head)
    return st, text, max(offset, st.log_bytes)


def attach(
    host: Host,
    job_id: str,
    *,
    stream: LineSink | None = None,
    poll_interval: float = 2.0,
    offset: int = 0,
    timeout: float | None = None,
    cancel_on_interrupt: bool = True,
    reconnect_tries: int = 5,
    cancel_grace: float = KILL_GRACE_S,
) -> int:
    """Follow a job: stream its new log lines from byte `offset` until it ends; return its exit code.

    A poll that fails on the network, or hangs past `POLL_TIMEOUT_S` (a connection that died
    without a reset), is retried (`reconnect_tries` times in a row, with a new connection)
    since the job itself does not depend on it. After `timeout` seconds the job is
    cancelled and RemoteTimeoutError raised. An interrupt (KeyboardInterrupt, a stop requested
    in this process -- `eyas.stopping`, seen at each poll, from any thread --, a flow's
    cancellation) cancels the job when `cancel_on_interrupt` (TERM, KILL after `cancel_grace`
    seconds) and is raised again; a failure to cancel is logged, never raised in its place.
    Raises JobLostError when the job vanished without an exit code, RemoteError when it was
    cancelled or is unknown.
    """
    start = time.monotonic()
    partial = ""
    failures = 0
    try:
        while True:
            try:
                st, text, offset = read_log(host, job_id, offset)
                failures = 0
            except RemoteError:  # a poll that timed out included: the connection is dropped
                failures += 1
                if failures > reconnect_tries:
                    raise
                time.sleep(min(30.0, poll_interval * 2**failures))
                continue
            if stream is not None and text:
                *lines, partial = (partial + text).split("\n")
                for line in lines:
                    stream(line)
            if st.state != "running":
                if stream is not None and partial:
                    stream(partial)
                if st.state == "exited":
                    return int(st.exit_code)  # type: ignore[arg-type]
                if st.state == "lost":
                    raise JobLostError(
                        f"{host.spec.login}: job {job_id} is gone without an exit code "
                        f"(killed or host restarted); its log is in {job_dir(host.spec.data_root, job_id)}/log"
                    )
                raise RemoteError(f"{host.spec.login}: job {job_id} is {st.state}")
            if timeout is not None and time.monotonic() - start > timeout:
                cancel(host, job_id)
                raise RemoteTimeoutError(
                    f"{host.spec.login}: job {job_id} ran past {timeout}s; cancelled it"
                )
            stopping.wait(poll_interval)
            stopping.check(f"stopped following job {job_id} on {host.spec.login}")
    except BaseException as exc:
        # Prefect signals a cancelled run with a BaseException subclass of its own.
        if cancel_on_interrupt and not isinstance(exc, Exception):
            _cancel_keeping(exc, host, job_id, cancel_grace)
        raise


def _cancel_keeping(exc: BaseException, host: Host, job_id: str, grace: float) -> None:
    """Cancel the job while `exc` (an interrupt) is on its way up: a failure to cancel (the
    network, too slow a host) is logged and `exc` goes on -- raising the failure instead would
    turn one Ctrl-C into an error that a caller may catch and carry on after."""
    try:
        cancel(host, job_id, grace=grace)
    except Exception as failure:  # noqa: BLE001 -- the interrupt matters more
        log.warning("%s: could not cancel job %s after %s (%s); it may still run: cancel "
                    "it with eyas.remote.jobs.cancel", host.spec.login, job_id,
                    type(exc).__name__, failure)


def cancel(host: Host, job_id: str, *, grace: float = KILL_GRACE_S) -> JobStatus:
    """Stop a job's whole process group: TERM, then KILL after `grace` seconds.

    Idempotent: a job that already ended is left as it is. Returns the final status. Runs to
    its end after a stop request too (`eyas.stopping.shielded`): it is what a stop does.
    """
    with stopping.shielded():
        return _cancel(host, job_id, grace)


def _cancel(host: Host, job_id: str, grace: float) -> JobStatus:
    d = job_dir(host.spec.data_root, job_id)
    st = job_status(host, job_id)
    if st.state != "running":
        return st
    qd = shlex.quote(d)
    steps = max(1, int(grace / 0.1))
    script = (
        f": > {qd}/cancelled; p=$(cat {qd}/pid); "
        'kill -TERM -"$p" 2>/dev/null; i=0; '
        f'while kill -0 -"$p" 2>/dev/null && [ $i -lt {steps} ]; '
        "do sleep 0.1; i=$((i+1)); done; "
        'kill -KILL -"$p" 2>/dev/null; true'
    )
    host.run(script)
    # The wrapper writes the exit code right after its child dies; give it a moment.
    for _ in range(20):
        st = job_status(host, job_id)
        if st.state != "running":
            return st
        time.sleep(0.1)
    return st


def run_job(
    spec: HostSpec,
    cmd: str,
    *,
    prefix: str,
    job_id: str | None = None,
    say: Callable[[str], None] = log.info,
    env: Mapping[str, str] | None = None,
    uses: list[str] | None = None,
    poll_interval: float = 1.0,
    on_line: Callable[[str], str | None] | None = None,
    cancel_grace: float | None = None,
    refusal_where: str | None = None,
) -> tuple[str, list[str]]:
    """Run `cmd` on the host as a detached job (or re-attach to the running one for `prefix`;
    a new one is called `job_id`, by default `new_job_id`), hand each log line to `say`
    (``[<login>] <line>``), and return ``(job_id, lines)``.

    `on_line` sees each line first; what it returns, when not None, is said instead of the
    line (a JSON record made readable, say). Stopped (`eyas.stopping`: Ctrl-C, SIGTERM, a
    cancelled flow), it cancels the job: TERM, KILL after `cancel_grace` seconds (default
    `eyas.remote.hosts.KILL_GRACE_S`; training gives its step and checkpoint longer). Raises
    RemoteError naming the host, job and exit code, with the log's tail, when it fails; with
    `refusal_where` (the config section), ConfigError with the job's error lines when it exits
    with `USER_ERROR_EXIT` (its configuration or data refused: a retry cannot help).
    """
    lines: list[str] = []

    def sink(line: str) -> None:
        lines.append(line)
        shown = on_line(line) if on_line is not None else None
        say(f"[{spec.login}] {line if shown is None else shown}")

    with connect(spec) as host:
        job_id, reattached = start_or_reattach(
            host, cmd, prefix=prefix, job_id=job_id or new_job_id(prefix), env=env, uses=uses)
        say(f"{'re-attached to' if reattached else 'started'} job {job_id} on {spec.login}")
        code = attach(host, job_id, stream=sink, poll_interval=poll_interval,
                      **({} if cancel_grace is None else {"cancel_grace": cancel_grace}))
    if code == USER_ERROR_EXIT and refusal_where is not None:
        raise ConfigError(f"{spec.login}: job {job_id} refused its configuration or data:\n"
                          + error_lines(lines), where=refusal_where)
    if code != 0:
        tail = "\n".join(lines[-20:])
        raise RemoteError(f"{spec.login}: job {job_id} exited with {code}; log tail:\n{tail}")
    return job_id, lines


def error_lines(lines: list[str]) -> str:
    """What a failed eyas entry point said: its last ``error...`` lines, else its output's
    last 20 lines."""
    errors = [x for x in lines if x.startswith("error")] or lines[-20:]
    return "\n".join(errors[-20:])


def last_json_line(lines: list[str]) -> dict | None:
    """The last line that is a JSON object (our entry points print their summary last)."""
    import json

    for line in reversed(lines):
        if line.startswith("{"):
            return json.loads(line)
    return None
