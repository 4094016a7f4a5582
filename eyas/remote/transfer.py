"""Folder transfers, verified file by file with SHA-256.

A folder travels as one tar file (one SFTP transfer instead of one per file), is unpacked
beside its destination under a ``.tmp-`` name, checked against the sender's checksum list, and
only then renamed into place: a reader never sees half a folder. Symlinks and special files are
refused (a dataset folder holds regular files).
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import tarfile
import tempfile
from pathlib import Path

from eyas import stopping
from eyas.errors import RemoteError
from eyas.io import sha256_file


def local_checksums(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every regular file under `folder`, sorted.

    Raises RemoteError for a symlink or special file (they would not round-trip safely).
    """
    sums: dict[str, str] = {}
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            p = Path(root) / name
            rel = p.relative_to(folder).as_posix()
            if p.is_symlink() or not p.is_file():
                raise RemoteError(f"{p}: not a regular file (symlinks are not transferred)")
            if "\n" in rel:
                raise RemoteError(f"{p!r}: file names with newlines are not supported")
            sums[rel] = sha256_file(p)
    return dict(sorted(sums.items()))


def remote_checksums_cmd(folder: str) -> str:
    """Shell text printing ``sha256  ./relative/path`` for each regular file under `folder`."""
    q = shlex.quote(folder)
    return (
        f"cd {q} && if [ -n \"$(find . ! -type f ! -type d | head -n 1)\" ]; then "
        "echo 'not a regular file:' $(find . ! -type f ! -type d | head -n 1) >&2; exit 4; fi; "
        "find . -type f -print0 | sort -z | xargs -0 -r sha256sum --"
    )


