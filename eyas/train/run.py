"""Train an EAGLE-3 drafter and export it for SGLang: the Prefect-free entry point.

Offline (from extraction shards)::

    python -m eyas.train.run --shards W/hidden/train --eval-shards W/hidden/eval \\
        --model TARGET_DIR --out W/drafter [--steps N] [--config train.yaml]

Online (the target runs in this process; small targets)::

    python -m eyas.train.run --train-jsonl W/merged/train.jsonl --eval-jsonl W/merged/eval.jsonl \\
        --model TARGET_DIR --out W/drafter --storage final

Several processes, one per GPU (DDP; NCCL on GPU, gloo on CPU): ``--processes G`` makes this
process torchrun's agent over G workers (`eyas.train.launch`; ``torchrun --nproc-per-node G -m
eyas.train.run ...`` by hand works too); without ``--processes`` a GPU host uses every GPU.
A run finding ``<out>/checkpoint`` resumes from it. Outputs under ``--out``:
``checkpoint/``, ``best/``, ``history.json``, ``vocab/`` (the cached draft vocabulary) and
``export/`` (the SGLang folder, from the best evaluation's weights). Evaluation data that is
missing or empty means no evaluation (the last weights are exported).

Every logged training step and evaluation is one line: readable text, or with
``--log-format json`` one JSON object (`parse_record` reads it back: what an orchestrator
follows for progress). The last line is the run's summary as JSON. With several processes
only rank 0 prints records and the summary; a failing rank prints ``error (rank r of w): ...``.
Exit codes: 0 done, `USER_ERROR_EXIT` for a configuration or data error (`EyasError`: a retry
cannot help), 128 + the signal when stopped (143: SIGTERM, 130: Ctrl-C), anything else a crash.

Stopping: SIGTERM or SIGINT (`eyas.stopping`; a cancelled job, ``timeout``, a scheduler) ends
the step under way in every process -- they agree on it through the step's all-reduce --,
writes the checkpoint and the history there, and exits; a second signal stops at once. Under
torchrun the agent passes the signal on to its workers and gives them `STOP_GRACE_S` to do so.
A rerun resumes from the checkpoint.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import yaml
from safetensors.torch import load_file

from eyas import stopping
from eyas.devices import resolve_device
from eyas.errors import USER_ERROR_EXIT, ConfigError, DataError, EyasError
from eyas.flags import add_config_flags, config_from_flags
from eyas.hf_target import text_config
from eyas.io import read_json
from eyas.layers import to_sglang_ids
from eyas.layout import BEST, EXPORT, VOCAB, RunLayout
from eyas.train.config import TrainConfig
from eyas.train.data import Batches, OfflineSource, OnlineSource, Source, shared_offline_source
from eyas.train.export import export_drafter
from eyas.train.launch import (
    check_processes,
    die_with_parent,
    guard_worker,
    is_worker,
    launch,
    patient_group,
    resolve_processes,
)
from eyas.train.model import Drafter, DrafterConfig
from eyas.train.plan import total_steps
from eyas.train.trainer import Trainer, recover_interrupted
from eyas.train.vocab import load_or_build

DATA_KINDS = ("offline", "online")
"""Training data: ``offline`` = extraction shards; ``online`` = merged JSONL, the target run
in the training process."""
LOG_FORMATS = ("text", "json")


COLLECTIVE_TIMEOUT_ENV = "EYAS_COLLECTIVE_TIMEOUT_S"
"""Environment variable (e.g. in the recipe's or the host's ``gpu_env``) that sets how long a
training collective may wait before the run fails instead of hanging."""
COLLECTIVE_TIMEOUT_S = 600.0
"""Default of `COLLECTIVE_TIMEOUT_ENV`: a hung all-reduce fails the run after 10 minutes."""


def collective_timeout() -> datetime.timedelta:
    """How long a collective of the training process group may wait: ``$EYAS_COLLECTIVE_TIMEOUT_S``
    seconds, else `COLLECTIVE_TIMEOUT_S`. Raises ConfigError for a value that is not a positive
    number."""
    raw = os.environ.get(COLLECTIVE_TIMEOUT_ENV)
    try:
        seconds = COLLECTIVE_TIMEOUT_S if raw is None else float(raw)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ConfigError(f"{COLLECTIVE_TIMEOUT_ENV}={raw!r}: expected seconds > 0",
                          where="gpu_env")
    return datetime.timedelta(seconds=seconds)


def format_record(record: dict) -> str:
    """One readable line for a training step or an evaluation record."""
    acc = " ".join(f"{a:.2f}" for a in record["acc"])
    if record["kind"] == "train":
        return (f"step {record['step']:>6}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
                f"acc [{acc}]  sim-AL {record['simulated_acceptance_length']:.3f}  "
                f"{record.get('tok_s', 0):.0f} tok/s")
    return (f"eval @ {record['step']:>4}  loss {record['loss']:.4f}  acc [{acc}]  "
            f"simulated acceptance length {record['simulated_acceptance_length']:.3f}")


def parse_record(line: str) -> dict | None:
    """The training step or evaluation record a ``--log-format json`` line holds, else None
    (other lines: messages, the final summary)."""
    if not line.startswith('{"kind":'):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if record.get("kind") in ("train", "eval") else None


def print_record(record: dict) -> None:
    """`train_drafter`'s default `on_log`: the readable line."""
    print(format_record(record), flush=True)


