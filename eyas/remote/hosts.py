"""Hosts eyas runs commands on: a GPU host over SSH (Fabric), or this machine.

Both kinds share one interface (`Host`), so every phase is written once:

    host = connect(HostSpec(host="192.0.2.10", user="train", key_filename="~/.ssh/id_ed25519",
                            known_hosts="~/.ssh/known_hosts", data_root="/data"))
    host.run("nvidia-smi -L", stream=print)

Contracts that matter on a real host:

- Host keys are verified. The SSH host loads the known-hosts file (or a pinned key) and sets
  paramiko's ``RejectPolicy`` *before* connecting: an unknown or changed key is refused with a
  `HostKeyError`. Fabric's default (accept any key) is never used.
- A connection failure (refused, timeout, wrong key) is a `RemoteError` naming user, host and port.
- ``run(..., timeout=N)`` stops the remote work: the command runs under GNU ``timeout`` in its own
  process group on the host, and a watchdog kills that group when the SSH channel closes (a killed
  flow, a dropped connection). Work that must *outlive* the connection is a detached job
  (`eyas.remote.jobs`).
- An interrupt stops the command and goes on up: Ctrl-C while ``run`` waits (in the main
  thread), or a stop requested in this process (`eyas.stopping`: SIGTERM, Ctrl-C, seen from any
  thread, e.g. a Prefect task's) closes the channel, so the host kills the command's group,
  and raises `KeyboardInterrupt` / `eyas.stopping.StopRequested`. (Fabric's own wait loop is
  not used: it forwards an interrupt to the remote end instead of stopping.)
- One Fabric `Connection` per thread; the `HostSpec` (plain data) is what travels between tasks.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr

from eyas import stopping
from eyas.config_model import ConfigModel
from eyas.errors import ConfigError, RemoteError
from eyas.io import sha256_file


def shell_join(*words: str) -> str:
    """One shell command line of `words`, each quoted (`shlex.quote`): a value from a config
    or a block -- an interpreter (``HostSpec.python``), a path, an argument -- is always one
    word, never shell syntax (``touch X; python3`` names a program that does not exist, it
    runs nothing). The one way eyas puts such values into a remote command."""
    return " ".join(shlex.quote(str(w)) for w in words)

LineSink = Callable[[str], None]

#: Seconds between SIGTERM and SIGKILL when stopping a process group.
KILL_GRACE_S = 5
#: Seconds between two looks at a running SSH command (has it ended, was a stop requested).
_WAIT_POLL_S = 0.02


class RemoteTimeoutError(RemoteError):
    """A command ran past its timeout; its process group on the host was killed."""


class HostKeyError(RemoteError):
    """The host's key is unknown or differs from the pinned / known one."""


