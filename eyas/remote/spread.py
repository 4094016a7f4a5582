"""A split extracted on several hosts that share no storage: its merged input staged on each,
its finished shards delivered to the run's home host, its placement recorded there.

Every copy is relayed through this machine (`eyas.remote.transfer`: verified file by file,
renamed into place), so a reader never sees half a file or half a shard; nothing here knows
Prefect (`tasks.extract` wraps it, `flows.extract` decides what goes where).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from eyas.errors import DataError, RemoteError
from eyas.layout import RunLayout
from eyas.remote.hosts import HostSpec, connect
from eyas.remote.transfer import relay_dir, relay_file


def stage_input(home: HostSpec, home_workdir: str, host: HostSpec, workdir: str,
                split: str) -> tuple[str, str]:
    """Put the run's merged `split` (on `home`) on `host` unless it is there already with the
    same SHA-256. Returns ``("present" or "copied", its SHA-256)``."""
    src = str(RunLayout(Path(home_workdir)).merged(split))
    dst = str(RunLayout(Path(workdir)).merged(split))
    with connect(home) as hh, connect(host) as h:
        want = hh.sha256(src)
        if h.exists(dst) and h.sha256(dst) == want:
            return "present", want
        relay_file(hh, src, h, dst)
    return "copied", want


def deliver_shard(host: HostSpec, workdir: str, home: HostSpec, home_workdir: str, split: str,
                  shard: str) -> dict[str, str]:
    """Move a finished shard from `host` to the run's `home` host: relayed, its files checked
    against the SHA-256 its manifest records, then removed from `host`. Returns the delivered
    ``{file: sha256}``. Raises RemoteError when the shard is missing on `host` or does not
    match its manifest (it then stays on `host`)."""
    src = str(RunLayout(Path(workdir)).hidden_dir(split) / shard)
    dst = str(RunLayout(Path(home_workdir)).hidden_dir(split) / shard)
    with connect(host) as h, connect(home) as hh:
        if not h.exists(f"{src}/manifest.json"):
            raise RemoteError(f"{host.login}: {src} has no manifest: nothing to deliver")
        sums = relay_dir(h, src, hh, dst)
        outputs = json.loads(hh.read_text(f"{dst}/manifest.json")).get("outputs", {})
        wrong = sorted(name for name, meta in outputs.items() if sums.get(name) != meta["sha256"])
        if wrong or not outputs:
            raise RemoteError(f"{home.login}: {dst}: delivered files differ from the shard's "
                              f"manifest: {wrong or 'no outputs listed'}")
        h.run(f"rm -rf -- {shlex.quote(src)}")
    return sums


def read_placement(home: HostSpec, workdir: str, split: str) -> dict | None:
    """The recorded placement of `split` on the run's home host (None when there is none);
    DataError for an unreadable record."""
    path = str(RunLayout(Path(workdir)).placement(split))
    with connect(home) as h:
        if not h.exists(path):
            return None
        try:
            return json.loads(h.read_text(path))
        except ValueError as exc:
            raise DataError(f"unreadable placement record ({exc}); delete it to place the "
                            "shards afresh", path=path) from None


def write_placement(home: HostSpec, workdir: str, split: str, record: dict) -> None:
    """Record `split`'s placement on the run's home host (written atomically)."""
    with connect(home) as h:
        h.write_text(str(RunLayout(Path(workdir)).placement(split)),
                     json.dumps(record, indent=2, sort_keys=True) + "\n")