def print_json_record(record: dict) -> None:
    """`on_log` of ``--log-format json``: the record as one JSON object (``kind`` first)."""
    print(json.dumps({"kind": record["kind"], **record}), flush=True)


def data_paths(workdir: Path, data: str) -> tuple[Path, Path]:
    """A run's training and evaluation data: offline the shard folders ``hidden/train`` and
    ``hidden/eval``, online ``merged/train.jsonl`` and ``merged/eval.jsonl``."""
    layout = RunLayout(Path(workdir))
    if check_data_kind(data) == "offline":
        return layout.hidden_dir("train"), layout.hidden_dir("eval")
    return layout.train, layout.eval


def check_data_kind(data: str) -> str:
    """`data` when it is one of `DATA_KINDS`; else ConfigError."""
    if data not in DATA_KINDS:
        raise ConfigError(f"data must be one of {list(DATA_KINDS)}, not {data!r}", where="data")
    return data


def _holds_data(path: Path | None, data: str) -> bool:
    if path is None:
        return False
    if data == "offline":
        return path.is_dir() and any(p.name.startswith("shard-") for p in path.iterdir())
    return path.is_file() and path.stat().st_size > 0


def open_sources(data: str, train: Path, eval_: Path | None, model_dir: Path, cfg: TrainConfig,
                 *, aux_layers: list[int] | None = None,
                 trust_remote_code: bool = False) -> tuple[Source, Source | None]:
    """The training source and the evaluation source of `data` (see `DATA_KINDS`); the
    evaluation source is None when `eval_` is missing or holds nothing.

    Online, `aux_layers` (eyas numbering; None: the EAGLE-3 default), ``cfg.storage`` and
    ``cfg.online_topk`` say what the target computes. Raises ConfigError for an unknown
    `data`, DataError when the training data is missing or unusable.
    """
    if check_data_kind(data) == "offline":
        train_source: Source = shared_offline_source(Path(train))
        eval_source = shared_offline_source(Path(eval_)) if _holds_data(eval_, data) else None
        return train_source, eval_source
    if not Path(train).is_file():
        raise DataError("no merged train data (run `eyas prepare` first)", path=train)
    kw = dict(storage=cfg.storage, aux_layers=aux_layers, topk=cfg.online_topk,
              device=cfg.device, trust_remote_code=trust_remote_code)
    train_source = OnlineSource(Path(train), Path(model_dir), **kw)
    eval_source = OnlineSource(Path(eval_), Path(model_dir), **kw) if _holds_data(eval_, data) else None
    return train_source, eval_source


