"""A process of the 2-process gloo DDP test (importable, so that spawn can start it)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist


def train_small(out: Path, grad_accum: int, *, micro_batch: int = 1, loss_norm: str = "sample",
                stop_rank: int | None = None, resume: bool = False,
                grad_compression: str = "none", teacher_memo: bool = True,
                trainers: list | None = None,
                ) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The small trainer of the DDP test; returns the final weights and the history. With
    `stop_rank`, that rank alone is asked to stop (SIGTERM) before the first step; with
    `resume`, it resumes from ``out/checkpoint`` first; `trainers` receives the Trainer."""
    from eyas.train.config import TrainConfig
    from eyas.train.data import Batches, MemorySource
    from eyas.train.trainer import Trainer

    from .helpers import random_samples, small_drafter, small_vocab

    torch.set_num_threads(1)
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    cfg = TrainConfig(steps=4, lr=3e-3, warmup_steps=1, grad_accum=grad_accum,
                      micro_batch=micro_batch, ttt_steps=2, eval_every=2, log_every=1,
                      device="cpu", loss_norm=loss_norm, grad_compression=grad_compression,
                      teacher_memo=teacher_memo)
    torch.manual_seed(0)
    drafter = small_drafter(seed=0)
    drafter.reset_parameters()
    vocab = small_vocab(drafter.cfg)
    train = Batches(MemorySource(random_samples(8, seed=1)), micro_batch=micro_batch, seed=7,
                    rank=rank, world=world, prefetch=cfg.prefetch)  # read ahead: 4 by default
    evals = Batches(MemorySource(random_samples(4, seed=1)), micro_batch=1, seed=0, rank=rank,
                    world=world, shuffle=False)
    head = torch.randn(50, 32, generator=torch.Generator().manual_seed(3))
    trainer = Trainer(cfg, drafter, vocab, train, evals, out, lm_head_VH=head)
    if trainers is not None:
        trainers.append(trainer)
    if resume:
        trainer.load_checkpoint()
    if stop_rank == rank:
        import signal

        from eyas import stopping

        stopping.request(signal.SIGTERM)
    trainer.fit()
    return {k: v.clone() for k, v in drafter.state_dict().items()}, trainer.state.history


def run(rank: int, world: int, port: int, out: str, loss_norm: str = "sample",
        grad_compression: str = "none") -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        weights, history = train_small(Path(out), grad_accum=2, loss_norm=loss_norm,
                                       grad_compression=grad_compression)
        if rank == 0:
            torch.save({"weights": weights, "history": history}, Path(out) / "ddp.pt")
    finally:
        dist.destroy_process_group()


def run_stopped(rank: int, world: int, port: int, out: str) -> None:
    """Rank 1 alone is asked to stop: every rank records where it stopped, and how."""
    from eyas import stopping

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        train_small(Path(out), grad_accum=2, stop_rank=1)
        outcome = "finished"
    except stopping.StopRequested as exc:
        outcome = f"stopped {exc.exit_code}: {exc.detail}"
    finally:
        dist.destroy_process_group()
    (Path(out) / f"rank{rank}.txt").write_text(outcome)


def run_every_rank(rank: int, world: int, port: int, out: str) -> None:
    """Each rank gives its own figure (what a CUDA rank's peak memory is): all see all."""
    from eyas.train.trainer import every_rank

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        seen = every_rank(2**40 + 1000 * rank, torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(seen))


def run_memo(rank: int, world: int, port: int, out: str, teacher_memo: bool) -> None:
    """The 2-process run of `run`, with or without the teacher memo: each rank saves its
    weights, history and memo (rows by sample, hits, misses)."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    trainers: list = []
    try:
        weights, history = train_small(Path(out), grad_accum=2, teacher_memo=teacher_memo,
                                       trainers=trainers)
    finally:
        dist.destroy_process_group()
    memo = trainers[0].train_memo
    torch.save({"weights": weights, "history": history,
                "memo": None if memo is None else {"rows": memo.rows, "hits": memo.hits,
                                                   "misses": memo.misses,
                                                   "pending": len(memo.pending)}},
               Path(out) / f"rank{rank}.pt")