class HostSpec(ConfigModel):
    """Where and how to reach a host. Plain data: safe to pass between Prefect tasks."""

    kind: Literal["ssh", "local"] = "ssh"
    """``ssh`` for a remote host, ``local`` for this machine (no SSH at all)."""
    host: str = "localhost"
    """Address or name of the host."""
    port: int = Field(22, ge=1, le=65535)
    """SSH port."""
    user: str | None = None
    """Login user; default: the local user name."""
    key_filename: str | None = None
    """Private key file for the login."""
    key_passphrase: SecretStr | None = None
    """Passphrase of `key_filename`, if it has one."""
    known_hosts: str | None = "~/.ssh/known_hosts"
    """known_hosts file holding the host's key (check it out of band, e.g. ssh-keyscan + fingerprint)."""
    host_key: str | None = None
    """Pinned host key, ``"ssh-ed25519 AAAA..."``; wins over `known_hosts`."""
    data_root: str = "/data"
    """Folder on the host that eyas may write to and delete from; nothing outside it is deleted."""
    python: str = "python3"
    """Python on the host (a name on its PATH or a path) for the status probe and for creating
    the eyas venv (`ship`), e.g. ``python3.11``: SGLang 0.5.23 needs 3.11-3.13, eyas alone
    3.10+; checked before a venv is built (eyas itself then runs with `eyas_python`)."""
    venv: str | None = None
    """Virtual environment on the host that `ship` installs eyas into, and whose Python runs
    every eyas entry point there; default ``<data_root>/.eyas/venv``."""
    num_gpus: int = Field(0, ge=0)
    """GPUs on the host."""
    gpu_env: dict[str, str] = Field(default_factory=dict)
    """Environment every job eyas starts on this host runs with (extraction, training,
    serving, preflight), e.g. ``{"NCCL_P2P_DISABLE": "1"}``; a recipe's ``gpu_env`` adds to it."""
    connect_timeout: float = Field(10.0, gt=0)
    """Seconds to wait for the TCP connection and the SSH banner."""

    @property
    def login(self) -> str:
        """``user@host:port`` for messages."""
        if self.kind == "local":
            return f"local:{self.user_name}"
        return f"{self.user_name}@{self.host}:{self.port}"

    @property
    def user_name(self) -> str:
        return self.user or _local_user()

    @property
    def venv_path(self) -> str:
        """The host's eyas venv: `venv`, else ``<data_root>/.eyas/venv``."""
        return self.venv or f"{self.data_root.rstrip('/')}/.eyas/venv"

    @property
    def eyas_python(self) -> str:
        """The Python that runs eyas entry points (``-m eyas.prepare``, ``eyas.extract.run``,
        ``eyas.train.run``) on this host: the one of its eyas venv. On this machine without
        a `venv`, the interpreter running now (eyas is importable there)."""
        if self.kind == "local" and self.venv is None:
            return sys.executable
        return f"{self.venv_path.rstrip('/')}/bin/python"

    @classmethod
    def local(cls, data_root: str = "/data", **fields) -> HostSpec:
        """This machine (no SSH): probes run with the interpreter running now."""
        return cls(kind="local", known_hosts=None, data_root=data_root, python=sys.executable,
                   **fields)


def _local_user() -> str:
    import getpass

    return getpass.getuser()


@dataclass
class Result:
    """What a finished command left: exit code, captured output, seconds it took."""

    command: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_name(key: str) -> str:
    """`key` when it is a valid POSIX shell variable name; else ConfigError."""
    if not _ENV_NAME.fullmatch(key):
        raise ConfigError(f"environment variable name {key!r} is not valid", where="env")
    return key


