"""Safe deletion of obsolete outputs on a host (e.g. an old run's 924 GB of hidden states).

Two steps, so nothing is deleted by accident:

    plan = plan_clean(host, ["/data/runs/old/hidden_states"], data_root="/data",
                      in_use=["/data/runs/new"])
    print(plan.text())                          # what, how many bytes, what is refused and why
    report = execute_clean(host, plan, confirm=True)   # without confirm: a dry run

Every path is resolved ON THE HOST (``realpath``: ``..`` and symlinks), then refused when it is
relative, outside `data_root`, the root itself, eyas's own job records, a symlink (whose target
is outside the root, or inside it: name the target itself), or overlaps (contains, or lies
inside) a path in use: the caller's `in_use` list, and the cwd and declared paths of every
running job on the host. `execute_clean` plans again right before deleting and deletes only what
both plans allow, unchanged; the job itself checks each path's folders once more where it
deletes (`deletion_script`), so a folder swapped for a symlink after the last plan is refused,
never followed out of `data_root`. Running it twice is harmless: the second run finds nothing and
frees 0 bytes. Sizes are the sum of the regular files' sizes, the figures ``ls`` shows.

The deletion itself runs on the host as a detached job (`eyas.remote.jobs`, id ``clean-...``,
declaring the paths it deletes as in use): a dropped connection, a closed laptop or a killed
flow does not stop it halfway. A later `execute_clean` first waits for a deletion job still
running there, then plans again.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import asdict, dataclass, field

from eyas.disk import human_bytes
from eyas.errors import RemoteError
from eyas.remote.hosts import Host, LineSink
from eyas.remote.jobs import attach, job_dir, list_jobs, new_job_id, running_jobs, start_job

CLEAN_PREFIX = "clean"
"""Job id prefix of deletion jobs."""


def is_within(path: str, root: str) -> bool:
    """Whether `path` equals `root` or lies below it (plain, already-resolved POSIX strings)."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


@dataclass(frozen=True)
class CleanItem:
    """One requested path: what it resolves to on the host and whether it may be deleted."""

    path: str
    real: str
    kind: str
    """``dir``, ``file``, ``symlink``, ``other`` or ``absent``."""
    bytes: int = 0
    link_target: str | None = None
    refused: str | None = None

    @property
    def deletable(self) -> bool:
        return self.refused is None and self.kind != "absent"


@dataclass
class CleanPlan:
    """What `execute_clean` would delete on a host, and what it refuses."""

    login: str
    data_root: str
    real_root: str
    in_use: list[str]
    items: list[CleanItem]
    in_use_real: dict[str, str] = field(default_factory=dict)

    @property
    def to_delete(self) -> list[CleanItem]:
        return [i for i in self.items if i.deletable]

    @property
    def refused(self) -> list[CleanItem]:
        return [i for i in self.items if i.refused is not None]

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.to_delete)

    def text(self) -> str:
        lines = [f"Clean plan on {self.login} (data_root {self.real_root}):"]
        for i in self.items:
            if i.refused:
                lines.append(f"  REFUSED  {i.path}: {i.refused}")
            elif i.kind == "absent":
                lines.append(f"  absent   {i.path} (nothing to delete)")
            else:
                lines.append(f"  delete   {i.real}  {human_bytes(i.bytes)} ({i.kind})")
        lines.append(f"  total: {human_bytes(self.bytes)} in {len(self.to_delete)} path(s)")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"login": self.login, "data_root": self.real_root, "bytes": self.bytes,
                "items": [asdict(i) for i in self.items], "in_use": self.in_use_real}


@dataclass
class CleanReport:
    """What `execute_clean` did (or, for a dry run, would do)."""

    dry_run: bool
    deleted: list[str]
    bytes_freed: int
    refused: list[tuple[str, str]]
    plan: CleanPlan

    def text(self) -> str:
        head = "DRY RUN (nothing deleted; pass confirm to delete)" if self.dry_run else "Deleted"
        lines = [head + ":"] + [f"  {p}" for p in self.deleted]
        lines += [f"  refused {p}: {why}" for p, why in self.refused]
        verb = "would free" if self.dry_run else "freed"
        lines.append(f"  {verb} {human_bytes(self.bytes_freed)}")
        return "\n".join(lines)


