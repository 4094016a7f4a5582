"""How long training runs: optimizer steps from epochs, samples and tokens, and an ETA.

`total_steps` is what the trainer runs: ``train.steps``, or, with ``train.epochs`` set,
``ceil(epochs × samples / samples_per_step)`` where a step takes ``processes × grad_accum ×
micro_batch`` samples. `training_plan` adds the tokens those steps read (at the data's mean
sample length, cut at ``max_len``) and, given a training speed in tokens/s (measured in an
earlier run's ``history.json``, or stated), the time they take. ``eyas train --plan`` prints it.

The plan counts what training will count: the train split's records (`train_split`: the
merged total less what ``merge.eval_fraction`` holds out, when only the total is known), and
the processes training will start (`plan_processes`: a stated number, else
``train.processes``, else one per GPU of the host block, else of this machine).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from eyas.errors import ConfigError
from eyas.io import read_json
from eyas.train.config import TrainConfig


def samples_per_step(cfg: TrainConfig, processes: int) -> int:
    """Samples one optimizer step takes over every process."""
    return processes * cfg.grad_accum * cfg.micro_batch


def total_steps(cfg: TrainConfig, samples: int, processes: int) -> int:
    """Optimizer steps of the run: `cfg.steps`, or enough for `cfg.epochs` passes over
    `samples` training samples. Raises ConfigError when epochs are asked of no samples."""
    if cfg.epochs is None:
        return cfg.steps
    if samples <= 0:
        raise ConfigError("train.epochs needs training samples to count passes over, and there "
                          "are none", where="train.epochs")
    return max(1, math.ceil(cfg.epochs * samples / samples_per_step(cfg, processes)))


def plan_processes(cfg: TrainConfig, *, stated: int | None = None,
                   host_gpus: int | None = None, host: str | None = None,
                   local_gpus: int = 0) -> tuple[int, str]:
    """The training processes of a plan and where the number comes from, in the order
    training itself decides it: `stated` (``--processes``: what if), else ``train.processes``
    (the recipe), else one per GPU of the host block `host` (`host_gpus`), else one per GPU of
    this machine (`local_gpus`; 1 without: training here would run on the CPU)."""
    if stated is not None:
        return stated, "stated: --processes"
    if cfg.processes is not None:
        return cfg.processes, "the recipe's train.processes"
    if host_gpus is not None:
        return max(1, host_gpus), f"one per GPU of host block {host}: num_gpus {host_gpus}"
    if local_gpus:
        return local_gpus, f"one per GPU of this machine: {local_gpus}"
    return 1, ("this machine has no GPU and the recipe sets no train.processes: pass "
               "--host-block or --processes for the host that trains")


def train_split(records: int, tokens: int, eval_fraction: float) -> tuple[int, int]:
    """(records, tokens) of the train split of `records` merged records holding `tokens`:
    the merge sends each record to evaluation with probability `eval_fraction`, so about
    ``round(records × eval_fraction)`` of them (and their share of the tokens) are held out."""
    held_out = round(records * eval_fraction)
    train = records - held_out
    return train, round(tokens * train / records) if records else 0


def measured_tok_s(history_file: Path) -> float | None:
    """Median training tokens/s of an earlier run's ``history.json`` (its train records), or
    None when there is none."""
    if not Path(history_file).is_file():
        return None
    rates = sorted(float(r["tok_s"]) for r in read_json(history_file)
                   if r.get("kind") == "train" and r.get("tok_s"))
    return rates[len(rates) // 2] if rates else None


def training_plan(cfg: TrainConfig, *, records: int, tokens: int, processes: int,
                  tok_s: float | None = None) -> dict[str, Any]:
    """``{"steps", "epochs", "samples_per_step", "tokens", "eta_s", "warmup_steps",
    "evaluations", "checkpoints", "checkpoint_basis"}`` of training `records` samples holding
    `tokens` tokens (before the ``max_len`` cut, which the mean respects) on `processes`
    processes; ``eta_s`` is None without a speed, and so is ``checkpoints`` when they are
    timed (``checkpoint_every`` None) and there is no ETA to count them in."""
    if records <= 0 or tokens < 0:
        raise ConfigError(f"a plan needs records > 0 and tokens >= 0 (got {records}, {tokens})",
                          where="eyas train --plan")
    steps = total_steps(cfg, records, processes)
    per_step = samples_per_step(cfg, processes)
    mean = tokens / records
    if cfg.max_len is not None:
        mean = min(mean, cfg.max_len)
    planned = round(steps * per_step * mean)
    eta = round(planned / tok_s, 1) if tok_s else None
    if cfg.checkpoint_every is not None:
        checkpoints: int | None = math.ceil(steps / cfg.checkpoint_every)
        basis = f"every {cfg.checkpoint_every} steps and at the end"
    else:
        checkpoints = (math.ceil(eta / (60 * cfg.checkpoint_minutes)) if eta is not None
                       else None)
        basis = f"every {cfg.checkpoint_minutes:g} minutes of training and at the end"
    return {"steps": steps, "epochs": round(steps * per_step / records, 4),
            "samples_per_step": per_step, "tokens": planned, "eta_s": eta,
            "warmup_steps": cfg.warmup(steps), "evaluations": math.ceil(steps / cfg.eval_every),
            "checkpoints": checkpoints, "checkpoint_basis": basis}
