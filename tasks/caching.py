"""A Prefect cache that never lies: a hit only while the task's output still holds.

Prefect's own policies key a result by the task's inputs and source; they cannot see a
folder deleted, moved away or corrupted behind their back, and would report the task Cached
while its output is gone. `VerifiedOutput` asks the output itself, every time:

- key: the task's source (changed code invalidates), the folder, the checksums of the files
  it is made from and the fingerprint of the settings that shape it (`Output`);
- no key (no caching at all) while an input is missing: the task runs and says what is missing;
- when the output no longer holds (`eyas.manifest.output_state`: its manifest does not verify,
  or it was made from other inputs or settings) the policy refuses the hit: the record under
  the key is expired, so the task runs and its new result is stored under the same key.

On a GPU host the check is one command over SSH (``python -m eyas.manifest state``, with the
host's eyas interpreter). A task that finds its work already done by its manifest (a complete
shard, a finished training) returns `skipped`: a Completed state named "Skipped".
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect.cache_policies import TASK_SOURCE, CachePolicy
from prefect.context import TaskRunContext
from prefect.logging import get_logger
from prefect.states import Completed, State
from prefect.utilities.hashing import hash_objects

from eyas.manifest import command as manifest_command
from eyas.manifest import config_fingerprint
from eyas.remote.hosts import HostSpec
from tasks.hosts import eyas_python, open_host

logger = get_logger("eyas.caching")

SKIPPED = "Skipped"
"""Name of the Completed state of a task whose manifest says its work is already done."""


@dataclass(frozen=True)
class Output:
    """What a cached task makes: a folder, from input files, with settings (JSON-able), on a
    host (None: this machine). `stamp`: the JSON file recording inputs and settings when the
    folder's own manifest records other things (see `eyas.manifest.output_state`)."""

    folder: str
    inputs: dict[str, str]
    settings: Any
    host: HostSpec | None = None
    stamp: str | None = None


def check(out: Output) -> dict[str, Any]:
    """`eyas.manifest.output_state` of `out`, here or on its host."""
    from eyas.manifest import output_state

    cmd = manifest_command(eyas_python(out.host), "state", out.folder, out.inputs, out.settings, out.stamp)
    with open_host(out.host) as host:
        return host.call(lambda: output_state(out.folder, out.inputs, out.settings, out.stamp),
                         cmd, what=f"checking {out.folder}")


def input_checksums(inputs: dict[str, str], host: HostSpec | None) -> dict[str, str] | None:
    """SHA-256 of each input (patterns expanded, see `eyas.manifest.output_state`), here or on
    `host`; None when one is missing."""
    # No output folder to verify: only the inputs are read.
    return check(Output(f"{next(iter(inputs.values()), '/')}.no-output", inputs, None,
                        host=host))["inputs"]


def stamp(out: Output) -> None:
    """Record `out`'s inputs and settings in its stamp file (`Output.stamp`), here or on its
    host; a task calls it once its output is made."""
    if out.stamp is None:
        raise ValueError(f"{out.folder}: no stamp file to write")
    from eyas.manifest import write_stamp

    cmd = manifest_command(eyas_python(out.host), "stamp", out.folder, out.inputs, out.settings, out.stamp)
    with open_host(out.host) as host:
        host.call(lambda: write_stamp(out.stamp, out.inputs, out.settings), cmd,
                  what=f"stamping {out.folder}")


@dataclass
class VerifiedOutput(CachePolicy):
    """Key by task source, output folder, input checksums and settings; hit only while the
    output holds. `output` maps the task's parameters to its `Output` (None: no caching)."""

    output: Callable[[dict[str, Any]], Output | None] = field(default=lambda params: None)

    def compute_key(self, task_ctx: TaskRunContext, inputs: dict[str, Any],
                    flow_parameters: dict[str, Any], **kwargs: Any) -> str | None:
        out = self.output(inputs)
        if out is None:
            return None
        state = check(out)
        if state["inputs"] is None:
            return None  # the task runs, and names what is missing
        key = hash_objects(TASK_SOURCE.compute_key(task_ctx, inputs, flow_parameters),
                           out.folder, out.host.login if out.host else "local",
                           sorted(state["inputs"].items()), config_fingerprint(out.settings),
                           raise_on_failure=True)
        if state["problems"]:
            refuse_hit(task_ctx, key, state["problems"])
        return key


def refuse_hit(task_ctx: TaskRunContext, key: str, problems: list[str]) -> None:
    """Expire the cached result under `key` (if any): the task then runs, and its result
    replaces the record. Logged with the first problem found."""
    store = task_ctx.result_store
    if not store.exists(key):
        return
    try:
        from prefect import get_run_logger

        log = get_run_logger()
    except Exception:  # noqa: BLE001 - outside a run: the module's logger
        log = logger
    log.info("cached result refused, the output no longer holds: %s", problems[0])
    past = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=1)
    store.write(None, key=key, expiration=past)


def skipped(result: Any, message: str) -> State:
    """A Completed state named "Skipped" holding `result`: the task found its work done."""
    return Completed(name=SKIPPED, data=result, message=message)