def refusal(
    item: CleanItem, *, real_root: str, in_use: dict[str, str]
) -> str | None:
    """Why `item` must not be deleted, or None. Pure: tested without a host.

    `in_use` maps resolved paths to who uses them (``current run``, ``job <id>``).
    """
    if not item.path.startswith("/"):
        return "not an absolute path"
    if item.kind == "symlink":
        target = item.link_target or "?"
        if not is_within(target, real_root):
            return f"a symlink leading outside data_root (to {target})"
        return f"a symlink (to {target}); name the target itself"
    if item.real == real_root.rstrip("/"):
        return "is the data root itself"
    if not is_within(item.real, real_root):
        return f"outside data_root {real_root} (resolves to {item.real})"
    if is_within(item.real, posixpath.join(real_root, ".eyas")):
        return "holds eyas's own job records and environments"
    for used, who in sorted(in_use.items()):
        if is_within(used, item.real) or is_within(item.real, used):
            return f"in use by {who} ({used})"
    return None


def _inspect_script(paths: list[str]) -> str:
    """One round trip: per path ``<index>\\t<realpath>\\t<kind>\\t<bytes>\\t<link target>``."""
    body = []
    for n, p in enumerate(paths):
        if not p.startswith("/"):  # refused anyway; never hand it to find/realpath
            body.append(f'printf "%s\\t\\t%s\\t0\\t\\n" {n} absent')
            continue
        q = shlex.quote(p)
        body.append(
            f"p={q}; r=$(realpath -m -- \"$p\"); t=; b=0; "
            'if [ -L "$p" ]; then k=symlink; t=$(realpath -m -- "$p"); '
            'r=$(realpath -m -- "$(dirname -- "$p")")/$(basename -- "$p"); '
            'elif [ -d "$p" ] || [ -f "$p" ]; then k=dir; [ -f "$p" ] && k=file; '
            "b=$(find \"$p\" -type f -printf '%s\\n' | awk '{s+=$1} END {printf \"%d\", s}'); "
            'elif [ -e "$p" ]; then k=other; else k=absent; fi; '
            f'printf "%s\\t%s\\t%s\\t%s\\t%s\\n" {n} "$r" "$k" "$b" "$t"'
        )
    return "; ".join(body)


def _inspect(host: Host, paths: list[str]) -> list[tuple[str, str, int, str]]:
    if not paths:
        return []
    for p in paths:
        if "\n" in p or "\t" in p:
            raise RemoteError(f"path {p!r} holds a newline or tab; refusing")
    rows = [line.split("\t") for line in host.run(_inspect_script(paths)).stdout.splitlines()]
    out: list[tuple[str, str, int, str]] = [("", "absent", 0, "")] * len(paths)
    for row in rows:
        idx, real, kind, size, target = row
        out[int(idx)] = (real, kind, int(size or 0), target)
    return out


def running_job_paths(host: Host) -> dict[str, str]:
    """Paths the host's running jobs use (their cwd and declared `uses`) → ``job <id>``."""
    used: dict[str, str] = {}
    for st in list_jobs(host):
        if st.state == "running":
            for p in ([st.cwd] if st.cwd else []) + list(st.uses):
                used[p] = f"running job {st.job_id}"
    return used


def plan_clean(
    host: Host, paths: list[str], *, data_root: str | None = None, in_use: list[str] | None = None
) -> CleanPlan:
    """Resolve `paths` on `host` and decide, per path, whether it may be deleted.

    `data_root` defaults to the host's; `in_use` lists the current run's paths. Running jobs'
    paths are added. Raises RemoteError when `data_root` does not exist on the host.
    """
    data_root = data_root or host.spec.data_root
    used = {p: "the current run" for p in (in_use or [])}
    used.update(running_job_paths(host))
    used_list = sorted(used)
    resolved = _inspect(host, [data_root, *used_list, *paths])
    root_real, root_kind, _, root_target = resolved[0]
    if root_kind == "symlink":
        root_real, root_kind = root_target, "dir"
    if root_kind != "dir":
        raise RemoteError(f"{host.spec.login}: data_root {data_root} is not a folder there")
    in_use_real: dict[str, str] = {}
    for p, (real, kind, _, target) in zip(used_list, resolved[1 : 1 + len(used_list)], strict=True):
        in_use_real[target if kind == "symlink" else real] = used[p]
    items = []
    for p, (real, kind, size, target) in zip(paths, resolved[1 + len(used_list) :], strict=True):
        item = CleanItem(p, real, kind, size, target or None)
        why = refusal(item, real_root=root_real, in_use=in_use_real)
        items.append(CleanItem(p, real, kind, size if why is None else 0, target or None, why))
    return CleanPlan(host.spec.login, data_root, root_real, list(in_use or []), items, in_use_real)


CHANGED = "changed since the plan"
"""What the deletion job says of a path it refuses at the last moment."""


