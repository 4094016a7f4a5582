"""The training loop: AdamW, warmup + cosine, clipping, accumulation, evaluation, exact resume.

One device::

    python -m eyas.train.run --shards W/hidden/train --eval-shards W/hidden/eval \\
        --model TARGET --out W/drafter

Several GPUs on one host (DDP; each process takes every world-th micro-batch; a step's
record covers every process)::

    python -m eyas.train.run --processes 8 ...same arguments...   # torchrun in process
    torchrun --nproc-per-node 8 -m eyas.train.run ...same arguments...

Across nodes (not wired into the flows): ``torchrun --nnodes N --node-rank R --rdzv-endpoint
HOST:PORT -m eyas.train.run ...``.

Memory: attention, the loss and the teacher run in chunks (``eyas.train.ttt``), so a step's
memory grows linearly with the sequence length; ``activation_checkpointing`` trades a third more
compute for less of it. docs/training.md projects the Kimi-K2.5-width drafter at 8,192 tokens
on one 96 GB GPU (it fits with DDP; FSDP is not needed there, and not built).

Checkpoint (``<out>/checkpoint/``, replaced atomically): weights, optimizer, scheduler,
step, data position, RNG states and the metric history. Resuming from it continues the same
run: on CPU the final weights equal an uninterrupted run's bit for bit (a test holds this).
A checkpoint written by another number of processes is refused (`check_same_world`).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import signal
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from eyas import stopping
from eyas.devices import resolve_device
from eyas.errors import ConfigError, DataError
from eyas.io import read_json, write_json
from eyas.layout import BEST, CHECKPOINT, EXPORT, HISTORY
from eyas.train.config import TrainConfig
from eyas.train.data import Batch, Batches
from eyas.train.metrics import acceptance_length, summarise, upgrade_record
from eyas.train.model import Drafter
from eyas.train.teacher_memo import ArgmaxMemo
from eyas.train.ttt import (
    TargetHead,
    Teacher,
    TTTResult,
    scored_counts,
    teacher_from_topk,
    ttt_loss,
)
from eyas.train.vocab import DraftVocab

PREVIOUS_CHECKPOINT = "previous-checkpoint"
"""The checkpoint before ``checkpoint/``, kept so that a damaged newest one (its SHA-256 in
``meta.json`` does not match) is not the end of a run: resumed from instead."""


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """Multiplier of the peak lr at a step: linear warmup (`TrainConfig.warmup`), then cosine
    to `min_lr_ratio` at `cfg.steps`."""

    warmup = cfg.warmup()

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        span = max(1, cfg.steps - warmup)
        progress = min(1.0, (step - warmup) / span)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def make_teacher(batch: Batch, vocab: DraftVocab, head: TargetHead | None,
                 device: torch.device, memo: ArgmaxMemo | None = None) -> Teacher:
    """The batch's teacher: from ``final_hidden`` (needs the target's head) or from top-K.
    With `memo` (and ``batch.indices``), the whole-vocabulary argmax of ``final_hidden`` is
    computed once per sample (``eyas.train.teacher_memo``)."""
    if "final_hidden" in batch.teacher:
        if head is None:
            raise ValueError("storage 'final' needs the target's lm_head")
        final = batch.teacher["final_hidden"].to(device, non_blocking=True)
        if memo is not None and batch.indices is not None:
            return memo.teacher(head, final, batch.indices, batch.lengths)
        return head.teacher(final)
    return teacher_from_topk(batch.teacher["topk_ids"].to(device, non_blocking=True),
                             batch.teacher["topk_logprobs"].to(device, non_blocking=True), vocab)


@dataclass
class Evaluation:
    """Held-out metrics after some step."""

    step: int
    loss: float
    acc: list[float]
    acceptance_length: dict[str, float]
    """τ (bonus token counted) by number of draft steps: 3 and the trained k."""
    simulated_acceptance_length: float
    """τ for the trained k draft steps (the best checkpoint is chosen on the served length:
    `selection_tau`)."""
    tokens: int

    def to_json(self) -> dict:
        return self.__dict__.copy()


@dataclass
class TrainState:
    """Everything besides the modules that a resume needs."""

    step: int = 0
    best: float = -1.0
    history: list[dict] = field(default_factory=list)
    tokens_seen: int = 0


class Trainer:
    """Trains `drafter` on `train` batches; evaluates on `eval_batches` (rank-sharded too).

    `lm_head_VH` is the target's head, needed for storage "final" (kept in its dtype: bf16
    for a real target). `on_log` receives each
    progress/eval record (a dict) on rank 0. `out` receives ``checkpoint/``, ``best/`` and
    ``history.json``. With torch.distributed initialised, the drafter is wrapped in DDP.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        drafter: Drafter,
        vocab: DraftVocab,
        train: Batches,
        eval_batches: Batches | None,
        out: Path,
        *,
        lm_head_VH: torch.Tensor | None = None,
        on_log: Callable[[dict], None] | None = None,
    ) -> None:
        self.cfg, self.vocab, self.train_batches, self.eval_batches = cfg, vocab, train, eval_batches
        self.out = Path(out)
        self.device = resolve_device(cfg.device)
        self.drafter = drafter.to(self.device)
        self.head = (TargetHead(lm_head_VH.to(self.device), vocab, chunk_mb=cfg.chunk_mb)
                     if lm_head_VH is not None else None)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        # The whole-vocabulary argmax of storage "final", once per sample: training's shared
        # by every process (`_share_memo`), evaluation's per process (its share is fixed).
        memo = cfg.teacher_memo and self.head is not None
        self.train_memo = ArgmaxMemo(shared=self.distributed) if memo else None
        self.eval_memo = ArgmaxMemo() if memo else None
        self.checkpoint_path: Path | None = None  # what `load_checkpoint` resumed from
        self._final_verified = False  # checkpoint/ is this run's or verified: kept as previous
        self.module: torch.nn.Module = LossModule(drafter, cfg)
        if self.distributed:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            # Every rank holds the same frozen embedding (2.3 GB at Kimi's size): no buffer
            # broadcast, neither at init nor per forward. torch 2.13 deprecates the flag, and
            # its replacement still broadcasts at init, so keep the flag and its warning quiet.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "`broadcast_buffers` is deprecated",
                                        FutureWarning)
                # Gradients as views into DDP's buckets: no second copy of them (about
                # 5 GB per GPU at the Kimi width).
                self.module = DistributedDataParallel(self.module, device_ids=ids,
                                                      broadcast_buffers=False,
                                                      gradient_as_bucket_view=True)
            if cfg.grad_compression == "bf16":
                self.module.register_comm_hook(None, bf16_gradients)
        self.opt = torch.optim.AdamW(
            [p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas,
            weight_decay=cfg.weight_decay,
        )
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(cfg))
        self.state = TrainState()
        self._last_checkpoint = time.monotonic()
        self.stop_signal: int | None = None
        """Set by `step` when a stop was requested in any process: `fit` checkpoints and stops."""
        self.on_log = on_log if self.rank == 0 else None
        # "bf16" autocasts on any device (CPUs with AVX512-BF16 or AMX run bf16 matmuls
        # several times faster than float32); "auto" picks it on GPUs only.
        self.autocast = cfg.precision == "bf16" or (cfg.precision == "auto"
                                                    and self.device.type == "cuda")

    # -- one step --------------------------------------------------------------------------
    def _forward(self, batch: Batch, module: torch.nn.Module,
                 denominators: list[float] | None = None,
                 memo: ArgmaxMemo | None = None) -> TTTResult:
        teacher = make_teacher(batch, self.vocab, self.head, self.device, memo)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            loss, correct, total, ce = module(
                batch.input_ids.to(self.device, non_blocking=True),
                batch.loss_mask.to(self.device, non_blocking=True),
                batch.aux_on(self.device), teacher, self.vocab, denominators)
        return TTTResult(loss, correct, total, ce)

    def step(self) -> dict:
        """One optimizer step over `grad_accum` micro-batches per process; returns the step's
        record, over every process (loss: their mean; counts and tokens: their sums)."""
        self.module.train()
        self.opt.zero_grad(set_to_none=True)
        tokens, loss_sum = 0, 0.0
        correct = total = None
        batches = [next(self.train_batches) for _ in range(self.cfg.grad_accum)]
        denominators = self._token_denominators(batches) if self.cfg.loss_norm == "token" else None
        for i, batch in enumerate(batches):
            # DDP averages the gradients once, on the last micro-batch's backward.
            last = i == self.cfg.grad_accum - 1
            sync = self.module.no_sync() if self.distributed and not last else nullcontext()
            with sync:
                r = self._forward(batch, self.module, denominators, self.train_memo)
                (r.loss / self.cfg.grad_accum).backward()
            loss_sum += float(r.loss.detach())
            tokens += batch.num_tokens
            correct = r.correct if correct is None else correct + r.correct
            total = r.total if total is None else total + r.total
        self._share_memo()
        norm = torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        # A stop requested in any process (SIGTERM, Ctrl-C) stops every one after this step:
        # the flag rides on the step's own all-reduce, so all agree on the same step.
        stop = stopping.requested() or 0
        if self.distributed:
            loss_sum, tokens, correct, total, stop = self._all_processes(
                loss_sum, tokens, correct, total, stop)
        self.stop_signal = stop or None
        self.state.step += 1
        self.state.tokens_seen += tokens
        return {"step": self.state.step, "loss": loss_sum / self.cfg.grad_accum,
                "grad_norm": float(norm), "lr": self.sched.get_last_lr()[0],
                **summarise(correct, total), "tokens": tokens}

    def _share_memo(self) -> None:
        """Several processes: the argmax rows each computed this step, to every process, until
        the training memo holds every sample (then the same on every process: none calls)."""
        memo = self.train_memo
        if memo is None or not self.distributed or len(memo) >= len(self.train_batches.source):
            return
        memo.share(self.world)
        if len(memo) >= len(self.train_batches.source) and self.rank == 0:
            print(f"teacher memo: the whole-vocabulary argmax of all {len(memo):,} training "
                  f"samples ({memo.tokens:,} tokens, {memo.nbytes / 1e6:,.1f} MB per process) "
                  f"held from step {self.state.step + 1}", flush=True)

    def _token_denominators(self, batches: list[Batch]) -> list[float]:
        """Per TTT step: the scored tokens of the whole step (every micro-batch, every
        process) over processes x grad_accum -- which, as each micro-batch's loss is divided
        by it and DDP and accumulation average, weighs every token of the step the same."""
        counts = sum(scored_counts(b.loss_mask, self.cfg.ttt_steps) for b in batches)
        if self.distributed:
            counts = counts.to(self.device)
            dist.all_reduce(counts)
        return (counts.cpu() / (self.world * self.cfg.grad_accum)).tolist()

    def _all_processes(self, loss_sum: float, tokens: int, correct: torch.Tensor,
                       total: torch.Tensor, stop: int = 0,
                       ) -> tuple[float, int, torch.Tensor, torch.Tensor, int]:
        """A step's figures over every process: the mean loss, summed tokens and counts, and
        the stop signal: this process's own, SIGTERM when only others were asked (0: none)."""
        k = correct.numel()
        packed = torch.cat([torch.tensor([loss_sum, tokens, float(stop > 0)],
                                         dtype=torch.float64, device=self.device),
                            correct.to(self.device, torch.float64),
                            total.to(self.device, torch.float64)])
        dist.all_reduce(packed)  # float64 holds counts exactly up to 2^53
        packed = packed.cpu()
        stop = stop or (int(signal.SIGTERM) if packed[2] > 0 else 0)
        return (float(packed[0]) / self.world, int(packed[1]),
                packed[3:3 + k].round().long(), packed[3 + k:].round().long(), stop)

    # -- evaluation ------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> Evaluation:
        """Loss, per-step accuracy and acceptance length τ on the eval split."""
        assert self.eval_batches is not None
        self.drafter.eval()
        k = self.cfg.ttt_steps
        correct = torch.zeros(k, dtype=torch.int64, device=self.device)
        total = torch.zeros(k, dtype=torch.int64, device=self.device)
        loss_tok = torch.zeros(2, dtype=torch.float64, device=self.device)
        seen = 0
        for batch in self.eval_batches.one_pass():
            if self.cfg.eval_samples is not None and seen >= self.cfg.eval_samples:
                break
            seen += len(batch.ids) * self.world
            r = self._forward(batch, LossModule(self.drafter, self.cfg), memo=self.eval_memo)
            correct += r.correct
            total += r.total
            loss_tok += torch.tensor([float(r.loss) * batch.num_tokens, batch.num_tokens],
                                     dtype=torch.float64, device=self.device)
        if self.distributed:
            for t in (correct, total, loss_tok):
                dist.all_reduce(t)
        m = summarise(correct.cpu(), total.cpu())
        return Evaluation(self.state.step, float(loss_tok[0] / loss_tok[1].clamp(min=1)),
                          m["acc"], m["acceptance_length"], m["simulated_acceptance_length"],
                          int(loss_tok[1]))

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoint_state(self) -> dict:
        return {
            "model": self.drafter.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "data": self.train_batches.state_dict(),
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "state": {"step": self.state.step, "best": self.state.best,
                      "tokens_seen": self.state.tokens_seen, "world": self.world,
                      "best_draft_steps": self.cfg.selection_draft_steps(),
                      "history": json.dumps(self.state.history)},
        }

    def save_checkpoint(self) -> Path:
        """Write ``<out>/checkpoint/`` atomically (rank 0 only); return its path.

        ``meta.json`` records the SHA-256 of ``state.pt`` (hashed as it is written). The
        checkpoint it replaces becomes ``previous-checkpoint/`` when it verified (written by
        this process or resumed from), else it is deleted and the previous one is kept."""
        final = self.out / CHECKPOINT
        if self.rank != 0:
            return final
        tmp = self.out / f".tmp-{CHECKPOINT}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with open(tmp / "state.pt", "wb") as fh:
            hashing = _HashingWriter(fh)
            torch.save(self.checkpoint_state(), hashing)
        write_json(tmp / "meta.json", {"step": self.state.step, "config": self.cfg.model_dump(),
                                       "state_sha256": hashing.sha256.hexdigest()})
        _swap_in(tmp, final, keep=self.out / PREVIOUS_CHECKPOINT if self._final_verified
                 else None)
        self._final_verified = True
        return final

    def load_checkpoint(self, path: Path | None = None) -> bool:
        """Resume from `path` (default ``<out>/checkpoint``, else ``previous-checkpoint`` when
        that one is damaged); False when there is none.

        A checkpoint whose ``state.pt`` does not match the SHA-256 in its ``meta.json`` is
        never resumed (a mapped ``torch.load`` does not check the zip's CRC): the previous one
        is, with a line saying so. Raises DataError (naming the file) when every checkpoint
        there is damaged. A checkpoint written before checksums were recorded is resumed
        unverified."""
        candidates = ([Path(path)] if path else
                      [self.out / CHECKPOINT, self.out / PREVIOUS_CHECKPOINT])
        candidates = [c for c in candidates if (c / "state.pt").is_file()]
        if not candidates:
            return False
        damaged = []
        for candidate in candidates:
            problem = checkpoint_problem(candidate)
            if problem is None:
                break
            damaged.append(problem)
        else:
            raise DataError(f"{'; '.join(damaged)}: no undamaged checkpoint to resume from; "
                            f"delete {' and '.join(str(c) for c in candidates)} to train afresh",
                            path=candidates[0] / "state.pt")
        if damaged and self.rank == 0:
            print(f"{damaged[0]}: not resumed; resuming from {candidate} instead", flush=True)
        self.checkpoint_path = candidate
        self._final_verified = candidate == self.out / CHECKPOINT
        # Mapped, not read: the processes of a run resuming together share one copy of the
        # file in the page cache (8 private copies of a 14 GB checkpoint would take ~115 GB
        # of host memory); pages are copy-on-write, the file is never written through.
        ck = torch.load(candidate / "state.pt", map_location="cpu", weights_only=True, mmap=True)
        check_same_world(ck["state"], self.world, candidate)
        self.drafter.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])
        self.sched.load_state_dict(ck["scheduler"])
        self.train_batches.load_state_dict(ck["data"])
        torch.set_rng_state(ck["rng_cpu"])
        if ck["rng_cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(ck["rng_cuda"])
        s = ck["state"]
        history = [upgrade_record(r) for r in json.loads(s["history"])]
        best = s["best"]
        if history != json.loads(s["history"]) or s.get("best_draft_steps") != \
                self.cfg.selection_draft_steps():
            # written when τ did not count the bonus token, or chosen on another draft length
            best = max((selection_tau(r["acc"], self.cfg) for r in history
                        if r.get("kind") == "eval"), default=-1.0)
        self.state = TrainState(s["step"], best, history, s["tokens_seen"])
        return True

    def save_best(self, evaluation: Evaluation) -> None:
        """Weights of the best drafter so far (by τ at the served draft length,
        `selection_tau`), rank 0 only."""
        if self.rank != 0:
            return
        best = self.out / BEST
        tmp = self.out / f".tmp-{BEST}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in self.drafter.state_dict().items()}
        save_file(tensors, str(tmp / "drafter.safetensors"))
        write_json(tmp / "drafter.json", self.drafter.cfg.model_dump())  # its shape and kind
        n = self.cfg.selection_draft_steps()
        write_json(tmp / "metrics.json", {**evaluation.to_json(), "selected_on": {
            "draft_steps": n, "acceptance_length": selection_tau(evaluation.acc, self.cfg)}})
        _swap_in(tmp, best)

    # -- the loop --------------------------------------------------------------------------
    def _log(self, record: dict) -> None:
        self.state.history.append(record)
        if self.on_log:
            self.on_log(record)

    def fit(self, stop_at: int | None = None) -> TrainState:
        """Train until `cfg.steps` (or `stop_at`, then checkpoint and return).

        Evaluates every `eval_every` steps and at the end, keeping the best checkpoint. A stop
        requested meanwhile (`eyas.stopping`: SIGTERM, Ctrl-C, in any process) ends the step
        under way and what is due at its end (an evaluation), writes the checkpoint and the
        history, and raises `StopRequested` naming the step: a rerun resumes from there.
        """
        end = self.cfg.steps if stop_at is None else min(stop_at, self.cfg.steps)
        t0, tok0 = time.perf_counter(), self.state.tokens_seen
        try:
            with stopping.deferred():  # in the main thread, a signal waits for the step's end
                while self.state.step < end:
                    stopped = self._fit_step(end, t0, tok0)
                    if stopped and self.state.step < end:
                        stop = stopping.StopRequested(
                            stopped, f"training stopped at step {self.state.step}, its "
                            f"checkpoint written ({self.out / CHECKPOINT}): a rerun resumes "
                            f"from it")
                        if self.rank == 0:
                            print(stop, file=sys.stderr, flush=True)
                        raise stop
        finally:
            self.train_batches.close()  # its reader thread, if any
        return self.state

    def _fit_step(self, end: int, t0: float, tok0: int) -> int | None:
        """One step of `fit` and what is due after it; the stop signal when one was requested."""
        rec = self.step()
        s = self.state.step
        stop = self.stop_signal
        if s % self.cfg.log_every == 0 or s == end:
            rec["tok_s"] = (self.state.tokens_seen - tok0) / max(1e-9, time.perf_counter() - t0)
            if self.device.type == "cuda":  # every rank's GPU: what preflight holds to the card
                peaks = every_rank(torch.cuda.max_memory_allocated(self.device), self.device)
                rec["peak_mem_bytes"], rec["peak_mem_bytes_per_rank"] = max(peaks), peaks
                rec["gpu_mem_bytes"] = torch.cuda.get_device_properties(self.device).total_memory
            self._log({"kind": "train", **rec})
        if self.eval_batches is not None and (s % self.cfg.eval_every == 0 or s == self.cfg.steps):
            ev = self.evaluate()
            self._log({"kind": "eval", **ev.to_json()})
            tau = selection_tau(ev.acc, self.cfg)
            if tau > self.state.best:
                self.state.best = tau
                self.save_best(ev)
        if self._checkpoint_due(s) or s == end or stop:
            self.save_checkpoint()
            self._last_checkpoint = time.monotonic()
            if self.rank == 0:
                write_json(self.out / HISTORY, self.state.history)
        return stop

    def _checkpoint_due(self, step: int) -> bool:
        """Every `checkpoint_every` steps; without it, once `checkpoint_minutes` passed since
        the last checkpoint (or the start) -- only the first process writes, so only its
        clock counts."""
        if self.cfg.checkpoint_every is not None:
            return step % self.cfg.checkpoint_every == 0
        return time.monotonic() - self._last_checkpoint >= 60 * self.cfg.checkpoint_minutes


def check_same_world(state: dict, world: int, path: Path) -> None:
    """Refuse to resume a checkpoint (its ``state``) written by a run of another number of
    training processes than `world`: a step takes one sample per process and micro-batch, so
    the step total, the learning-rate schedule and which samples each step takes all follow
    the process count -- resumed with 7 processes what 8 wrote at step 1,000, 71 samples
    would be skipped and 71 seen twice. Raises ConfigError naming both sizes. A checkpoint
    older than this check (no ``world`` recorded) is taken as it is."""
    saved = state.get("world")
    if saved is None or int(saved) == world:
        return
    raise ConfigError(
        f"{path} (step {state['step']}) was written by a training of {saved} process"
        f"{'es' if saved != 1 else ''}, and this one has {world}: the steps, the learning-rate "
        f"schedule and the order of samples follow the number of processes, so it cannot "
        f"resume here. Run it with {saved} processes again (train.processes: {saved}, or a "
        f"host with {saved} GPUs), or move {path} aside to train afresh with {world}",
        where="train.processes")


def bf16_gradients(state, bucket):  # no annotations: DDP compares them with real types
    """DDP communication hook of ``grad_compression: bf16``: each gradient bucket divided by
    the world size, rounded to bfloat16, all-reduced in bfloat16 and written back to the
    float32 bucket -- the arithmetic of torch's ``default_hooks.bf16_compress_hook``, which
    DDP accepts only with NCCL; this one runs on gloo too (the CPU tests and study).
    `bucket`: a ``torch.distributed.GradBucket``; returns a ``torch.futures.Future`` of the
    averaged bucket."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size())
    future = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(done):
        buffer.copy_(done.value()[0])
        return buffer

    return future.then(decompress)


def selection_tau(acc: list[float], cfg: TrainConfig) -> float:
    """τ at the draft length the drafter is served with (`TrainConfig.selection_draft_steps`):
    what chooses the best evaluation -- τ at 7 steps rewards late steps that serving at 3
    never uses."""
    return acceptance_length(acc, cfg.selection_draft_steps())


def every_rank(value: int, device: torch.device) -> list[int]:
    """`value` from every rank of the process group, in rank order (``[value]`` alone).
    Every rank must call it at the same point (the log steps are the same on every rank)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [int(value)]
    mine = torch.tensor([value], dtype=torch.float64, device=device)  # exact up to 2^53
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return [int(t.item()) for t in gathered]


def _swap_in(tmp: Path, final: Path, *, keep: Path | None = None) -> None:
    """Rename the complete folder `tmp` onto `final`: an existing `final` is moved aside to
    ``.old-<name>-<pid>`` first, then deleted -- or, with `keep`, renamed to `keep` (which it
    replaces). A process killed between the two renames leaves no `final`, and both folders
    under their temporary names: `recover_interrupted` puts the complete one back."""
    old = final.parent / f".old-{final.name}-{os.getpid()}"
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if keep is not None and old.exists():
        shutil.rmtree(keep, ignore_errors=True)
        old.rename(keep)
    shutil.rmtree(old, ignore_errors=True)


class _HashingWriter(io.RawIOBase):
    """A binary file that hashes what is written through it (``torch.save`` writes its zip
    in one pass: the digest is the file's, with no second read of tens of GB)."""

    def __init__(self, fh) -> None:
        super().__init__()
        self.fh, self.sha256 = fh, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha256.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def checkpoint_problem(folder: Path) -> str | None:
    """Why the checkpoint in `folder` must not be resumed (its ``state.pt`` does not match the
    SHA-256 its ``meta.json`` records, or ``meta.json`` is unreadable); None when it
    verifies, or was written before checksums were recorded."""
    try:
        meta = read_json(folder / "meta.json")
    except (OSError, DataError) as exc:
        return f"{folder / 'meta.json'}: unreadable ({exc})"
    want = meta.get("state_sha256") if isinstance(meta, dict) else None
    if want is None:
        return None
    h = hashlib.sha256()
    with open(folder / "state.pt", "rb") as fh:
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    if h.hexdigest() != want:
        return (f"{folder / 'state.pt'} does not match the SHA-256 recorded in its meta.json "
                f"(damaged)")
    return None


_COMPLETE = {CHECKPOINT: "meta.json", BEST: "metrics.json", EXPORT: "manifest.json"}
"""What each output folder writes last (a temporary folder holding it is complete)."""


def _writer_gone(folder: Path) -> bool:
    """Whether the process named by a ``.tmp-<name>-<pid>`` / ``.old-<name>-<pid>`` folder
    (this machine's) has ended: only then are its folders leftovers."""
    pid = folder.name.rsplit("-", 1)[-1]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def recover_interrupted(out: Path) -> list[str]:
    """Repair what a training process killed while replacing its checkpoint, best weights or
    export left in `out`, before anything reads them; return what was done, for the log.

    A missing ``checkpoint/`` (``best/``, ``export/``) is taken back from the newest complete
    folder a dead writer left under a temporary name (``.tmp-*``: the one it was renaming
    into place; ``.old-*``: the one it had moved aside) -- without it a resume would start
    over from step 0, and the export would take the last weights instead of the best. Every
    other folder of a dead writer is deleted (each can be the size of a whole checkpoint).
    Folders of a live process are left alone.
    """
    done = []
    for name, last_file in _COMPLETE.items():
        left = sorted(p for p in [*out.glob(f".tmp-{name}-*"), *out.glob(f".old-{name}-*")]
                      if p.is_dir() and _writer_gone(p))
        final = out / name
        if not final.exists():
            complete = [p for p in left if (p / last_file).is_file()]
            if complete:
                # The newest: the renamed-in one (.tmp) over the moved-aside one (.old).
                chosen = max(complete, key=lambda p: (read_json(p / last_file).get("step", 0),
                                                      p.name.startswith(".tmp-")))
                chosen.rename(final)
                left.remove(chosen)
                done.append(f"recovered {final} from {chosen.name}")
        for p in left:
            shutil.rmtree(p, ignore_errors=True)
            done.append(f"deleted {p.name}, left by a process that was killed")
    return done


class LossModule(torch.nn.Module):
    """The drafter with ``ttt_loss`` as its forward, so that DDP sees every parameter used
    (DDP synchronises gradients of what runs under its own ``forward``)."""

    def __init__(self, drafter: Drafter, cfg: TrainConfig) -> None:
        super().__init__()
        self.drafter = drafter
        self.steps, self.chunk_mb = cfg.ttt_steps, cfg.chunk_mb
        self.checkpoint_steps = cfg.activation_checkpointing
        self.kernel = cfg.attention_kernel
        self.objective = cfg.loss

    def forward(self, ids_BT, loss_mask_BT, aux_BTA, teacher: Teacher,
                vocab: DraftVocab, denominators: list[float] | None = None,
                ) -> tuple[torch.Tensor, ...]:
        r = ttt_loss(self.drafter, ids_BT, loss_mask_BT, aux_BTA, teacher, vocab, self.steps,
                     chunk_mb=self.chunk_mb, checkpoint_steps=self.checkpoint_steps,
                     denominators=denominators, kernel=self.kernel,
                     objective=self.objective)
        return r.loss, r.correct, r.total, r.ce
