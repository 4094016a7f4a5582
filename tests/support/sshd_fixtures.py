"""A real OpenSSH sshd on 127.0.0.1 for the `ssh` tests, started once per session.

Keys (host and user) are generated into a temp folder; the known_hosts file holds the
host's real key. Tests never reach any address but 127.0.0.1.

The host is set up as a real GPU host is: its probe Python (`HostSpec.python`) is a bare
virtual environment that CANNOT import eyas, and eyas lives in another venv (`HostSpec.venv`,
here the environment of the interpreter running the tests, wherever it is). A command that
starts an eyas entry point with the probe Python fails here as it would on the users' host.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from eyas.remote.hosts import HostSpec

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def running_venv() -> Path:
    """The environment of the interpreter running the tests (``sys.prefix``: eyas is importable
    there), as a host's `HostSpec.venv`: its ``bin/python`` must be that interpreter's."""
    prefix = Path(sys.prefix)
    python = prefix / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{python} does not exist: run the ssh tests from a virtual "
                           f"environment (its bin/python is what a host's venv provides)")
    return prefix


EYAS_VENV = running_venv()
"""The host's eyas venv in the ssh tests: the running interpreter's (eyas is installed there)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, kind: str = "ed25519") -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "eyas-test", "-f", str(path)],
        check=True, capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip() if path.suffix else Path(
        str(path) + ".pub"
    ).read_text().strip()


@dataclass
class Sshd:
    """A running test sshd and the files a client needs to reach it."""

    port: int
    pid: int
    root: Path
    host_key_line: str
    user_key: Path
    other_key: Path
    known_hosts: Path
    data_root: Path
    probe_python: str
    """A Python on the host without eyas (a bare venv): what `HostSpec.python` is there."""

    def spec(self, **overrides) -> HostSpec:
        fields = dict(
            host="127.0.0.1", port=self.port, user=os.environ.get("USER") or _user(),
            key_filename=str(self.user_key), known_hosts=str(self.known_hosts),
            data_root=str(self.data_root), connect_timeout=5, python=self.probe_python,
            venv=str(EYAS_VENV),
        )
        fields.update(overrides)
        return HostSpec(**fields)


def _user() -> str:
    import getpass

    return getpass.getuser()


def bare_python(folder: Path) -> str:
    """A Python that has the standard library and nothing else: a venv without pip or eyas."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True,
                   capture_output=True)
    return str(folder / "bin" / "python")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory) -> Sshd:
    """Start ``sshd -D`` on a free loopback port; stop it at the end of the session."""
    yield from _serve(tmp_path_factory.mktemp("sshd"))


@pytest.fixture(scope="session")
def sshd2(tmp_path_factory) -> Sshd:
    """A second, independent sshd on another loopback port, with its own keys and data root:
    the other "host" of the multi-host tests."""
    yield from _serve(tmp_path_factory.mktemp("sshd2"))


def _serve(root: Path):
    """Run one test sshd with its files under `root` while the generator is suspended."""
    if not os.path.exists(SSHD):
        pytest.skip("openssh-server is not installed (.ci/run installs it)")
    host_key = root / "ssh_host_ed25519_key"
    host_line = _keygen(host_key)
    user_key, other_key = root / "user_key", root / "other_key"
    _keygen(user_key)
    _keygen(other_key)
    auth = root / "authorized_keys"
    auth.write_text(Path(str(user_key) + ".pub").read_text())
    auth.chmod(0o600)
    port = _free_port()
    cfg = root / "sshd_config"
    cfg.write_text(
        "\n".join([
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {host_key}",
            f"PidFile {root / 'sshd.pid'}",
            f"AuthorizedKeysFile {auth}",
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password",
            "Subsystem sftp internal-sftp",
            "LogLevel ERROR",
            "MaxStartups 100",
            "MaxSessions 50",
            "",
        ])
    )
    os.makedirs("/run/sshd", exist_ok=True)  # privilege-separation folder sshd insists on
    log = open(root / "sshd.log", "wb")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdout=log, stderr=log)
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.close()
            raise RuntimeError(f"sshd did not start: {(root / 'sshd.log').read_text()}")
        time.sleep(0.05)
    known = root / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_line.rsplit(' ', 1)[0]}\n")
    data_root = root / "data"
    data_root.mkdir()
    probe_python = bare_python(root / "probe-venv")
    try:
        server = Sshd(port, proc.pid, root, host_line.rsplit(" ", 1)[0], user_key, other_key,
                      known, data_root, probe_python)
        _check_probe_python(server)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _check_probe_python(server: Sshd) -> None:
    """The probe Python must not see eyas over SSH (else the tests above prove nothing)."""
    from eyas.remote.hosts import SSHHost

    with SSHHost(server.spec()) as host:
        res = host.run(f"{server.probe_python} -c 'import eyas'", check=False)
    if res.ok:
        raise RuntimeError(f"{server.probe_python} imports eyas over SSH; the host would not")