def deletion_script(paths: list[str]) -> str:
    """Shell text that deletes `paths` (resolved, checked) one by one, says so per path, and
    exits 1 when one is still there afterwards.

    Re-checked where it deletes, against a race with the plan: the job enters each path's
    parent with ``cd -P`` and requires ``pwd -P`` to be that very parent (no component turned
    into a symlink, renamed or swapped since), then deletes ``./<name>`` relative to the
    folder it holds, so a later swap of a component cannot redirect it. A path whose parent
    changed is refused (CHANGED), not deleted."""
    lines = ["rc=0"]
    for p in paths:
        parent, name = posixpath.split(p.rstrip("/"))
        q, qp, qn = shlex.quote(p), shlex.quote(parent or "/"), shlex.quote("./" + name)
        lines.append(
            f"if ( cd -P -- {qp} 2>/dev/null && [ \"$(pwd -P)\" = {qp} ] || exit 3; "
            f"rm -rf --one-file-system -- {qn}; if [ -e {qn} ] || [ -L {qn} ]; then exit 1; fi )"
            f"; then echo \"deleted \"{q}; "
            f"elif [ $? -eq 3 ]; then echo \"refused \"{q}\": a folder on its path "
            f"{CHANGED} (now $(realpath -m -- {qp}))\"; rc=1; "
            f"else echo \"still there: \"{q}; rc=1; fi")
    lines.append("exit $rc")
    return "\n".join(lines)


def wait_for_running_deletions(host: Host, say: LineSink | None = None) -> list[str]:
    """Wait for the deletion jobs still running on `host` (started by an earlier call whose
    connection dropped); return their ids."""
    ids = running_jobs(host, CLEAN_PREFIX + "-")
    for job_id in ids:
        if say is not None:
            say(f"waiting for the deletion started earlier on {host.spec.login} (job {job_id})")
        attach(host, job_id, poll_interval=1.0, cancel_on_interrupt=False)
    return ids


def execute_clean(host: Host, plan: CleanPlan, *, confirm: bool = False,
                  say: LineSink | None = None) -> CleanReport:
    """Delete what `plan` allows, only when `confirm`; otherwise report what would be freed.

    Waits for a deletion job still running on the host, then plans again: an item is
    deleted only when the fresh plan still allows it and it resolves to the same place. The
    deletion runs as one detached job on the host (see the module docstring), followed until
    it ends; an interrupt here leaves it running (`say` is told its id). Returns the paths
    deleted and the bytes freed. Raises RemoteError naming the job and its log when a path
    is still there afterwards.
    """
    refused = [(i.path, i.refused or "") for i in plan.refused]
    if not confirm:
        return CleanReport(True, [i.real for i in plan.to_delete], plan.bytes, refused, plan)
    wait_for_running_deletions(host, say)
    fresh = plan_clean(host, [i.path for i in plan.items], data_root=plan.data_root,
                       in_use=plan.in_use)
    todo: list[CleanItem] = []
    for old, new in zip(plan.items, fresh.items, strict=True):
        if not old.deletable:
            continue
        if new.refused:
            refused.append((new.path, new.refused))
            continue
        if new.kind == "absent":
            continue
        if (new.real, new.kind) != (old.real, old.kind):
            refused.append((new.path, f"changed since the plan (now {new.kind} at {new.real})"))
            continue
        todo.append(new)
    if not todo:
        return CleanReport(False, [], 0, refused, fresh)
    reals = [i.real for i in todo]
    job = start_job(host, deletion_script(reals), job_id=new_job_id(CLEAN_PREFIX), uses=reals)
    if say is not None:
        say(f"deleting {len(reals)} path(s) on {host.spec.login} as job {job.job_id}; it "
            "finishes even if this connection drops")
    said: list[str] = []

    def hear(line: str) -> None:
        said.append(line)
        if say is not None:
            say(line)

    try:
        code = attach(host, job.job_id, stream=hear, poll_interval=0.5, cancel_on_interrupt=False)
    except BaseException:
        if say is not None:
            say(f"stopped following job {job.job_id}: the deletion goes on on the host")
        raise
    left = [p for p in reals if host.exists(p)]
    changed = [line for line in said if CHANGED in line]
    if code != 0 or left:
        raise RemoteError(
            f"{host.spec.login}: deletion job {job.job_id} exited with {code}; "
            + ("; ".join(changed) + "; " if changed else "")
            + f"still there: {', '.join(left) or 'nothing'} "
            f"(log: {job_dir(host.spec.data_root, job.job_id)}/log)"
        )
    return CleanReport(False, reals, sum(i.bytes for i in todo), refused, fresh)
