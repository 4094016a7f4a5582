"""The extraction phase without an orchestrator: plan, check disk, extract each shard, summarise.

On a GPU host::

    python -m eyas.extract.run --merged WORKDIR/merged/train.jsonl \\
        --out WORKDIR/hidden/train --model /models/target [--storage topk] [--shards 0,3]
        [--backend sglang --tp-size 8 --trust-remote-code]   # SGLang 0.5.23 (its own venv)

The summary (also written to ``<out>/extract_summary.json``) compares the bytes written with
the estimate made before starting. After each shard one JSON line reports it (``{"event":
"shard", "index": N, ...}``, or ``"shard-failed"`` with the error): an orchestrator that hands
one process many shards (``--shards 0,3,7``: one SGLang engine loaded once) follows each
shard's state from them. ``--keep-going`` goes on with the next shard when one fails (not
after a configuration or disk error, nor after an SGLang engine call that
timed out) and exits 1 at the end. ``--plan`` prints the plan as one JSON line (shards, what is
still to do, estimated bytes, free bytes) and extracts nothing; ``--config-json`` passes a whole
``ExtractConfig`` (what an orchestrator sends to a remote host, see `command`); the flags of
single `ExtractConfig` fields (``--storage``, ``--topk``, ...) are derived from the config type
and override it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eyas.errors import ConfigError
from eyas.extract.config import ExtractConfig
from eyas.extract.plan import (
    DiskSpaceError,
    bytes_per_token,
    check_disk,
    estimate_bytes,
    free_bytes,
    specforge_bytes_per_token,
)
from eyas.extract.sglang_backend import EngineTimeout
from eyas.extract.shards import (
    ShardSpec,
    check_existing_output,
    close_backends,
    complete_record,
    extract_shard,
    plan_shards,
    shard_settings,
    shard_status,
)
from eyas.extract.target import resolve_aux_layers, target_fingerprint
from eyas.flags import add_config_flags, config_from_flags
from eyas.io import write_json

SUMMARY_NAME = "extract_summary.json"
SHARD_DONE = "shard"
"""``event`` of the JSON line printed after a shard was extracted or skipped."""
SHARD_FAILED = "shard-failed"
"""``event`` of the JSON line printed after a shard failed (``error``, ``error_type``)."""
FATAL = (ConfigError, DiskSpaceError, EngineTimeout)
"""Failures that stop a whole run even with ``keep_going``: every later shard would meet them
(an engine that did not answer in time is not asked again)."""


def plan_extraction(merged_file: Path, out_root: Path, *, model_dir: Path, cfg: ExtractConfig,
                    shards: list[int] | None = None) -> dict[str, Any]:
    """The shards to do and the bytes they need, without extracting anything.

    Returns ``{"specs", "todo" (specs not yet complete), "aux_layers", "hidden_size",
    "estimated_bytes" (all selected shards), "needed_bytes" (shards still to do)}``.
    Raises ConfigError when the layers or hidden size contradict the target.
    """
    aux_layers, shape = resolve_aux_layers(model_dir, cfg.aux_layers)
    check_existing_output(out_root, shape.hidden_size, model_dir)
    specs = plan_shards(merged_file, cfg)
    if shards is not None:
        wanted = set(shards)
        unknown = sorted(wanted - {s.index for s in specs})
        if unknown:
            raise ConfigError(f"shard(s) {unknown} do not exist (0..{len(specs) - 1})",
                              where="shards")
        specs = [s for s in specs if s.index in wanted]
    fingerprint = target_fingerprint(model_dir)
    todo = [s for s in specs if shard_status(
        Path(out_root) / s.name, shard_settings(s, cfg, aux_layers, fingerprint)) != "complete"]

    def est(group: list[ShardSpec]) -> int:
        return estimate_bytes(sum(s.num_tokens for s in group), sum(s.num_samples for s in group),
                              len(group), shape.hidden_size, cfg.storage, dtype=cfg.dtype,
                              topk=cfg.topk)

    return {"specs": specs, "todo": todo, "aux_layers": aux_layers,
            "hidden_size": shape.hidden_size, "estimated_bytes": est(specs),
            "needed_bytes": est(todo)}


def plan_report(merged_file: Path, out_root: Path, *, model_dir: Path, cfg: ExtractConfig,
                shards: list[int] | None = None) -> dict[str, Any]:
    """`plan_extraction` as plain JSON-able data, plus the free bytes of the output volume.

    Keys: ``specs`` (list of ``ShardSpec.to_dict()``), ``todo`` (indices not yet complete),
    ``complete`` ({index: the row `extract_shard` would return for it, status "skipped"} of
    the others), ``aux_layers``, ``hidden_size``, ``estimated_bytes``, ``needed_bytes``,
    ``free_bytes``, ``storage``.
    """
    plan = plan_extraction(merged_file, out_root, model_dir=model_dir, cfg=cfg, shards=shards)
    todo = {s.index for s in plan["todo"]}
    return {
        "specs": [s.to_dict() for s in plan["specs"]],
        "todo": sorted(todo),
        "complete": {str(s.index): complete_record(s, Path(out_root) / s.name)
                     for s in plan["specs"] if s.index not in todo},
        "aux_layers": plan["aux_layers"],
        "hidden_size": plan["hidden_size"],
        "estimated_bytes": plan["estimated_bytes"],
        "needed_bytes": plan["needed_bytes"],
        "free_bytes": free_bytes(Path(out_root)),
        "storage": cfg.storage,
    }


def disk_estimate(cfg: ExtractConfig, *, records: int, tokens: int,
                  hidden_size: int) -> dict[str, Any]:
    """Disk the hidden states of `records` samples / `tokens` tokens will take, before any data
    or target is at hand (``eyas extract --plan``).

    Returns ``storage``, ``hidden_size``, ``records``, ``tokens``, ``shards`` (of
    ``cfg.shard_size``), ``bytes_per_token``, ``estimated_bytes`` (the configured storage),
    ``required_bytes`` (plus ``cfg.disk_margin``, what `extract` will demand free),
    ``by_storage`` ({storage: estimated bytes} of every option) and ``specforge_bytes``
    (SpecForge's 8·H per token, for comparison).
    """
    shards = -(-records // cfg.shard_size)

    def est(storage: str) -> int:
        return estimate_bytes(tokens, records, shards, hidden_size, storage, dtype=cfg.dtype,
                              topk=cfg.topk)

    estimated = est(cfg.storage)
    return {
        "storage": cfg.storage, "hidden_size": hidden_size, "records": records,
        "tokens": tokens, "shards": shards,
        "bytes_per_token": bytes_per_token(hidden_size, cfg.storage, dtype=cfg.dtype,
                                           topk=cfg.topk),
        "estimated_bytes": estimated,
        "required_bytes": int(estimated * (1 + cfg.disk_margin)),
        "by_storage": {s: est(s) for s in ("final", "topk", "compact")},
        "specforge_bytes": tokens * specforge_bytes_per_token(hidden_size),
    }


def shard_estimate(num_tokens: int, num_samples: int, hidden_size: int, cfg: ExtractConfig) -> int:
    """Bytes one shard of `num_tokens` tokens in `num_samples` samples takes (`estimate_bytes`;
    the estimate of several shards is the sum of theirs)."""
    return estimate_bytes(num_tokens, num_samples, 1, hidden_size, cfg.storage, dtype=cfg.dtype,
                          topk=cfg.topk)


def summarize(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over per-shard rows: `extract_shard`'s results with ``estimated_bytes`` added (a
    shard that failed has ``status: "failed"`` and counts in ``failed`` only).

    Keys: ``num_shards``, ``extracted``, ``skipped``, ``failed``, ``samples``, ``tokens``,
    ``quarantined``, ``estimated_bytes`` and ``actual_bytes`` (of the shards that did not
    fail), ``actual_over_estimate``.
    """
    ok = [r for r in rows if r["status"] != "failed"]
    estimated = sum(r["estimated_bytes"] for r in ok)
    actual = sum(r["bytes"] for r in ok)
    return {
        "num_shards": len(rows),
        "extracted": sum(r["status"] == "extracted" for r in rows),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "failed": len(rows) - len(ok),
        "samples": sum(r["samples"] for r in ok),
        "tokens": sum(r["tokens"] for r in ok),
        "quarantined": sum(r["quarantined"] for r in ok),
        "estimated_bytes": estimated,
        "actual_bytes": actual,
        "actual_over_estimate": round(actual / estimated, 4) if estimated else None,
    }


def extract(merged_file: Path, out_root: Path, *, model_dir: Path, cfg: ExtractConfig,
            shards: list[int] | None = None, free_bytes: int | None = None,
            trust_remote_code: bool = False, keep_going: bool = False,
            on_shard: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Extract every shard of `merged_file` (or only `shards`) into `out_root`.

    Order: plan -> refuse unless the disk holds what is still to do (plus ``cfg.disk_margin``;
    DiskSpaceError) -> each shard (complete ones skipped) -> summary. `free_bytes` overrides
    the measured free space (tests). `on_shard` sees one event per shard as it ends
    (``{"event": SHARD_DONE, "index", **row}`` or ``{"event": SHARD_FAILED, "index", "shard",
    "error", "error_type"}``). With `keep_going` a failed shard does not stop the others (a
    `FATAL` error still does) and appears in the rows with status "failed". Returns and writes
    the summary: per-shard results (each with its ``estimated_bytes``) and `summarize`'s
    totals.
    """
    out_root = Path(out_root)
    plan = plan_extraction(merged_file, out_root, model_dir=model_dir, cfg=cfg, shards=shards)
    check_disk(out_root, plan["needed_bytes"], cfg.disk_margin, free=free_bytes)
    rows = []
    try:
        for spec in plan["specs"]:
            # A stop asked of this process ends the extraction at the next shard boundary
            # (`extract_shard` checks it first); finished shards are kept.
            estimated = shard_estimate(spec.num_tokens, spec.num_samples, plan["hidden_size"], cfg)
            try:
                result = extract_shard(spec, model_dir, out_root, cfg,
                                       trust_remote_code=trust_remote_code)
            except Exception as exc:
                if on_shard is not None:
                    on_shard({"event": SHARD_FAILED, "index": spec.index, "shard": spec.name,
                              "error": f"{type(exc).__name__}: {exc}",
                              "error_type": type(exc).__name__})
                if not keep_going or isinstance(exc, FATAL):
                    raise
                rows.append({"shard": spec.name, "status": "failed", "previous": None,
                             "samples": spec.num_samples, "tokens": spec.num_tokens,
                             "quarantined": 0, "bytes": 0, "seconds": None,
                             "estimated_bytes": estimated, "error": str(exc)})
                continue
            rows.append({**result, "estimated_bytes": estimated})
            if on_shard is not None:
                on_shard({"event": SHARD_DONE, "index": spec.index, **rows[-1]})
    finally:
        close_backends()  # an SGLang engine holds its GPUs until shut down
    summary = {
        "merged_file": str(merged_file),
        "model_dir": str(model_dir),
        "storage": cfg.storage,
        "aux_layers": plan["aux_layers"],
        "hidden_size": plan["hidden_size"],
        "shards": rows,
        **summarize(rows),
    }
    write_json(out_root / SUMMARY_NAME, summary)
    return summary


def command(python: str, *, merged: str, out: str, model: str, cfg: ExtractConfig,
            shards: list[int] | None = None, plan: bool = False,
            trust_remote_code: bool = False, keep_going: bool = False) -> str:
    """The shell command that runs `main` with `python` (on a host: its eyas interpreter,
    `eyas.remote.hosts.HostSpec.eyas_python`), the whole `cfg` passed as JSON."""
    q = shlex.quote
    cmd = (f"{q(python)} -m eyas.extract.run --merged {q(merged)} --out {q(out)} "
           f"--model {q(model)} --config-json {q(cfg.model_dump_json())}")
    if shards is not None:
        cmd += f" --shards {','.join(str(i) for i in shards)}"
    if plan:
        cmd += " --plan"
    if trust_remote_code:
        cmd += " --trust-remote-code"
    if keep_going:
        cmd += " --keep-going"
    return cmd


def shards_of_command(cmd: str) -> list[int] | None:
    """The shard indices a `command` line names (``--shards``), None for all."""
    argv = shlex.split(cmd)
    if "--shards" not in argv:
        return None
    return [int(x) for x in argv[argv.index("--shards") + 1].split(",")]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eyas.extract.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--merged", type=Path, required=True, help="merged JSONL (input_ids, loss_mask)")
    p.add_argument("--out", type=Path, required=True, help="output folder of shard-NNNNN folders")
    p.add_argument("--model", type=Path, required=True, help="target model folder")
    p.add_argument("--shards", type=str, default=None, help="only these shard indices, e.g. 0,3")
    p.add_argument("--config-json", type=str, default=None,
                   help="a whole ExtractConfig as JSON (the single-field flags override it)")
    p.add_argument("--plan", action="store_true", help="print the plan as JSON, extract nothing")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run the model folder's own code (Kimi, DeepSeek)")
    p.add_argument("--keep-going", action="store_true",
                   help="go on with the next shard when one fails (exit 1 at the end)")
    add_config_flags(p, ExtractConfig)
    return p


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    base = json.loads(args.config_json) if args.config_json else None
    cfg = config_from_flags(ExtractConfig, args, base)
    shards = [int(x) for x in args.shards.split(",")] if args.shards else None
    if args.plan:
        report = plan_report(args.merged, args.out, model_dir=args.model, cfg=cfg, shards=shards)
        sys.stdout.write(json.dumps(report) + "\n")
        return 0
    def event(record: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    summary = extract(args.merged, args.out, model_dir=args.model, cfg=cfg, shards=shards,
                      trust_remote_code=args.trust_remote_code, keep_going=args.keep_going,
                      on_shard=event)
    sys.stdout.write(json.dumps(summary) + "\n")  # last line: the whole summary, shards included
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    from eyas.stopping import run_main

    raise SystemExit(run_main(main, "extraction"))  # stopped: engines shut down (finally)