def parse_checksums(text: str) -> dict[str, str]:
    """Parse ``sha256sum`` output of `remote_checksums_cmd` into ``{relative path: sha256}``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        digest, _, path = line.partition("  ")
        out[path[2:] if path.startswith("./") else path] = digest
    return dict(sorted(out.items()))


def _diff(want: dict[str, str], got: dict[str, str]) -> list[str]:
    problems = [f"missing {p}" for p in sorted(set(want) - set(got))]
    problems += [f"unexpected {p}" for p in sorted(set(got) - set(want))]
    problems += [f"checksum differs: {p}" for p in sorted(set(want) & set(got)) if want[p] != got[p]]
    return problems


def put_dir(host, local: str | Path, remote: str, *, overwrite: bool = False) -> dict[str, str]:
    """Copy folder `local` to `remote` on `host`; return the verified ``{path: sha256}``.

    Raises RemoteError when `remote` exists (unless `overwrite`) or a checksum differs; on
    failure the destination is left as it was.
    """
    local = Path(local)
    if not local.is_dir():
        raise RemoteError(f"{local}: not a folder")
    want = local_checksums(local)
    if host.exists(remote) and not overwrite:
        raise RemoteError(f"{host.spec.login}: {remote} already exists (pass overwrite=True)")
    token = secrets.token_hex(4)
    stage = f"{remote.rstrip('/')}.tmp-{token}"
    tar_remote = f"{stage}.tar"
    with tempfile.TemporaryDirectory(prefix="eyas-put-") as tmp:
        tar_local = Path(tmp) / "dir.tar"
        with tarfile.open(tar_local, "w") as tf:
            for rel in want:
                tf.add(local / rel, arcname=rel, recursive=False)
        host.put_file(tar_local, tar_remote)
    qs, qt, qr = shlex.quote(stage), shlex.quote(tar_remote), shlex.quote(remote)
    try:
        host.run(f"mkdir -p {qs} && tar -xf {qt} -C {qs} && rm -f {qt}")
        got = parse_checksums(host.run(remote_checksums_cmd(stage)).stdout)
        problems = _diff(want, got)
        if problems:
            raise RemoteError(f"{host.spec.login}: {remote}: transfer not verified: {problems[:5]}")
        old = f"{remote.rstrip('/')}.old-{token}"
        host.run(
            f"if [ -e {qr} ]; then mv {qr} {shlex.quote(old)}; fi && mv {qs} {qr} && "
            f"rm -rf -- {shlex.quote(old)}"
        )
    finally:
        with stopping.shielded():  # clean-up: runs after a stop request too
            host.run(f"rm -rf -- {qs} {qt}", check=False)
    return want


def get_dir(host, remote: str, local: str | Path, *, overwrite: bool = False) -> dict[str, str]:
    """Copy folder `remote` on `host` to `local`; return the verified ``{path: sha256}``.

    Checksums are taken on the host before packing and checked here after unpacking.
    """
    local = Path(local)
    if local.exists() and not overwrite:
        raise RemoteError(f"{local} already exists (pass overwrite=True)")
    res = host.run(remote_checksums_cmd(remote), check=False)
    if not res.ok:
        raise RemoteError(f"{host.spec.login}: cannot list {remote}: {res.stderr.strip()}")
    want = parse_checksums(res.stdout)
    tar_remote = f"{remote.rstrip('/')}.tmp-{secrets.token_hex(4)}.tar"
    local.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".tmp-{local.name}.", dir=local.parent))
    try:
        host.run(f"tar -cf {shlex.quote(tar_remote)} -C {shlex.quote(remote)} .")
        try:
            host.get_file(tar_remote, stage / ".dir.tar")
        finally:
            with stopping.shielded():
                host.run(f"rm -f -- {shlex.quote(tar_remote)}", check=False)
        with tarfile.open(stage / ".dir.tar") as tf:
            tf.extractall(stage, filter="data")
        (stage / ".dir.tar").unlink()
        got = local_checksums(stage)
        problems = _diff(want, got)
        if problems:
            raise RemoteError(f"{host.spec.login}: {remote}: transfer not verified: {problems[:5]}")
        if local.exists():
            shutil.rmtree(local)
        os.replace(stage, local)
    finally:
        if stage.exists():
            shutil.rmtree(stage)
    return want


def relay_file(src_host, src: str, dst_host, dst: str) -> str:
    """Copy file `src` on one host to `dst` on another through this machine (a temporary file
    here), verified by SHA-256 at each step and renamed into place there; return its SHA-256.
    """
    with tempfile.TemporaryDirectory(prefix="eyas-relay-") as tmp:
        local = Path(tmp) / "file"
        src_host.get_file(src, local)
        dst_host.put_file(local, dst)
        return sha256_file(local)


def relay_dir(src_host, src: str, dst_host, dst: str) -> dict[str, str]:
    """Copy folder `src` on one host to `dst` on another through this machine; return the
    verified ``{path: sha256}``.

    Every file is checked against the sender's checksums on arrival here and again there. The
    folder is assembled under a ``.tmp-`` name beside `dst` and only then renamed into place
    (an older `dst` is replaced), so a reader there never sees half a folder, and an
    interrupted copy leaves only a ``.tmp-`` folder that readers skip. Raises RemoteError when
    a checksum differs.
    """
    parent, _, name = dst.rstrip("/").rpartition("/")
    token = secrets.token_hex(4)
    stage = f"{parent}/.tmp-{name}-relay-{token}"
    old = f"{parent}/.tmp-{name}-old-{token}"
    with tempfile.TemporaryDirectory(prefix="eyas-relay-") as tmp:
        local = Path(tmp) / name
        want = get_dir(src_host, src, local)
        try:
            got = put_dir(dst_host, local, stage)
            if got != want:
                raise RemoteError(f"{dst_host.spec.login}: {dst}: relayed files differ from "
                                  f"{src_host.spec.login}:{src}: {_diff(want, got)[:5]}")
            qd, qs, qo = shlex.quote(dst), shlex.quote(stage), shlex.quote(old)
            dst_host.run(f"if [ -e {qd} ]; then mv -- {qd} {qo}; fi && mv -- {qs} {qd} && "
                         f"rm -rf -- {qo}")
        finally:
            with stopping.shielded():
                dst_host.run(f"rm -rf -- {shlex.quote(stage)}", check=False)
    return want
