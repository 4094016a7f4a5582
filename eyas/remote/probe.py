"""Status probe of a run's work directory on a host (`eyas status`).

One round trip runs a stdlib-only script (`_probe_script.py`) with the host's Python. It
reports, per phase output folder: complete by its manifest (sizes always, SHA-256 with
`check_hashes`) or not, with the problems found; partial leftovers (``.tmp-*`` files and
folders); record/token counts of prepared datasets (from ``stats.json``); per hidden-state split
(``hidden/<split>``) the complete and partial shards with their samples, tokens and bytes; the
drafter (export verified by its manifest, checkpoint step); free disk; and the next phase with
the bytes it needs. A phase that would not fit is refused by `check_fits` before it starts.
`eyas status` also reports the host's interpreter (``--python``), glibc and NVIDIA driver and
what they lack for the run (`eyas.remote.host_check`; SGLang's needs with
``extract.backend: sglang`` or ``--sglang``).

Next phase: ``generate/tokenize`` until every configured dataset is prepared, then ``merge``,
then ``extract`` until every merged split with records has all its records in complete shards,
then ``train`` (needs little disk: 0 is reported), and ``done`` once ``drafter/export`` verifies
(hidden states may have been cleaned away since; the prepared and merged data may not).

Hidden states (phase 4) take ``tokens × captured states × hidden size × bytes per value``:
3 auxiliary + 1 final state by default, 2 bytes in bf16. For Kimi-K2.5 (H = 7168) and the
users' 87.8M merged tokens that is 87.8e6 × 4 × 7168 × 2 ≈ 5.0 TB. With a storage format
(``extract.storage`` of the config, or ``--storage``) the bytes per token are those of
`eyas.extract.plan.bytes_per_token` instead ("compact" about 3·H). Tokens already in complete
shards are not counted again.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from eyas.disk import (
    DTYPE_ALIASES,
    DTYPE_BYTES,
    DiskSpaceError,
    dtype_bytes,
    human_bytes,
    require_free,
)
from eyas.errors import ConfigError, RemoteError
from eyas.extract.plan import bytes_per_token
from eyas.remote.host_check import HostNeeds, host_problems, probe_host
from eyas.remote.hosts import Host, HostSpec, connect, shell_join


def hidden_state_bytes(
    tokens: int, hidden_size: int, *, captured: int = 4, bytes_per_value: int = 2
) -> int:
    """Bytes of hidden states for `tokens` tokens: tokens × captured × hidden_size × bytes."""
    return tokens * captured * hidden_size * bytes_per_value


def check_fits(
    needed: int, free: int, *, margin: float = 0.10, reserve_bytes: int = 0, what: str = "",
    where: str = "",
) -> None:
    """Refuse (DiskSpaceError) unless ``free >= needed × (1 + margin) + reserve_bytes``.

    The message names the place, the figures and what to do.
    """
    require_free(needed, free, margin=margin, reserve_bytes=reserve_bytes,
                 where=where or "host", what=what or "the next phase",
                 advice="Delete obsolete outputs (`eyas clean`), or point the output at a "
                        "larger volume.")


def shard_expectation(cfg, target: str | None = None) -> dict:
    """What the configured extraction writes into a shard's manifest, for the probe: its
    ``shard_size``, ``storage``, ``topk``, ``dtype``, ``aux_layers`` (None: the target's
    default) and ``target`` (the target folder as the host sees it; default: the config's
    ``target.model`` as written, relative to the YAML)."""
    from eyas.extract.shards import storage_settings
    from eyas.prepare.phases import builds_target, resolve_target

    if target is None:
        # A target eyas builds (eyas:tiny, gguf:<file>) lives in this machine's cache.
        target = str(resolve_target(cfg) if builds_target(cfg.target.model)
                     else cfg.resolve_path(cfg.target.model))
    return {"shard_size": cfg.extract.shard_size, **storage_settings(cfg.extract),
            "aux_layers": cfg.extract.aux_layers, "target": target}


def probe_workdir(host: Host, workdir: str, *, check_hashes: bool = False,
                  shards: dict | None = None) -> dict:
    """The raw probe of `workdir` on `host` (see `_probe_script.py` for the keys); `shards`
    (`shard_expectation`) makes it judge each shard's recorded settings and records."""
    source = (Path(__file__).parent / "_probe_script.py").read_text(encoding="utf-8")
    res = host.run(
        shell_join(host.spec.python, "-c", source, workdir, "1" if check_hashes else "0",
                   *([json.dumps(shards)] if shards is not None else [])),
        check=False,
    )
    if not res.ok:
        raise RemoteError(
            f"{host.spec.login}: probe of {workdir} with {host.spec.python} failed "
            f"(exit {res.exit_code}): {res.stderr.strip()[-500:]}"
        )
    return json.loads(res.stdout)