def train_drafter(
    train_source: Source,
    eval_source: Source | None,
    model_dir: Path,
    out: Path,
    cfg: TrainConfig,
    *,
    aux_layers: list[int],
    on_log: Callable[[dict], None] | None = print_record,
    stop_at: int | None = None,
) -> dict:
    """Build the vocabulary and drafter, train (resuming from ``out/checkpoint``), export.

    Returns a summary: ``{"export": path, "best": metrics, "steps": n, "resumed_from": step}``.
    Under torch.distributed every rank calls this; rank 0 builds the vocabulary and writes.
    """
    from eyas.extract.target import (
        load_target_attention,
        load_target_embeddings,
        load_target_final_norm,
        load_target_lm_head,
        target_shape,
    )

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if cfg.epochs is not None:
        cfg = cfg.model_copy(update={"steps": total_steps(cfg, len(train_source), world)})
        if on_log and rank == 0:
            print(f"{cfg.epochs:g} epochs of {len(train_source):,} samples: {cfg.steps:,} steps",
                  flush=True)
    target_config = text_config(read_json(Path(model_dir) / "config.json"))
    architecture = target_shape(Path(model_dir)).architecture
    to_sglang_ids(aux_layers, architecture)  # the export must be able to name them: fail now
    vocab_size = int(target_config["vocab_size"])
    n = min(cfg.draft_vocab_size, vocab_size)
    # The other ranks wait for rank 0 alone (the vocabulary, the export) in a group that
    # outwaits NCCL's timeout.
    waiting = patient_group() if distributed else None
    if rank == 0:
        for line in recover_interrupted(out):
            print(line, flush=True)
        vocab, built = load_or_build(out / VOCAB, train_source.identity(), n, vocab_size,
                                     train_source.masked_tokens())
    if distributed:
        dist.barrier(group=waiting)
    if rank != 0:
        vocab, built = load_or_build(out / VOCAB, train_source.identity(), n, vocab_size, ())
    if on_log and rank == 0:
        print(f"draft vocabulary: {vocab.size} tokens ({'built' if built else 'cached'}), "
              f"{vocab.coverage:.1%} of the supervised training tokens", flush=True)

    dcfg = DrafterConfig.from_target(target_config, vocab.size, attention=cfg.drafter,
                                     overrides=cfg.drafter_overrides())
    if cfg.intermediate_size:
        dcfg = dcfg.model_copy(update={"intermediate_size": cfg.intermediate_size})
    embed = load_target_embeddings(Path(model_dir))  # stored dtype (bf16): see Drafter.embed
    head = load_target_lm_head(Path(model_dir)) if train_source.storage == "final" else None
    torch.manual_seed(cfg.seed)
    drafter = Drafter(dcfg, embed)
    if cfg.init_head == "target":
        drafter.init_head_from_target(
            head if head is not None else load_target_lm_head(Path(model_dir)),
            vocab.draft_to_target, load_target_final_norm(Path(model_dir)))
    if cfg.mla.init_attention == "target":
        from eyas.train.mla import init_from_target_attention

        last = int(text_config(target_config)["num_hidden_layers"]) - 1
        init_from_target_attention(drafter.midlayer.self_attn,
                                   load_target_attention(Path(model_dir), last))
    device = resolve_device(cfg.device)
    if device.type == "cuda" and distributed:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        cfg = cfg.model_copy(update={"device": str(device)})
    # Read ahead in a thread, pinned for a GPU, float8 aux states widened on the device. Not
    # for online data: its reads run the target, which stays on the training thread.
    loading = {"pin_memory": device.type == "cuda", "dequantize": False}
    prefetch = cfg.prefetch if isinstance(train_source, OfflineSource) else 0
    train = Batches(train_source, micro_batch=cfg.micro_batch, seed=cfg.seed,
                    max_len=cfg.max_len, rank=rank, world=world,
                    group_batches=cfg.group_batches, accum=cfg.grad_accum, prefetch=prefetch,
                    **loading)
    evals = (Batches(eval_source, micro_batch=cfg.micro_batch, seed=0, max_len=cfg.max_len,
                     rank=rank, world=world, shuffle=False, **loading)
             if eval_source is not None else None)
    trainer = Trainer(cfg, drafter, vocab, train, evals, out, lm_head_VH=head, on_log=on_log)
    if trainer.train_memo is not None and on_log and rank == 0:
        from eyas.train.teacher_memo import memo_bytes

        held = memo_bytes(train_source.lengths(), cfg.max_len)  # every process: all of it
        if eval_source is not None:
            held += memo_bytes(eval_source.lengths(), cfg.max_len) // world
        print(f"teacher memo: the whole-vocabulary argmax once per sample, up to "
              f"{held / 1e6:,.1f} MB ({held:,} bytes) per process when full "
              f"(train.teacher_memo)", flush=True)
    resumed = trainer.state.step if trainer.load_checkpoint() else None
    if resumed is not None and on_log and rank == 0:
        print(f"resumed from {trainer.checkpoint_path} at step {trainer.state.step}", flush=True)
    trainer.fit(stop_at=stop_at)
    summary = {"steps": trainer.state.step, "resumed_from": resumed, "export": None,
               "best": None, "draft_vocab_size": vocab.size}
    if rank == 0 and trainer.state.step >= cfg.steps:
        best_file = out / BEST / "drafter.safetensors"
        if best_file.is_file():
            drafter.load_state_dict(load_file(str(best_file)))
            summary["best"] = read_json(out / BEST / "metrics.json")
        path = export_drafter(out / EXPORT, drafter, vocab, aux_layers,
                              target_config=target_config, architecture=architecture,
                              metrics=summary["best"])
        summary["export"] = str(path)
        if on_log:
            print(f"exported SGLang EAGLE3 drafter to {path}", flush=True)
    if distributed:
        dist.barrier(group=waiting)
        dist.destroy_process_group(waiting)
    return summary


