"""Ship eyas to a host: build the wheel here, install it into a venv there, once per version.

    result = ship(host, extras=["sglang"])   # "installed" or "skipped"

The wheel holds the Prefect-free core (``eyas``); Prefect and Fabric come only with the
``orchestrate`` extra, which a GPU host does not need. A marker file in the venv
(``.eyas-installed.json``) records the version, a hash of the package's source and the extras;
when all three match, nothing happens. SGLang pins its own torch: give it its own venv
(``venv=...``) rather than mixing it with the control plane's. eyas is not on a package index:
the control plane on a host (phases 1-2 there) is shipped the same way,
``ship(host, extras=["orchestrate"], venv="/data/.eyas/control")``.

Before a venv is built the host is checked (`eyas.remote.host_check`): its ``python`` (the
host's `spec.python`) is in the range the extras need (SGLang 0.5.23: 3.11-3.13), and for
``sglang`` glibc >= 2.34 and an NVIDIA driver >= 580.65.06; each mismatch is one line of the
error.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import eyas
from eyas.errors import RemoteError
from eyas.remote.host_check import check_host
from eyas.remote.hosts import Host, shell_join

REPO = Path(__file__).resolve().parents[2]
MARKER = ".eyas-installed.json"


def snapshot(repo: Path, dest: Path) -> Path:
    """Copy what the core wheel is built from (pyproject, README, ``eyas/``) into `dest`.

    Building from a copy leaves the checkout untouched (no build/ or egg-info there) and makes
    the hash and the wheel describe the same bytes.
    """
    import shutil

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (repo / name).exists():
            shutil.copy2(repo / name, dest / name)
    shutil.copytree(repo / "eyas", dest / "eyas",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".tmp-*"))
    return dest


def source_hash(repo: Path = REPO) -> str:
    """SHA-256 over pyproject.toml and every file of the ``eyas`` package, in sorted order."""
    h = hashlib.sha256()
    files = [repo / "pyproject.toml"] + sorted(
        p for p in (repo / "eyas").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    for p in files:
        h.update(p.relative_to(repo).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def build_wheel(out_dir: Path, repo: Path = REPO) -> Path:
    """Build the eyas wheel (no dependencies, no build isolation) into `out_dir`."""
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out_dir), str(repo)],
        capture_output=True, text=True,
    )
    wheels = sorted(out_dir.glob("eyas-*.whl"))
    if res.returncode != 0 or not wheels:
        raise RemoteError(f"building the eyas wheel in {repo} failed:\n{res.stderr[-2000:]}")
    return wheels[-1]


def ship(
    host: Host,
    *,
    extras: list[str] | None = None,
    venv: str | None = None,
    install_deps: bool = True,
    stream=None,
    repo: Path = REPO,
) -> str:
    """Install this checkout's eyas into `venv` on `host` (default ``spec.venv_path``).

    The venv is made with the host's `spec.python` (the `GpuHost` block's ``python``, e.g.
    ``python3.11``). Before anything is built, the host's interpreter, glibc and (for
    ``sglang``) NVIDIA driver are checked (`eyas.remote.host_check`).

    Returns ``"skipped"`` when that version + source hash + extras is already there, else
    ``"installed"``. Raises RemoteError naming each thing the host lacks, or when the venv or
    the install fails.
    """
    check_host(host, extras)
    venv = venv or host.spec.venv_path
    with tempfile.TemporaryDirectory(prefix="eyas-ship-") as tmp:
        src = snapshot(repo, Path(tmp) / "src")
        want = {"version": eyas.__version__, "source_hash": source_hash(src),
                "extras": sorted(extras or [])}
        qv = shlex.quote(venv)
        res = host.run(f"cat {qv}/{MARKER} 2>/dev/null || true")
        try:
            have = json.loads(res.stdout) if res.stdout.strip() else None
        except ValueError:
            have = None
        if have == want:
            return "skipped"
        py = f"{qv}/bin/python"
        host.run(f"test -x {py} || {shell_join(host.spec.python, '-m', 'venv', venv)}",
                 stream=stream)
        wheel = build_wheel(Path(tmp) / "dist", src)
        remote_wheel = f"{host.spec.data_root.rstrip('/')}/.eyas/wheels/{wheel.name}"
        host.put_file(wheel, remote_wheel)
    qw = shlex.quote(remote_wheel)
    host.run(f"{py} -m pip install -q --no-deps --force-reinstall {qw}", stream=stream)
    if install_deps:
        spec = f"{remote_wheel}[{','.join(want['extras'])}]" if want["extras"] else remote_wheel
        host.run(f"{py} -m pip install -q {shlex.quote(spec)}", stream=stream)
    check = f"import eyas, sys; sys.exit(eyas.__version__ != {eyas.__version__!r})"
    host.run(f"cd / && {py} -c {shlex.quote(check)}")  # cd /: not this checkout's eyas
    host.write_text(f"{venv}/{MARKER}", json.dumps(want, sort_keys=True))
    return "installed"