@dataclass
class StatusReport:
    """What `status` found, ready for the terminal (`text`), a table artifact or JSON."""

    login: str
    workdir: str
    raw: dict
    expected: list[str] = field(default_factory=list)
    generated: list[str] = field(default_factory=list)
    """Datasets expected under ``generated/`` (those the target answers again); a dataset
    kept as given (``regenerate: false``) has no generated output and is not missing there."""
    next_phase: str | None = None
    needed_bytes: int | None = None
    fits: bool | None = None
    refusal: str | None = None
    host: dict | None = None
    """The host's interpreter, glibc and driver (``summary``) and what it lacks for the run's
    venv (``problems``, `eyas.remote.host_check`); None when not checked."""

    @property
    def free_bytes(self) -> int:
        return int(self.raw["free_bytes"])

    def rows(self) -> list[dict]:
        """One row per output folder (and per expected dataset or split that has none).

        Keys: ``phase`` (generated, prepared, merged, hidden, drafter), ``name``, ``state``
        (complete, partial, missing), ``records`` (samples for hidden), ``tokens``, ``bytes``,
        ``cut_answers`` (generated, prepared: samples with an answer cut at max_tokens; None
        when unknown), ``problems`` (the first three) and ``detail`` (answers cut, shard
        counts, checkpoint step; or "").
        """
        rows = []
        for phase in ("generated", "prepared", "merged"):
            outs = self.raw["phases"].get(phase, {})
            wanted = {"generated": self.generated, "prepared": self.expected}.get(phase, [])
            names = sorted(set(outs) | set(wanted))
            for name in names:
                out = outs.get(name)
                if out is None:
                    rows.append(_row(phase, name, "missing"))
                    continue
                stats = out.get("stats") or {}
                counts = out.get("counts") or {}
                state = "complete" if out["complete"] else "partial"
                if out["tmp_files"] and out["complete"]:
                    state = "complete (+tmp files)"
                cut = stats.get("cut_answers", counts.get("cut_answers"))
                detail = ""
                if cut:
                    dropped = stats.get("cut_answers_dropped") or 0
                    detail = (f"{cut:,} answer(s) cut at max_tokens"
                              + (f", {dropped:,} dropped" if dropped else ""))
                rows.append({
                    "phase": phase, "name": name, "state": state,
                    "records": stats.get("samples", stats.get("records", counts.get("records"))),
                    "tokens": stats.get("tokens", counts.get("tokens")),
                    "bytes": out["bytes"],
                    "cut_answers": cut,
                    "problems": "; ".join(out["problems"][:3]),
                    "detail": detail,
                })
        return rows + self._hidden_rows() + self._drafter_rows()

    def _hidden_rows(self) -> list[dict]:
        hidden = self.raw["phases"].get("hidden", {})
        merged = self.raw["phases"].get("merged", {}).get("merged")
        splits = split_sizes(merged) if merged and merged["complete"] else {}
        rows = []
        for name in sorted(set(hidden) | {s for s, (rec, _) in splits.items() if rec}):
            h = hidden.get(name)
            if h is None:
                rows.append(_row("hidden", name, "missing"))
                continue
            records = splits.get(name, (None, None))[0]
            detail = f"{h['shards_complete']} shards complete, {h['shards_partial']} partial"
            if h.get("shards_stale"):
                detail += f", {h['shards_stale']} made with other settings (to redo)"
            if h["quarantined"]:
                detail += f", {h['quarantined']} quarantined"
            if records is not None:
                detail += f"; {h['samples'] + h['quarantined']:,} of {records:,} records"
            if h["storage"]:
                detail += f" ({', '.join(map(str, h['storage']))})"
            rows.append({"phase": "hidden", "name": name,
                         "state": "complete" if split_complete(h, records) else "partial",
                         "records": h["samples"], "tokens": h["tokens"], "bytes": h["bytes"],
                         "cut_answers": None, "problems": "; ".join(h["problems"][:3]),
                         "detail": detail})
        return rows

    def _drafter_rows(self) -> list[dict]:
        d = self.raw["phases"].get("drafter", {}).get("drafter")
        if d is None:
            return [_row("drafter", "drafter", "missing")] if self.next_phase == "train" else []
        export = d.get("export")
        parts = []
        if export is None:
            parts.append("no export")
        else:
            parts.append("export verified" if export["complete"] else "export incomplete")
        if d["checkpoint"]:
            step = d.get("checkpoint_step")
            parts.append("checkpoint" + ("" if step is None else f" at step {step:,}"))
        if d["best"]:
            sim = (d.get("best_metrics") or {}).get("simulated_acceptance_length")
            parts.append("best" + ("" if sim is None else f" (sim. acceptance {sim:.3f})"))
        if d["tmp"]:
            parts.append(f"{len(d['tmp'])} temporary folder(s)")
        return [{"phase": "drafter", "name": "drafter",
                 "state": "complete" if export_complete(d) else "partial",
                 "records": None, "tokens": None, "bytes": d["bytes"], "cut_answers": None,
                 "problems": "; ".join((export or {}).get("problems", [])[:3]),
                 "detail": ", ".join(parts)}]

    def to_dict(self) -> dict:
        return {
            "host": self.login, "workdir": self.workdir, "free_bytes": self.free_bytes,
            "next_phase": self.next_phase, "needed_bytes": self.needed_bytes, "fits": self.fits,
            "refusal": self.refusal, "outputs": self.rows(), "stray": self.raw.get("stray", []),
            "host_check": self.host, "raw": self.raw,
        }

    def text(self) -> str:
        lines = [f"{self.login}  {self.workdir}", ""]
        lines.append(f"{'phase':<10} {'name':<24} {'state':<22} {'records':>10} {'tokens':>14} "
                     f"{'size':>10}")
        for r in self.rows():
            rec = "" if r["records"] is None else f"{r['records']:,}"
            tok = "" if r["tokens"] is None else f"{r['tokens']:,}"
            lines.append(f"{r['phase']:<10} {r['name']:<24} {r['state']:<22} {rec:>10} {tok:>14} "
                         f"{human_bytes(r['bytes']):>10}")
            if r.get("detail"):
                lines.append(f"{'':<10}   {r['detail']}")
            if r["problems"]:
                lines.append(f"{'':<10}   ! {r['problems']}")
        for p in self.raw.get("stray", []):
            lines.append(f"leftover from an interrupted run: {p}")
        for note in self.raw.get("notes", []):
            lines.append(f"note: {note}")
        lines.append("")
        if self.host is not None:
            lines.append(f"host: {self.host['summary']}")
            lines.extend(f"host ! {p}" for p in self.host["problems"])
        lines.append(f"free disk: {human_bytes(self.free_bytes)}")
        if self.next_phase == "done":
            lines.append("next phase: done (the drafter is exported)")
        elif self.next_phase:
            need = "unknown" if self.needed_bytes is None else human_bytes(self.needed_bytes)
            verdict = {True: "fits", False: "DOES NOT FIT", None: ""}[self.fits]
            lines.append(f"next phase: {self.next_phase}, needs {need} {verdict}".rstrip())
        if self.refusal:
            lines.append(self.refusal)
        return "\n".join(lines)