def argv(python: str, *, data: str, train: str, eval_: str, model: str, out: str,
         config_file: str, aux_layers: list[int] | None = None,
         trust_remote_code: bool = False, processes: int | None = None,
         die_with_parent: bool = False) -> list[str]:
    """The command line that runs `main` with `python` (on a host: its eyas interpreter,
    `eyas.remote.hosts.HostSpec.eyas_python`), logging JSON records (`parse_record`).

    `config_file` is a YAML of `TrainConfig` fields on that host; `aux_layers` and
    `trust_remote_code` matter online only (the target runs in the training process).
    `processes` overrides the file's ``processes`` (more than 1: torchrun over that many
    workers, `eyas.train.launch`); `die_with_parent` stops every process of the run when
    the one that started it ends."""
    cmd = [python, "-m", "eyas.train.run", "--model", model, "--out", out,
           "--config", config_file, "--log-format", "json"]
    if processes is not None:
        cmd += ["--processes", str(processes)]
    if die_with_parent:
        cmd.append("--die-with-parent")
    if data == "offline":
        return cmd + ["--shards", train, "--eval-shards", eval_]
    cmd += ["--train-jsonl", train, "--eval-jsonl", eval_]
    if aux_layers:
        cmd += ["--aux-layers", ",".join(str(i) for i in aux_layers)]
    return cmd + (["--trust-remote-code"] if trust_remote_code else [])


def command(python: str, **kw) -> str:
    """`argv` as one shell command line (for a detached job on a host)."""
    return shlex.join(argv(python, **kw))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eyas.train.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=Path, help="training shards folder (offline)")
    p.add_argument("--eval-shards", type=Path, help="evaluation shards folder (offline)")
    p.add_argument("--train-jsonl", type=Path, help="merged train.jsonl (online)")
    p.add_argument("--eval-jsonl", type=Path, help="merged eval.jsonl (online)")
    p.add_argument("--model", type=Path, required=True, help="target model folder")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--config", type=Path, help="YAML of TrainConfig fields (flags override it)")
    p.add_argument("--aux-layers", type=str, help="online only: e.g. 1,29,57 (eyas numbering)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="online only: let transformers run the target folder's own code")
    p.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                   help="each logged step as a readable line or as one JSON object")
    p.add_argument("--die-with-parent", action="store_true",
                   help="stop training (every process) when the process that started this one "
                        "ends: for orchestrators that run it as their child")
    add_config_flags(p, TrainConfig)
    return p


def main(args_list: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if args_list is None else args_list)
    args = build_parser().parse_args(args_list)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    try:
        if is_worker():
            guard_worker()
        elif args.die_with_parent:
            die_with_parent(signal.SIGTERM)  # torchrun's agent stops its workers on TERM
        base = (yaml.safe_load(args.config.read_text()) if args.config else None) or {}
        cfg = config_from_flags(TrainConfig, args, base)
        cuda = resolve_device(cfg.device).type == "cuda"
        if not is_worker():
            processes = resolve_processes(cfg.processes,
                                          torch.cuda.device_count() if cuda else 1)
            if processes > 1:
                check_processes(processes, cuda=cuda, visible_gpus=torch.cuda.device_count())
                return launch(processes, "eyas.train.run", args_list)
        if world > 1 and not dist.is_initialized():
            if cuda:  # before any collective: NCCL binds each rank to its own GPU
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if cuda else "gloo", timeout=collective_timeout())
        if args.shards:
            data, train, eval_ = "offline", args.shards, args.eval_shards
        elif args.train_jsonl:
            data, train, eval_ = "online", args.train_jsonl, args.eval_jsonl
        else:
            raise ConfigError("give --shards (offline) or --train-jsonl (online)")
        layers = [int(x) for x in args.aux_layers.split(",")] if args.aux_layers else None
        train_source, eval_source = open_sources(data, train, eval_, args.model, cfg,
                                                 aux_layers=layers,
                                                 trust_remote_code=args.trust_remote_code)
        if eval_ is not None and eval_source is None and rank == 0:
            print(f"no evaluation data in {eval_}: no evaluation; the last weights are exported",
                  flush=True)
        on_log = print_json_record if args.log_format == "json" else print_record
        summary = train_drafter(train_source, eval_source, args.model, args.out, cfg,
                                aux_layers=train_source.aux_layers, on_log=on_log)
    except stopping.StopRequested as exc:
        if rank == 0 and not exc.detail:  # the trainer names its checkpoint itself
            print(f"training {exc} outside a training step (loading, evaluating, exporting): "
                  "nothing new to save", file=sys.stderr, flush=True)
        return exc.exit_code
    except EyasError as exc:
        where = f" (rank {rank} of {world})" if world > 1 else ""
        print(f"error{where}: {exc}", file=sys.stderr, flush=True)
        _record_failure(exc)
        return USER_ERROR_EXIT
    except Exception as exc:
        _record_failure(exc)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(summary), flush=True)
    return 0


def _record_failure(exc: BaseException) -> None:
    """Write this rank's error where torchrun's agent reads it back to name the failure. The
    agent's SIGTERM to the other ranks often comes while it is written (a rank failing on its
    lost peer): that stop is only requested, so that the record is whole and says why."""
    if not is_worker():
        return
    with stopping.deferred():
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(exc)


if __name__ == "__main__":
    stopping.install()  # main() itself turns a stop into its exit code
    sys.exit(main())