def build_command(
    cmd: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> str:
    """`cmd` prefixed with ``cd`` and exported variables, as one POSIX shell string."""
    parts = []
    if cwd:
        parts.append(f"cd {shlex.quote(cwd)} &&")
    for key in sorted(env or {}):
        parts.append(f"export {check_env_name(key)}={shlex.quote(str(env[key]))} &&")
    parts.append(cmd)
    return " ".join(parts)


def guarded_command(cmd: str, *, timeout: float | None = None, grace: int = KILL_GRACE_S) -> str:
    """Wrap `cmd` so the host stops it when the SSH channel closes or `timeout` passes.

    The command runs in its own process group (``setsid``), with stdin from /dev/null. A
    watchdog reads the channel's stdin: it sees end-of-file only when the channel closes, and
    then kills the command's whole group (TERM, then KILL after `grace` seconds). With a timeout,
    GNU ``timeout`` kills the group itself and the exit code is 124.
    """
    inner = f"sh -c {shlex.quote(cmd)}"
    if timeout is not None:
        secs = max(1, int(round(timeout)))
        inner = f"timeout -k {grace} {secs} {inner}"
    kill = f"kill -TERM -$p 2>/dev/null; sleep {grace}; kill -KILL -$p 2>/dev/null"
    watchdog = shlex.quote(f"cat >/dev/null; {kill}")
    script = (
        # A background job's stdin is /dev/null unless redirected explicitly: hand the
        # channel's stdin to the watchdog through fd 3.
        f"exec 3<&0; setsid {inner} </dev/null 3<&- & p=$!; "
        f"p=$p setsid sh -c {watchdog} <&3 3<&- >/dev/null 2>&1 & w=$!; exec 3<&-; "
        "wait $p; rc=$?; kill -TERM -$w 2>/dev/null; exit $rc"
    )
    return f"sh -c {shlex.quote(script)}"


class _LineWriter:
    """A file-like sink that hands complete lines to a callback and keeps the text."""

    def __init__(self, sink: LineSink | None) -> None:
        self.sink = sink
        self.buf = ""
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        if self.sink is not None:
            self.buf += text
            *lines, self.buf = self.buf.split("\n")
            for line in lines:
                self.sink(line)
        return len(text)

    def flush(self) -> None:
        pass

    def finish(self) -> str:
        if self.sink is not None and self.buf:
            self.sink(self.buf)
            self.buf = ""
        return "".join(self.parts)


class Host(ABC):
    """A machine eyas runs commands on and moves files to and from: `SSHHost` or `LocalHost`.

    `run` is the same for both (each kind supplies `_execute`); the helpers built on it
    (`exists`, `disk_free`, `write_text`, ...) are everything a phase needs beyond running a
    command.
    """

    spec: HostSpec

    def run(
        self,
        cmd: str,
        *,
        stream: LineSink | None = None,
        timeout: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Result:
        """Run `cmd` on the host (in `cwd`, with `env` exported), streaming stdout and stderr
        lines to `stream`.

        Raises RemoteTimeoutError after `timeout` seconds (the command's process group is
        killed there), RemoteError on a non-zero exit when `check` (naming the host, the
        command and the output's tail), or when the host cannot be reached.
        """
        full = build_command(cmd, env=env, cwd=cwd)
        out, err = _LineWriter(stream), _LineWriter(stream)
        start = time.monotonic()
        code, timed_out = self._execute(full, cmd, out, err, timeout)
        res = Result(full, code, out.finish(), err.finish(), time.monotonic() - start)
        if timed_out:
            raise RemoteTimeoutError(f"{self.spec.login}: {cmd!r} ran past {timeout}s; stopped it")
        if check and not res.ok:
            raise self._fail(res, cmd)
        return res

    @abstractmethod
    def _execute(self, full: str, cmd: str, out: _LineWriter, err: _LineWriter,
                 timeout: float | None) -> tuple[int, bool]:
        """Run the shell text `full` (`cmd` as given, for messages), writing its output to
        `out` and `err`; return its exit code and whether it ran past `timeout`."""

    @abstractmethod
    def put_file(self, local: str | Path, remote: str) -> None:
        """Copy a local file to `remote` on the host, verified by SHA-256."""

    @abstractmethod
    def get_file(self, remote: str, local: str | Path) -> None:
        """Copy `remote` on the host to a local file, verified by SHA-256."""

    @abstractmethod
    def close(self) -> None:
        """Release the host's connections (nothing for this machine)."""

    def _fail(self, res: Result, what: str | None = None) -> RemoteError:
        tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
        detail = "\n  ".join(tail)
        return RemoteError(
            f"{self.spec.login}: {what or res.command!r} failed with exit code {res.exit_code}"
            + (f":\n  {detail}" if detail else "")
        )

    def exists(self, path: str) -> bool:
        """Whether `path` exists on the host (a dangling symlink counts as existing)."""
        q = shlex.quote(path)
        return self.run(f"test -e {q} || test -L {q}", check=False).exit_code == 0

    def realpath(self, path: str) -> str:
        """`path` with ``..`` and every symlink resolved, on the host (need not exist)."""
        return self.run(f"realpath -m -- {shlex.quote(path)}").stdout.strip()

    def disk_free(self, path: str) -> int:
        """Bytes available to this user on the filesystem holding `path` (or its nearest parent)."""
        q = shlex.quote(path)
        script = (
            f"p={q}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
            "df -P -B1 -- \"$p\" | tail -n 1"
        )
        fields = self.run(script).stdout.split()
        try:
            return int(fields[3])
        except (IndexError, ValueError):
            raise RemoteError(f"{self.spec.login}: cannot read free disk of {path}: {fields}") from None

    def mkdir(self, path: str) -> None:
        self.run(f"mkdir -p -- {shlex.quote(path)}")

    def read_text(self, path: str) -> str:
        res = self.run(f"cat -- {shlex.quote(path)}", check=False)
        if not res.ok:
            raise RemoteError(f"{self.spec.login}: cannot read {path}: {res.stderr.strip()}")
        return res.stdout

    def write_text(self, path: str, text: str) -> None:
        """Write `text` to `path` on the host atomically (temp file + rename)."""
        q = shlex.quote(path)
        tmp = shlex.quote(f"{path}.tmp-{os.getpid()}-{threading.get_ident()}")
        self.run(
            f"mkdir -p -- \"$(dirname -- {q})\" && printf %s {shlex.quote(text)} > {tmp} && mv -f -- {tmp} {q}"
        )

    def sha256(self, path: str) -> str:
        res = self.run(f"sha256sum -- {shlex.quote(path)}")
        return res.stdout.split()[0]

    def uri(self, path: str | Path) -> str:
        """A link to `path` a person can open from this machine: ``sftp://user@host:port/...``
        on an SSH host (`LocalHost`: ``file://``)."""
        return f"sftp://{self.spec.user_name}@{self.spec.host}:{self.spec.port}{path}"

    @property
    def on(self) -> str:
        """`` on user@host:port`` for a message about a path on an SSH host ('' here)."""
        return f" on {self.spec.login}"

    def gpu_count(self) -> int:
        """GPUs eyas may use on the host: the block's ``num_gpus`` (`LocalHost`: torch's CUDA
        device count, 0 without CUDA)."""
        return self.spec.num_gpus

    def devices(self) -> list[str]:
        """What one piece of work (a shard) is given to run on, one each: the host's GPU
        indices for ``CUDA_VISIBLE_DEVICES`` (``[""]``, nothing to set, without GPUs);
        `LocalHost`: torch devices, ``cuda:i`` or ``cpu``."""
        return [str(i) for i in range(self.gpu_count())] or [""]

    def call(self, here: Callable[[], Any], cmd: str, *, what: str,
             env: Mapping[str, str] | None = None, timeout: float | None = None) -> Any:
        """What `here` returns, computed on the host: `cmd` is the eyas entry point that
        computes it there and prints it as its last line, in JSON (None when it prints
        nothing). `LocalHost` calls `here` in this process instead. The one place where "in
        this process, or a command on the host" is decided. Raises RemoteError naming `what`,
        the exit code and the output's tail when the command fails."""
        res = self.run(cmd, env=env, timeout=timeout, check=False)
        if not res.ok:
            raise RemoteError(f"{self.spec.login}: {what} failed (exit {res.exit_code}): "
                              f"{(res.stderr or res.stdout).strip()[-2000:]}")
        lines = res.stdout.strip().splitlines()
        return json.loads(lines[-1]) if lines else None

    def put_dir(self, local: str | Path, remote: str, *, overwrite: bool = False) -> dict[str, str]:
        from eyas.remote.transfer import put_dir

        return put_dir(self, local, remote, overwrite=overwrite)

    def get_dir(self, remote: str, local: str | Path, *, overwrite: bool = False) -> dict[str, str]:
        from eyas.remote.transfer import get_dir

        return get_dir(self, remote, local, overwrite=overwrite)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalHost(Host):
    """This machine, through ``sh`` subprocesses: the same interface as `SSHHost`, no SSH."""

    def __init__(self, spec: HostSpec | None = None) -> None:
        self.spec = spec or HostSpec.local()

    def _execute(self, full: str, cmd: str, out: _LineWriter, err: _LineWriter,
                 timeout: float | None) -> tuple[int, bool]:
        """``sh -c`` in its own process group; the group dies on timeout, interrupt or a stop
        request (`eyas.stopping`)."""
        proc = subprocess.Popen(
            ["sh", "-c", full], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, text=True, encoding="utf-8",
            errors="replace",
        )
        lock = threading.Lock()

        def pump(pipe, writer: _LineWriter) -> None:
            for line in pipe:
                with lock:
                    writer.write(line)

        threads = [threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
                   threading.Thread(target=pump, args=(proc.stderr, err), daemon=True)]
        for t in threads:
            t.start()
        timed_out = False
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    _kill_group(proc)
                    break
                if stopping.wait(_WAIT_POLL_S):
                    stopping.check(f"stopped {cmd!r} here")
        except BaseException:
            _kill_group(proc)
            raise
        for t in threads:
            t.join()
        return proc.returncode, timed_out

    def uri(self, path: str | Path) -> str:
        return Path(path).resolve().as_uri()

    @property
    def on(self) -> str:
        return ""

    def call(self, here: Callable[[], Any], cmd: str, *, what: str,
             env: Mapping[str, str] | None = None, timeout: float | None = None) -> Any:
        return here()

    def gpu_count(self) -> int:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def devices(self) -> list[str]:
        return [f"cuda:{i}" for i in range(self.gpu_count())] or ["cpu"]

    def put_file(self, local: str | Path, remote: str) -> None:
        """Copy a file, verified by SHA-256."""
        _copy_verified(Path(local), Path(remote), self.spec.login)

    def get_file(self, remote: str, local: str | Path) -> None:
        _copy_verified(Path(remote), Path(local), self.spec.login)

    def close(self) -> None:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _copy_verified(src: Path, dst: Path, login: str) -> None:
    if not src.is_file():
        raise RemoteError(f"{login}: {src} is not a file")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".tmp-{dst.name}.{os.getpid()}")
    shutil.copyfile(src, tmp)
    if sha256_file(tmp) != sha256_file(src):
        tmp.unlink()
        raise RemoteError(f"{login}: copy of {src} to {dst} does not match its checksum")
    os.replace(tmp, dst)


class SSHHost(Host):
    """A host reached over SSH with Fabric; one `Connection` per calling thread."""

    def __init__(self, spec: HostSpec) -> None:
        if spec.kind != "ssh":
            raise ConfigError(f"SSHHost needs kind 'ssh', got {spec.kind!r}", where="host.kind")
        self.spec = spec
        self._local = threading.local()
        self._all: list = []
        self._lock = threading.Lock()

    # -- connections -------------------------------------------------------------------------

    def connection(self):
        """This thread's open Fabric `Connection` (opened on first use, host key verified)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and conn.is_connected:
            return conn
        conn = open_connection(self.spec)
        self._local.conn = conn
        with self._lock:
            self._all.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection this object opened (in any thread)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
        self._local = threading.local()

    # -- commands ----------------------------------------------------------------------------

    def _execute(self, full: str, cmd: str, out: _LineWriter, err: _LineWriter,
                 timeout: float | None) -> tuple[int, bool]:
        """Through this thread's connection, guarded (`guarded_command`): the host stops the
        command on timeout (exit 124) and when the channel closes."""
        from invoke.exceptions import CommandTimedOut

        conn = self.connection()
        runner = None
        try:
            stopping.check(f"before {cmd!r} on {self.spec.login}")
            promise = conn.run(
                guarded_command(full, timeout=timeout), warn=True, hide=False, in_stream=False,
                out_stream=out, err_stream=err, encoding="utf-8", pty=False,
                # A backstop only: the host's own `timeout` normally ends the command first.
                timeout=None if timeout is None else timeout + KILL_GRACE_S + 30,
                asynchronous=True,
            )
            runner = promise.runner
            # Our own wait: an interrupt here, or a stop requested from another thread, leaves
            # through the `except` below, which closes the channel (the host's watchdog then
            # kills the command). Fabric's wait would forward Ctrl-C to the remote end instead.
            while not (runner.process_is_finished or runner.has_dead_threads):
                if stopping.wait(_WAIT_POLL_S):
                    stopping.check(f"stopped {cmd!r} on {self.spec.login}")
            r = promise.join()
        except CommandTimedOut:
            self._drop(conn)  # closing the channel makes the host's watchdog kill the group
            raise RemoteTimeoutError(
                f"{self.spec.login}: {cmd!r} ran past {timeout}s and the host did not stop it; "
                "closed the connection, which kills it there"
            ) from None
        except BaseException as exc:
            if runner is not None:
                with contextlib.suppress(Exception):
                    runner.stop()  # its backstop timer, its channel
            self._drop(conn)
            if isinstance(exc, Exception) and not isinstance(exc, RemoteError):
                raise RemoteError(f"{self.spec.login}: running {cmd!r} failed: {exc}") from exc
            raise
        return r.exited, timeout is not None and r.exited == 124

    def _drop(self, conn) -> None:
        with contextlib.suppress(Exception):
            conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    # -- files -------------------------------------------------------------------------------

    def put_file(self, local: str | Path, remote: str) -> None:
        """Upload a file over SFTP to a temp name, check its SHA-256 there, rename it into place."""
        local = Path(local)
        tmp = f"{remote}.tmp-{os.getpid()}-{threading.get_ident()}"
        self.run(f"mkdir -p -- \"$(dirname -- {shlex.quote(remote)})\"")
        try:
            self.connection().put(str(local), tmp)
        except Exception as exc:
            raise RemoteError(f"{self.spec.login}: upload of {local} to {remote} failed: {exc}") from exc
        if self.sha256(tmp) != sha256_file(local):
            self.run(f"rm -f -- {shlex.quote(tmp)}", check=False)
            raise RemoteError(f"{self.spec.login}: upload of {local} to {remote}: checksum differs")
        self.run(f"mv -f -- {shlex.quote(tmp)} {shlex.quote(remote)}")

    def get_file(self, remote: str, local: str | Path) -> None:
        """Download a file over SFTP to a temp name, check its SHA-256, rename it into place."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".tmp-{local.name}.{os.getpid()}")
        want = self.sha256(remote)
        try:
            self.connection().get(remote, str(tmp))
        except Exception as exc:
            raise RemoteError(f"{self.spec.login}: download of {remote} failed: {exc}") from exc
        if sha256_file(tmp) != want:
            tmp.unlink()
            raise RemoteError(f"{self.spec.login}: download of {remote}: checksum differs")
        os.replace(tmp, local)


def _host_key_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def open_connection(spec: HostSpec):
    """An open Fabric `Connection` to `spec`, with the host key verified against known hosts.

    Raises HostKeyError for an unknown or changed key, RemoteError (naming user, host, port)
    for a refused connection, a timeout or a rejected login key.
    """
    import paramiko
    from fabric import Config, Connection

    config = Config(overrides={"load_ssh_configs": False})
    kwargs: dict = {"look_for_keys": False, "allow_agent": False,
                    "banner_timeout": spec.connect_timeout, "auth_timeout": spec.connect_timeout,
                    # Opening a channel on a connection that died without a reset would wait
                    # an hour (paramiko's default): fail soon, and let the caller reconnect.
                    "channel_timeout": max(10.0, spec.connect_timeout)}
    if spec.key_filename:
        kwargs["key_filename"] = os.path.expanduser(spec.key_filename)
    if spec.key_passphrase is not None:
        kwargs["passphrase"] = spec.key_passphrase.get_secret_value()
    conn = Connection(
        spec.host, user=spec.user_name, port=spec.port, config=config,
        connect_kwargs=kwargs, connect_timeout=int(max(1, round(spec.connect_timeout))),
    )
    client = conn.client
    # Fabric installed AutoAddPolicy; never connect with it.
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    keys = client.get_host_keys()
    name = _host_key_name(spec.host, spec.port)
    if spec.host_key:
        ktype, blob = _parse_pinned_key(spec.host_key)
        keys.add(name, ktype, paramiko.PKey.from_type_string(ktype, blob))
    elif spec.known_hosts:
        path = os.path.expanduser(spec.known_hosts)
        if not os.path.isfile(path):
            raise HostKeyError(
                f"{spec.login}: the known_hosts file {path} does not exist (known_hosts="
                f"{spec.known_hosts!r}, host_key unset): no key to check {name}'s against. Get "
                "the key out of band, e.g. `ssh-keyscan -p PORT HOST`, compare its fingerprint "
                "with the host's admin, and write it to that file, or point known_hosts at "
                "yours, or set host_key")
        keys.load(path)
    if keys.lookup(name) is None:
        raise HostKeyError(
            f"{spec.login}: no known key for {name} (known_hosts={spec.known_hosts!r}, "
            "host_key unset). Get the key out of band, e.g. `ssh-keyscan -p PORT HOST`, compare "
            "its fingerprint with the host's admin, and add it to known_hosts or host_key"
        )
    try:
        conn.open()
    except paramiko.BadHostKeyException as exc:
        conn.close()
        raise HostKeyError(
            f"{spec.login}: host key CHANGED: the server offered {exc.key.get_name()} "
            f"{exc.key.fingerprint}, expected {exc.expected_key.fingerprint}. Refusing to connect "
            "(the host was reinstalled, or someone is in the middle)"
        ) from None
    except paramiko.AuthenticationException as exc:
        conn.close()
        raise RemoteError(
            f"{spec.login}: login refused for user {spec.user_name!r} with key "
            f"{spec.key_filename!r} ({exc}). Is its public key in the host's authorized_keys?"
        ) from None
    except TimeoutError as exc:
        conn.close()
        raise RemoteError(
            f"{spec.login}: timed out after {spec.connect_timeout}s connecting ({exc or 'timeout'})"
        ) from None
    except paramiko.SSHException as exc:
        conn.close()
        text = str(exc)
        if "known_hosts" in text:
            raise HostKeyError(f"{spec.login}: host key not accepted: {text}") from None
        raise RemoteError(f"{spec.login}: SSH handshake failed: {text}") from None
    except OSError as exc:
        conn.close()
        raise RemoteError(
            f"{spec.login}: cannot connect ({exc.strerror or exc}); is sshd listening there?"
        ) from None
    return conn


def _parse_pinned_key(text: str) -> tuple[str, bytes]:
    parts = text.split()
    if len(parts) < 2:
        raise ConfigError(f"expected 'TYPE BASE64', got {text!r}", where="host.host_key")
    try:
        return parts[0], base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise ConfigError("the key is not valid base64", where="host.host_key") from None


def connect(spec: HostSpec) -> SSHHost | LocalHost:
    """A `Host` for `spec`: `LocalHost` for ``kind: local``, else `SSHHost` (opened lazily)."""
    return LocalHost(spec) if spec.kind == "local" else SSHHost(spec)


def fingerprint(public_key_line: str) -> str:
    """``SHA256:...`` fingerprint of a ``TYPE BASE64`` key line, as ``ssh-keygen -lf`` prints it."""
    _, blob = _parse_pinned_key(public_key_line)
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@dataclass
class Timing:
    """Round-trip timings (seconds) of repeated calls."""

    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        s = sorted(self.samples)
        n = len(s)
        return (s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2) if n else float("nan")
