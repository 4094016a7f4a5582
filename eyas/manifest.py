"""Manifests: every output says where it came from and whether it is complete.

A phase writes its data files first (atomically), then ``manifest.json`` last. A folder
without a verifying manifest is, by definition, partial.

`output_state` answers the question an orchestrator's cache asks before trusting a result:
does this output still hold, made from these inputs with these settings? On a GPU host the
same answer comes from ``python -m eyas.manifest`` (`command`), one JSON line.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import glob
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import eyas
from eyas.io import read_json, sha256_file, write_json
from eyas.verified import file_sha256, remember_written, stamp_of

MANIFEST_NAME = "manifest.json"


def code_version() -> str:
    """eyas version, plus the git commit when running from a checkout."""
    version = eyas.__version__
    repo = Path(__file__).resolve().parent.parent
    if (repo / ".git").exists():
        try:
            sha = subprocess.run(
                ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                capture_output=True, text=True, timeout=5, check=True,
            ).stdout.strip()
            if sha:
                version += f"+g{sha}"
        except (OSError, subprocess.SubprocessError):
            pass
    return version


def config_fingerprint(config: Any) -> str:
    """A stable hash of a JSON-able config (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_manifest(
    folder: str | Path,
    *,
    phase: str,
    inputs: dict[str, str | Path] | None = None,
    outputs: list[str | Path] | None = None,
    config: Any = None,
    counts: dict[str, Any] | None = None,
    known_sha256: dict[str, str] | None = None,
) -> Path:
    """Write ``folder/manifest.json`` describing a finished output.

    `inputs` maps a label to an input file whose SHA-256 is recorded; `outputs` are
    files inside `folder` whose size and SHA-256 are recorded so `verify_manifest`
    can detect an empty, truncated or corrupted file later. `known_sha256` maps
    ``str(path)`` to a hash the caller computed while streaming that very file (saves
    re-reading gigabytes); paths not in it are hashed here. Each output's hash is remembered
    as its writer's (`eyas.verified.remember_written`) against the file's stamp, so the first
    reader of the finished output -- the folder renamed into place included -- does not read
    it again to verify it.
    """
    folder = Path(folder)
    known = known_sha256 or {}

    def digest(p: Path) -> str:
        return known.get(str(p)) or sha256_file(p)

    record: dict[str, Any] = {
        "phase": phase,
        "complete": True,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "code_version": code_version(),
        "inputs": {k: {"path": str(p), "sha256": digest(Path(p))} for k, p in (inputs or {}).items()},
        "outputs": {},
        "config": config,
        "config_fingerprint": config_fingerprint(config),
        "counts": counts or {},
    }
    for out in outputs or []:
        p = Path(out)
        p = p if p.is_absolute() else folder / p
        stamp = stamp_of(p)
        record["outputs"][p.name] = {"bytes": p.stat().st_size, "sha256": digest(p)}
        remember_written(p, record["outputs"][p.name]["sha256"], stamp)
    path = folder / MANIFEST_NAME
    write_json(path, record)
    return path


def read_manifest(folder: str | Path) -> dict | None:
    """The manifest of `folder`, or None when there is none."""
    path = Path(folder) / MANIFEST_NAME
    if not path.exists():
        return None
    return read_json(path)


def verify_manifest(folder: str | Path, *, check_hashes: bool = True) -> list[str]:
    """Problems that make `folder` not a complete output; empty list when it verifies.

    With `check_hashes`, each output's SHA-256 is compared with the manifest's; a file
    unchanged since an earlier trusted hash is not read again (`eyas.verified.file_sha256`;
    ``EYAS_VERIFY=full`` reads everything).
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return [f"{folder}: no {MANIFEST_NAME} (output missing or interrupted)"]
    problems = []
    if not manifest.get("complete"):
        problems.append(f"{folder}/{MANIFEST_NAME}: not marked complete")
    for name, meta in manifest.get("outputs", {}).items():
        p = folder / name
        if not p.exists():
            problems.append(f"{p}: listed in the manifest but missing")
        elif p.stat().st_size != meta["bytes"]:
            problems.append(f"{p}: {p.stat().st_size} bytes, manifest says {meta['bytes']}")
        elif check_hashes and file_sha256(p) != meta["sha256"]:
            problems.append(f"{p}: checksum differs from the manifest (corrupted?)")
    return problems


def input_hashes(inputs: dict[str, str | Path]) -> dict[str, str]:
    """SHA-256 of each input file, by label (memoised per path, size, mtime and ctime). An input that
    is a manifest counts by what it says was made (`manifest_identity`), not by its bytes."""
    out = {}
    for label, p in inputs.items():
        st = os.stat(p)
        key = (str(Path(p).resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key not in _HASH_MEMO:
            _HASH_MEMO[key] = (manifest_identity(p) if Path(p).name == MANIFEST_NAME
                               else file_sha256(p))
        out[label] = _HASH_MEMO[key]
    return out


RUN_STAMPS = ("created", "code_version")
"""Manifest fields that say when and by which build an output was made, not what it is."""


def manifest_identity(path: str | Path) -> str:
    """SHA-256 of what a manifest says was made: its outputs' checksums, counts, config and
    inputs' checksums -- without the run stamps (`RUN_STAMPS`) or the inputs' paths. The same
    output made again (a shard redone after a crash, in another folder) has the same identity,
    so what was made from it stays valid."""
    record = read_json(path)
    if not isinstance(record, dict):
        return sha256_file(path)
    view = {k: v for k, v in record.items() if k not in RUN_STAMPS}
    if isinstance(view.get("inputs"), dict):
        view["inputs"] = {k: v.get("sha256") if isinstance(v, dict) else v
                          for k, v in view["inputs"].items()}
    return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()


_HASH_MEMO: dict[tuple[str, int, int, int], str] = {}


def is_up_to_date(folder: str | Path, inputs: dict[str, str | Path], config: Any) -> bool:
    """True when `folder` holds a complete output made from these exact inputs and config.

    Complete means its manifest verifies (files present, sizes and checksums match);
    made from means the recorded input checksums and config fingerprint are the same.
    """
    manifest = read_manifest(folder)
    if manifest is None or verify_manifest(folder):
        return False
    if manifest.get("config_fingerprint") != config_fingerprint(config):
        return False
    recorded = {k: v["sha256"] for k, v in manifest.get("inputs", {}).items()}
    try:
        return recorded == input_hashes(inputs)
    except FileNotFoundError:
        return False


def output_state(folder: str | Path, inputs: dict[str, str | Path], config: Any,
                 stamp: str | Path | None = None) -> dict[str, Any]:
    """Whether `folder` holds an output made from `inputs` with `config`, and the inputs'
    checksums (what a cache key is made of).

    Without `stamp`, the folder's own manifest must verify and record these input checksums
    and this config's fingerprint (`is_up_to_date`). With `stamp` (a JSON file that
    `write_stamp` wrote once the output was made), the folder's manifest must verify and the
    stamp must record them: for outputs whose manifest records other things (an exported
    drafter, an evaluation).

    An input path holding ``*`` stands for every file it matches, sorted (``label/<name>``
    each; none is no input): the manifests of a folder of shards, say.

    Returns ``{"inputs": {label: sha256} | None, "problems": [str]}``: ``inputs`` is None
    when an input is missing (named in ``problems``); ``problems`` is empty when the output
    holds.
    """
    try:
        hashes: dict[str, str] | None = input_hashes(expand_inputs(inputs))
    except FileNotFoundError as exc:
        return {"inputs": None, "problems": [f"input missing: {exc.filename}"]}
    problems = verify_manifest(folder)
    if problems:
        return {"inputs": hashes, "problems": problems}
    fingerprint = config_fingerprint(config)
    if stamp is None:
        manifest = read_manifest(folder) or {}
        recorded = {k: v["sha256"] for k, v in manifest.get("inputs", {}).items()}
        made_with = manifest.get("config_fingerprint")
        where = f"{Path(folder) / MANIFEST_NAME}"
    else:
        record = read_json(stamp) if Path(stamp).is_file() else {}
        recorded, made_with, where = record.get("inputs"), record.get("config_fingerprint"), str(stamp)
    if made_with != fingerprint:
        problems.append(f"{where}: made with other settings ({made_with} != {fingerprint})")
    if recorded != hashes:
        changed = sorted(k for k in set(recorded or {}) | set(hashes)
                         if (recorded or {}).get(k) != hashes.get(k))
        problems.append(f"{where}: made from other inputs ({', '.join(changed[:5])})")
    return {"inputs": hashes, "problems": problems}


def expand_inputs(inputs: dict[str, str | Path]) -> dict[str, str | Path]:
    """`inputs` with each path holding ``*`` replaced by the files it matches, sorted, as
    ``<label>/<path after the pattern's fixed part>``."""
    out: dict[str, str | Path] = {}
    for label, path in inputs.items():
        if "*" not in str(path):
            out[label] = path
            continue
        base = str(path).split("*", 1)[0].rsplit("/", 1)[0]
        for match in sorted(glob.glob(str(path))):
            out[f"{label}/{os.path.relpath(match, base)}"] = match
    return out