def _row(phase: str, name: str, state: str) -> dict:
    return {"phase": phase, "name": name, "state": state, "records": None, "tokens": None,
            "bytes": 0, "cut_answers": None, "problems": "", "detail": ""}


def split_sizes(merged: dict) -> dict[str, tuple[int | None, int | None]]:
    """{split: (records, tokens)} of a merged output's probe, from ``stats.json`` (``train`` /
    ``eval``); without per-split figures, the whole set as ``train``; {} when nothing is known."""
    stats = merged.get("stats") or {}
    counts = merged.get("counts") or {}
    out = {}
    for split in ("train", "eval"):
        s = stats.get(split)
        if isinstance(s, dict) and ("records" in s or "tokens" in s):
            out[split] = (s.get("records"), s.get("tokens"))
    if not out:
        records = stats.get("records", counts.get("records"))
        tokens = stats.get("tokens", counts.get("tokens"))
        if records is not None or tokens is not None:
            out["train"] = (records, tokens)
    return out


def split_complete(h: dict, records: int | None) -> bool:
    """A hidden split's probe is complete: no partial shard, and every one of its `records`
    in a complete shard (stored or quarantined); with `records` unknown, the run's summary
    must be written and name no more shards than are complete."""
    if h["shards_partial"]:
        return False
    if records is not None:
        return h["samples"] + h["quarantined"] >= records
    summary = h.get("summary")
    return summary is not None and h["shards_complete"] >= int(summary.get("num_shards") or 0)


