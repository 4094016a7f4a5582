"""How long training runs: optimizer steps from epochs, samples and tokens, and an ETA.

`total_steps` is what the trainer runs: ``train.steps``, or, with ``train.epochs`` set,
``ceil(epochs × samples / samples_per_step)`` where a step takes ``processes × grad_accum ×
micro_batch`` samples. `training_plan` adds the tokens those steps read (at the data's mean
sample length, cut at ``max_len``) and, given a training speed in tokens/s (measured in an
earlier run's ``history.json``, or stated), the time they take. ``eyas train --plan`` prints it.
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
    """``{"steps", "epochs", "samples_per_step", "tokens", "eta_s"}`` of training `records`
    samples holding `tokens` tokens (before the ``max_len`` cut, which the mean respects) on
    `processes` processes; ``eta_s`` is None without a speed."""
    if records <= 0 or tokens < 0:
        raise ConfigError(f"a plan needs records > 0 and tokens >= 0 (got {records}, {tokens})",
                          where="eyas train --plan")
    steps = total_steps(cfg, records, processes)
    per_step = samples_per_step(cfg, processes)
    mean = tokens / records
    if cfg.max_len is not None:
        mean = min(mean, cfg.max_len)
    planned = round(steps * per_step * mean)
    return {"steps": steps, "epochs": round(steps * per_step / records, 4),
            "samples_per_step": per_step, "tokens": planned,
            "eta_s": round(planned / tok_s, 1) if tok_s else None}
