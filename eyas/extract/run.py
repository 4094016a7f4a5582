"""The extraction phase without an orchestrator: plan, check disk, extract each shard, summarise.

On a GPU host::

    python -m eyas.extract.run --merged WORKDIR/merged/train.jsonl \\
        --out WORKDIR/hidden/train --model /models/target [--storage topk] [--shards 0,3]
        [--backend sglang --tp-size 8 --trust-remote-code]   # SGLang 0.5.23 (its own venv)

The summary (also written to ``<out>/extract_summary.json``) compares the bytes written with
the estimate made before starting. ``--plan`` prints the plan as one JSON line (shards, what is
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eyas.extract.config import ExtractConfig
from eyas.extract.plan import (
    bytes_per_token,
    check_disk,
    estimate_bytes,
    free_bytes,
    specforge_bytes_per_token,
)
from eyas.extract.shards import (
    ShardSpec,
    check_existing_output,
    close_backends,
    extract_shard,
    plan_shards,
    shard_settings,
    shard_status,
)
from eyas.extract.target import resolve_aux_layers, target_fingerprint
from eyas.flags import add_config_flags, config_from_flags
from eyas.io import write_json

SUMMARY_NAME = "extract_summary.json"


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
            from eyas.errors import ConfigError

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
    ``complete`` ({index: the row `extract_shard` returns for a skipped shard} of the others),
    ``aux_layers``, ``hidden_size``, ``estimated_bytes``, ``needed_bytes``, ``free_bytes``,
    ``storage``.
    """
    plan = plan_extraction(merged_file, out_root, model_dir=model_dir, cfg=cfg, shards=shards)
    todo = {s.index for s in plan["todo"]}
    return {
        "specs": [s.to_dict() for s in plan["specs"]],
        "todo": sorted(todo),
        "complete": {str(s.index): complete_row(Path(out_root), s)
                     for s in plan["specs"] if s.index not in todo},
        "aux_layers": plan["aux_layers"],
        "hidden_size": plan["hidden_size"],
        "estimated_bytes": plan["estimated_bytes"],
        "needed_bytes": plan["needed_bytes"],
        "free_bytes": free_bytes(Path(out_root)),
        "storage": cfg.storage,
    }


def complete_row(out_root: Path, spec: ShardSpec) -> dict[str, Any]:
    """The summary of a shard found complete (as `extract_shard` returns it, status
    "skipped"), from its manifest."""
    from eyas.extract.store import DATA_NAME, read_shard_manifest

    shard_dir = Path(out_root) / spec.name
    record = read_shard_manifest(shard_dir)
    return {"shard": spec.name, "status": "skipped", "previous": "complete",
            "samples": record["num_samples"], "tokens": record["num_tokens"],
            "quarantined": record["num_quarantined"],
            "bytes": (shard_dir / DATA_NAME).stat().st_size, "seconds": 0.0}


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
            trust_remote_code: bool = False) -> dict[str, Any]:
    """Extract every shard of `merged_file` (or only `shards`) into `out_root`.

    Order: plan -> refuse unless the disk holds what is still to do (plus ``cfg.disk_margin``;
    DiskSpaceError) -> each shard (complete ones skipped) -> summary. `free_bytes` overrides
    the measured free space (tests). Returns and writes the summary: per-shard results (each
    with its ``estimated_bytes``) and `summarize`'s totals.
    """
    out_root = Path(out_root)
    plan = plan_extraction(merged_file, out_root, model_dir=model_dir, cfg=cfg, shards=shards)
    check_disk(out_root, plan["needed_bytes"], cfg.disk_margin, free=free_bytes)
    rows = []
    try:
        for spec in plan["specs"]:
            result = extract_shard(spec, model_dir, out_root, cfg,
                                   trust_remote_code=trust_remote_code)
            rows.append({**result, "estimated_bytes": shard_estimate(
                spec.num_tokens, spec.num_samples, plan["hidden_size"], cfg)})
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
            trust_remote_code: bool = False) -> str:
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
    return cmd


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
    summary = extract(args.merged, args.out, model_dir=args.model, cfg=cfg, shards=shards,
                      trust_remote_code=args.trust_remote_code)
    sys.stdout.write(json.dumps(summary) + "\n")  # last line: the whole summary, shards included
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