def export_complete(drafter: dict | None) -> bool:
    """The drafter's probe holds an export that verifies by its manifest."""
    export = (drafter or {}).get("export")
    return bool(export and export["complete"])


def _next_phase(raw: dict, expected: list[str], hidden_size: int | None, captured: int,
                bytes_per_value: int, per_token: int | None = None) -> tuple[str | None, int | None]:
    """(next phase, bytes it needs or None when unknown); see the module docstring.

    `per_token` (bytes per token of the configured storage) replaces
    ``captured × hidden_size × bytes_per_value`` for extraction."""
    phases = raw["phases"]
    prepared = phases.get("prepared", {})
    names = expected or sorted(prepared)
    if not names or any(not prepared.get(n, {}).get("complete") for n in names):
        return "generate/tokenize", None
    merged = phases.get("merged", {}).get("merged")
    if merged is None or not merged["complete"]:
        # The merge rewrites the prepared records once (truncated, shuffled): about their size.
        return "merge", sum(prepared[n]["bytes"] for n in names)
    # Done with a verified export even once the hidden states are cleaned away -- but not
    # while the data it was trained from is gone or damaged.
    if export_complete(phases.get("drafter", {}).get("drafter")):
        return "done", None
    hidden = phases.get("hidden", {})
    splits = {s: rt for s, rt in split_sizes(merged).items() if rt[0] != 0}
    if splits:
        todo = {s: rt for s, rt in splits.items()
                if s not in hidden or not split_complete(hidden[s], rt[0])}
    else:  # no figures: only the splits on disk can tell
        todo = {s: (None, None) for s, h in hidden.items() if not split_complete(h, None)}
        todo = todo if hidden else {"train": (None, None)}
    if not todo:
        return "train", 0
    if any(t is None for _, t in todo.values()) or (hidden_size is None and per_token is None):
        return "extract", None
    tokens = sum(max(0, int(t) - (hidden[s]["tokens"] if s in hidden else 0))
                 for s, (_, t) in todo.items())
    if per_token is not None:
        return "extract", tokens * per_token
    return "extract", hidden_state_bytes(tokens, hidden_size, captured=captured,
                                         bytes_per_value=bytes_per_value)


