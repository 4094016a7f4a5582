"""Train an EAGLE-3 drafter and export it for SGLang: the Prefect-free entry point.

Offline (from extraction shards)::

    python -m eyas.train.run --shards W/hidden/train --eval-shards W/hidden/eval \\
        --model TARGET_DIR --out W/drafter [--steps N] [--config train.yaml]

Online (the target runs in this process; small targets)::

    python -m eyas.train.run --train-jsonl W/merged/train.jsonl --eval-jsonl W/merged/eval.jsonl \\
        --model TARGET_DIR --out W/drafter --storage final

Several processes: ``torchrun --nproc-per-node G -m eyas.train.run ...`` (DDP; gloo on CPU,
NCCL on GPU). A run finding ``<out>/checkpoint`` resumes from it. Outputs under ``--out``:
``checkpoint/``, ``best/``, ``history.json``, ``vocab/`` (the cached draft vocabulary) and
``export/`` (the SGLang folder, from the best evaluation's weights).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import get_args, get_origin

import torch
import torch.distributed as dist
import yaml
from safetensors.torch import load_file

from eyas.errors import ConfigError, EyasError
from eyas.io import read_json
from eyas.train.config import TrainConfig
from eyas.train.data import Batches, OfflineSource, OnlineSource, Source
from eyas.train.export import export_drafter
from eyas.train.model import Drafter, DrafterConfig
from eyas.train.trainer import BEST, Trainer, resolve_device
from eyas.train.vocab import load_or_build


def _print(record: dict) -> None:
    if record["kind"] == "train":
        acc = " ".join(f"{a:.2f}" for a in record["acc"])
        print(f"step {record['step']:>6}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
              f"acc [{acc}]  sim-AL {record['simulated_acceptance_length']:.3f}  "
              f"{record.get('tok_s', 0):.0f} tok/s", flush=True)
    else:
        acc = " ".join(f"{a:.2f}" for a in record["acc"])
        print(f"eval @ {record['step']:>4}  loss {record['loss']:.4f}  acc [{acc}]  "
              f"simulated acceptance length {record['simulated_acceptance_length']:.3f}",
              flush=True)


def train_drafter(
    train_source: Source,
    eval_source: Source | None,
    model_dir: Path,
    out: Path,
    cfg: TrainConfig,
    *,
    aux_layers: list[int],
    on_log: Callable[[dict], None] | None = _print,
    stop_at: int | None = None,
) -> dict:
    """Build the vocabulary and drafter, train (resuming from ``out/checkpoint``), export.

    Returns a summary: ``{"export": path, "best": metrics, "steps": n, "resumed_from": step}``.
    Under torch.distributed every rank calls this; rank 0 builds the vocabulary and writes.
    """
    from eyas.extract.target import load_target_embeddings, load_target_lm_head

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    target_config = read_json(Path(model_dir) / "config.json")
    target_config = target_config.get("text_config", target_config)
    vocab_size = int(target_config["vocab_size"])
    n = min(cfg.draft_vocab_size, vocab_size)
    if rank == 0:
        vocab, built = load_or_build(out / "vocab", train_source.identity(), n, vocab_size,
                                     train_source.masked_tokens())
    if distributed:
        dist.barrier()
    if rank != 0:
        vocab, built = load_or_build(out / "vocab", train_source.identity(), n, vocab_size, ())
    if on_log and rank == 0:
        print(f"draft vocabulary: {vocab.size} tokens ({'built' if built else 'cached'})",
              flush=True)

    dcfg = DrafterConfig.from_target(target_config, vocab.size)
    if cfg.intermediate_size:
        dcfg = dcfg.model_copy(update={"intermediate_size": cfg.intermediate_size})
    embed = load_target_embeddings(Path(model_dir))  # stored dtype (bf16): see Drafter.embed
    head = load_target_lm_head(Path(model_dir)) if train_source.storage == "final" else None
    torch.manual_seed(cfg.seed)
    drafter = Drafter(dcfg, embed)
    device = resolve_device(cfg.device)
    if device.type == "cuda" and distributed:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        cfg = cfg.model_copy(update={"device": str(device)})
    train = Batches(train_source, micro_batch=cfg.micro_batch, seed=cfg.seed,
                    max_len=cfg.max_len, rank=rank, world=world)
    evals = (Batches(eval_source, micro_batch=cfg.micro_batch, seed=0, max_len=cfg.max_len,
                     rank=rank, world=world, shuffle=False) if eval_source is not None else None)
    trainer = Trainer(cfg, drafter, vocab, train, evals, out, lm_head_VH=head, on_log=on_log)
    resumed = trainer.state.step if trainer.load_checkpoint() else None
    if resumed is not None and on_log and rank == 0:
        print(f"resumed from {out / 'checkpoint'} at step {trainer.state.step}", flush=True)
    trainer.fit(stop_at=stop_at)
    summary = {"steps": trainer.state.step, "resumed_from": resumed, "export": None,
               "best": None, "draft_vocab_size": vocab.size}
    if rank == 0 and trainer.state.step >= cfg.steps:
        best_file = out / BEST / "drafter.safetensors"
        if best_file.is_file():
            drafter.load_state_dict(load_file(str(best_file)))
            summary["best"] = read_json(out / BEST / "metrics.json")
        path = export_drafter(out / "export", drafter, vocab, aux_layers,
                              target_config=target_config, metrics=summary["best"])
        summary["export"] = str(path)
        if on_log:
            print(f"exported SGLang EAGLE3 drafter to {path}", flush=True)
    if distributed:
        dist.barrier()
    return summary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eyas.train.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=Path, help="training shards folder (offline)")
    p.add_argument("--eval-shards", type=Path, help="evaluation shards folder (offline)")
    p.add_argument("--train-jsonl", type=Path, help="merged train.jsonl (online)")
    p.add_argument("--eval-jsonl", type=Path, help="merged eval.jsonl (online)")
    p.add_argument("--model", type=Path, required=True, help="target model folder")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--config", type=Path, help="YAML of TrainConfig fields")
    p.add_argument("--aux-layers", type=str, help="online only: e.g. 1,29,57 (eyas numbering)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="online only: let transformers run the target folder's own code")
    for name, field in TrainConfig.model_fields.items():
        if get_origin(field.annotation) is tuple:
            continue  # betas: YAML only
        kinds = {a for a in (get_args(field.annotation) or (field.annotation,)) if a is not type(None)}
        kind = int if kinds == {int} else float if kinds == {float} else str
        if kinds <= {int, float, str} or name in ("storage", "precision"):
            p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, type=kind,
                           help=(field.description or "").split("\n")[0])
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fields = yaml.safe_load(args.config.read_text()) if args.config else {}
    fields = fields or {}
    for name in TrainConfig.model_fields:
        value = getattr(args, name, None)
        if value is not None:
            fields[name] = value
    try:
        cfg = TrainConfig(**fields)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        if args.shards:
            train_source: Source = OfflineSource(args.shards)
            eval_source = OfflineSource(args.eval_shards) if args.eval_shards else None
            aux_layers = train_source.aux_layers
        elif args.train_jsonl:
            layers = [int(x) for x in args.aux_layers.split(",")] if args.aux_layers else None
            kw = dict(storage=cfg.storage, aux_layers=layers, topk=cfg.online_topk,
                      device=cfg.device, trust_remote_code=args.trust_remote_code)
            train_source = OnlineSource(args.train_jsonl, args.model, **kw)
            eval_source = OnlineSource(args.eval_jsonl, args.model, **kw) if args.eval_jsonl else None
            aux_layers = train_source.aux_layers
        else:
            raise ConfigError("give --shards (offline) or --train-jsonl (online)")
        summary = train_drafter(train_source, eval_source, args.model, args.out, cfg,
                                aux_layers=aux_layers)
    except EyasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