def write_stamp(stamp: str | Path, inputs: dict[str, str | Path], config: Any) -> None:
    """Record, once an output is made, the inputs' checksums and the config's fingerprint it
    was made from (what `output_state` with `stamp` compares)."""
    write_json(stamp, {"inputs": input_hashes(expand_inputs(inputs)), "config_fingerprint": config_fingerprint(config),
                       "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})


def command(python: str, action: str, folder: str, inputs: dict[str, str], config: Any,
            stamp: str | None = None) -> str:
    """The shell command that runs `main` with `python` (on a host: its eyas interpreter):
    `action` ``state`` prints `output_state` as one JSON line, ``stamp`` runs `write_stamp`."""
    q = shlex.quote
    cmd = (f"{q(python)} -m eyas.manifest {action} --folder {q(folder)} "
           f"--config-json {q(json.dumps(config, sort_keys=True, default=str))}")
    cmd += "".join(f" --input {q(f'{label}={path}')}" for label, path in sorted(inputs.items()))
    return cmd + (f" --stamp {q(stamp)}" if stamp else "")


def main(argv: list[str] | None = None) -> int:
    """``python -m eyas.manifest state|stamp --folder F [--input LABEL=PATH ...]
    --config-json J [--stamp FILE]``: `output_state` as one JSON line, or `write_stamp`."""
    p = argparse.ArgumentParser(prog="python -m eyas.manifest", description=main.__doc__)
    p.add_argument("action", choices=["state", "stamp"])
    p.add_argument("--folder", required=True)
    p.add_argument("--input", action="append", default=[], help="LABEL=PATH (repeatable)")
    p.add_argument("--config-json", required=True)
    p.add_argument("--stamp", default=None)
    args = p.parse_args(argv)
    inputs = dict(item.split("=", 1) for item in args.input)
    config = json.loads(args.config_json)
    if args.action == "stamp":
        if not args.stamp:
            p.error("stamp needs --stamp FILE")
        write_stamp(args.stamp, inputs, config)
        return 0
    sys.stdout.write(json.dumps(output_state(args.folder, inputs, config, args.stamp)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