def status(
    host: Host,
    workdir: str,
    *,
    expected: list[str] | None = None,
    hidden_size: int | None = None,
    captured: int = 4,
    dtype: str = "bfloat16",
    margin: float = 0.10,
    reserve_bytes: int = 0,
    check_hashes: bool = False,
    storage: str | None = None,
    topk: int = 32,
    generated: list[str] | None = None,
    shards: dict | None = None,
    host_needs: HostNeeds | None = None,
) -> StatusReport:
    """Probe `workdir` on `host` and judge whether the next phase fits in free disk.

    `expected` lists the configured datasets (a missing one shows as ``missing``), and
    `generated` those of them the target answers again (default: all of `expected`; pass the
    ones with ``regenerate: true``): only they are missing without a ``generated/`` output.
    `shards` (`shard_expectation` of the config) makes a shard that verifies but was made
    with other settings or from other records count as stale (to redo), not complete. With
    `storage` ("final" | "topk" | "compact", and `topk`) and `hidden_size`, extraction is
    sized by `eyas.extract.plan.bytes_per_token` (in `dtype`); without it, by `captured`
    states of `dtype`. With `host_needs` (`eyas.remote.host_check.needs_for`), the host's
    interpreter, glibc and NVIDIA driver are checked too and each mismatch is listed
    (`StatusReport.host`). Never raises for a phase that would not fit: the report says so
    (`fits`, `refusal`); call `check_fits` before starting the phase. Raises ValueError for
    an unknown `storage`, or a `dtype` that storage cannot hold.
    """
    per_token = None
    if storage is not None and hidden_size is not None:
        per_token = bytes_per_token(hidden_size, storage, dtype=dtype, topk=topk)
    raw = probe_workdir(host, workdir, check_hashes=check_hashes, shards=shards)
    report = StatusReport(host.spec.login, workdir, raw, sorted(expected or []),
                          sorted(expected or [] if generated is None else generated))
    if host_needs is not None:
        facts = probe_host(host)
        report.host = {"summary": facts.summary(),
                       "problems": host_problems(facts, host_needs)}
    report.next_phase, report.needed_bytes = _next_phase(
        raw, report.expected, hidden_size, captured, dtype_bytes(dtype), per_token)
    if report.needed_bytes is not None:
        try:
            check_fits(report.needed_bytes, report.free_bytes, margin=margin,
                       reserve_bytes=reserve_bytes, what=report.next_phase,
                       where=f"{host.spec.login}:{workdir}")
            report.fits = True
        except DiskSpaceError as exc:
            report.fits, report.refusal = False, str(exc)
    return report


# ---------------------------------------------------------------- CLI glue (eyas status / clean)


def add_host_arguments(parser: argparse.ArgumentParser) -> None:
    """Options naming a host: ``--host user@addr[:port]`` (default: this machine) and its keys."""
    g = parser.add_argument_group("host")
    g.add_argument("--host", default=None,
                   help="user@address[:port] of a GPU host; default: this machine (no SSH)")
    g.add_argument("--key", default=None, help="private key file for the login")
    g.add_argument("--known-hosts", default="~/.ssh/known_hosts", help="known_hosts file")
    g.add_argument("--host-key", default=None, help='pinned host key, "ssh-ed25519 AAAA..."')
    g.add_argument("--data-root", default="/data", help="folder eyas may write/delete on the host")
    g.add_argument("--python", default="python3",
                   help="Python on the host: runs the status probe; checked against what the "
                        "run needs (e.g. python3.11 for SGLang)")


def parse_login(text: str) -> tuple[str | None, str, int]:
    """(user or None, address, port) of ``[user@]address[:port]`` (``[::1]:2222`` for an IPv6
    address with a port). Raises ConfigError (``--host``) for an empty address or a port
    that is not a number in 1..65535."""
    user, _, rest = text.rpartition("@")
    if rest.startswith("["):
        addr, _, tail = rest[1:].partition("]")
        port = tail.removeprefix(":")
    else:
        addr, _, port = rest.partition(":")
    if not addr:
        raise ConfigError(f"{text!r}: no address; expected user@address[:port]", where="--host")
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ConfigError(f"{text!r}: port {port!r} is not a number in 1..65535; expected "
                          f"user@address[:port]", where="--host")
    return user or None, addr, int(port or 22)


