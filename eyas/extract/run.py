"""The extraction phase without an orchestrator: plan, check disk, extract each shard, summarise.

On a GPU host::

    python -m eyas.extract.run --merged WORKDIR/merged/train.jsonl \\
        --out WORKDIR/hidden/train --model /models/target [--storage topk] [--shards 0,3]
        [--backend sglang --tp-size 8 --trust-remote-code]   # SGLang 0.5.23 (its own venv)

The summary (also written to ``<out>/extract_summary.json``) compares the bytes written with
the estimate made before starting. ``--plan`` prints the plan as one JSON line (shards, what is
still to do, estimated bytes, free bytes) and extracts nothing; ``--config-json`` passes a whole
``ExtractConfig`` (what an orchestrator sends to a remote host) instead of the single flags.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
from eyas.extract.store import DATA_NAME
from eyas.extract.target import resolve_aux_layers, target_fingerprint
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
    ``aux_layers``, ``hidden_size``, ``estimated_bytes``, ``needed_bytes``, ``free_bytes``,
    ``storage``.
    """
    plan = plan_extraction(merged_file, out_root, model_dir=model_dir, cfg=cfg, shards=shards)
    return {
        "specs": [s.to_dict() for s in plan["specs"]],
        "todo": [s.index for s in plan["todo"]],
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


def extract(merged_file: Path, out_root: Path, *, model_dir: Path, cfg: ExtractConfig,
            shards: list[int] | None = None, free_bytes: int | None = None,
            trust_remote_code: bool = False) -> dict[str, Any]:
    """Extract every shard of `merged_file` (or only `shards`) into `out_root`.

    Order: plan -> refuse unless the disk holds what is still to do (plus ``cfg.disk_margin``;
    DiskSpaceError) -> each shard (complete ones skipped) -> summary. `free_bytes` overrides
    the measured free space (tests). Returns and writes the summary: per-shard results,
    totals, ``estimated_bytes`` and ``actual_bytes`` (data files of the selected shards).
    """
    out_root = Path(out_root)
    plan = plan_extraction(merged_file, out_root, model_dir=model_dir, cfg=cfg, shards=shards)
    check_disk(out_root, plan["needed_bytes"], cfg.disk_margin, free=free_bytes)
    try:
        results = [extract_shard(spec, model_dir, out_root, cfg,
                                 trust_remote_code=trust_remote_code)
                   for spec in plan["specs"]]
    finally:
        close_backends()  # an SGLang engine holds its GPUs until shut down
    actual = sum((out_root / s.name / DATA_NAME).stat().st_size for s in plan["specs"])
    summary = {
        "merged_file": str(merged_file),
        "model_dir": str(model_dir),
        "storage": cfg.storage,
        "aux_layers": plan["aux_layers"],
        "hidden_size": plan["hidden_size"],
        "shards": results,
        "num_shards": len(results),
        "extracted": sum(r["status"] == "extracted" for r in results),
        "skipped": sum(r["status"] == "skipped" for r in results),
        "samples": sum(r["samples"] for r in results),
        "tokens": sum(r["tokens"] for r in results),
        "quarantined": sum(r["quarantined"] for r in results),
        "estimated_bytes": plan["estimated_bytes"],
        "actual_bytes": actual,
        "actual_over_estimate": round(actual / plan["estimated_bytes"], 4)
        if plan["estimated_bytes"] else None,
    }
    write_json(out_root / SUMMARY_NAME, summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m eyas.extract.run", description=__doc__.split("\n")[0])
    p.add_argument("--merged", type=Path, required=True, help="merged JSONL (input_ids, loss_mask)")
    p.add_argument("--out", type=Path, required=True, help="output folder of shard-NNNNN folders")
    p.add_argument("--model", type=Path, required=True, help="target model folder")
    p.add_argument("--storage", choices=["final", "topk", "compact"], default="final")
    p.add_argument("--topk", type=int, default=32)
    p.add_argument("--aux-layers", type=str, default=None,
                   help="comma-separated, eyas numbering (output of layer i), e.g. 1,29,57")
    p.add_argument("--shard-size", type=int, default=256)
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", choices=["hf", "sglang"], default="hf",
                   help="hf = transformers; sglang = SGLang 0.5.23's offline engine with "
                        "eyas's capture hook (GPU host, eyas[sglang] installed)")
    p.add_argument("--tp-size", type=int, default=1, help="SGLang tensor-parallel GPUs")
    p.add_argument("--shards", type=str, default=None, help="only these shard indices, e.g. 0,3")
    p.add_argument("--config-json", type=str, default=None,
                   help="a whole ExtractConfig as JSON (overrides the single flags above)")
    p.add_argument("--plan", action="store_true", help="print the plan as JSON, extract nothing")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run the model folder's own code (Kimi, DeepSeek)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.config_json:
        cfg = ExtractConfig.model_validate_json(args.config_json)
    else:
        cfg = ExtractConfig(
            storage=args.storage, topk=args.topk, shard_size=args.shard_size,
            batch_tokens=args.batch_tokens, device=args.device, backend=args.backend,
            tp_size=args.tp_size,
            aux_layers=[int(x) for x in args.aux_layers.split(",")] if args.aux_layers else None,
        )
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