def spec_from_args(args: argparse.Namespace) -> HostSpec:
    """A HostSpec from `add_host_arguments` options."""
    if not args.host:
        return HostSpec(kind="local", known_hosts=None, data_root=args.data_root,
                        python=args.python)
    user, addr, port = parse_login(args.host)
    return HostSpec(host=addr, port=port, user=user, key_filename=args.key,
                    known_hosts=args.known_hosts, host_key=args.host_key,
                    data_root=args.data_root, python=args.python)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``eyas status``."""
    parser.add_argument("--config", default=None,
                        help="pipeline YAML: expected datasets, and the extraction settings a "
                             "complete shard must have been made with")
    parser.add_argument("--target", default=None,
                        help="the target folder on the host, when it differs from the config's "
                             "target.model (shards made from another target count as stale)")
    parser.add_argument("--workdir", required=True, help="the run's work directory on the host")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--hidden-size", type=int, default=None,
                        help="target hidden size (default: the target's config.json, if local)")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPE_BYTES) + sorted(DTYPE_ALIASES),
                        help="hidden-state dtype (default: extract.dtype of --config, else bfloat16)")
    parser.add_argument("--storage", default=None, choices=["final", "topk", "compact"],
                        help="extraction storage (default: extract.storage of --config; without "
                             "either, --captured states per token)")
    parser.add_argument("--topk", type=int, default=None,
                        help="K of storage topk/compact (default: extract.topk of --config, else 32)")
    parser.add_argument("--captured", type=int, default=4,
                        help="hidden states kept per token (3 aux + 1 final)")
    parser.add_argument("--margin", type=float, default=0.10, help="extra share of free disk")
    parser.add_argument("--reserve-gb", type=float, default=0.0, help="GB always left free")
    parser.add_argument("--verify-hashes", action="store_true",
                        help="also check SHA-256 of every output (slow on large outputs)")
    parser.add_argument("--sglang", action="store_true",
                        help="check the host for SGLang 0.5.23 (Python 3.11-3.13, glibc >= 2.34, "
                             "NVIDIA driver >= 580.65.06); implied by extract.backend: sglang "
                             "in --config")
    add_host_arguments(parser)


def hidden_size_from_config(cfg) -> int | None:
    """The target's hidden size from its local config.json (its ``text_config`` for Kimi-K2.5's
    wrapper), or None when it is not readable here."""
    from eyas.hf_target import text_config

    try:
        path = cfg.resolve_path(cfg.target.model) / "config.json"
        return int(text_config(json.loads(path.read_text()))["hidden_size"])
    except (OSError, KeyError, ValueError, TypeError):
        return None


def add_clean_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``eyas clean``."""
    parser.add_argument("paths", nargs="+", help="absolute paths on the host to delete")
    parser.add_argument("--in-use", action="append", default=[],
                        help="a path the current run uses (repeatable); never deleted")
    parser.add_argument("--yes", action="store_true", help="really delete (default: dry run)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    add_host_arguments(parser)


def clean_main(args: argparse.Namespace) -> int:
    """``eyas clean``: plan, print, delete with ``--yes``; exit 0, or 2 when a path was refused."""
    from eyas.remote.clean import execute_clean, plan_clean, wait_for_running_deletions

    def say(line: str) -> None:
        print(line, file=sys.stderr if args.json else sys.stdout, flush=True)

    with connect(spec_from_args(args)) as host:
        # A deletion an earlier `eyas clean` left running (its connection dropped) ends first.
        wait_for_running_deletions(host, say)
        plan = plan_clean(host, args.paths, in_use=args.in_use)
        if not args.json:
            say(plan.text())
        report = execute_clean(host, plan, confirm=args.yes, say=say)
    if args.json:
        print(json.dumps({"dry_run": report.dry_run, "deleted": report.deleted,
                          "bytes_freed": report.bytes_freed, "refused": report.refused,
                          "plan": report.plan.to_dict()}, indent=2, sort_keys=True))
    else:
        print(report.text())
    return 2 if report.refused else 0
