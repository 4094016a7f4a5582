"""Check 5, training: a short run (``preflight.train_steps``, 20 by default) through eyas's own
training launch (`eyas.train.run`: torchrun over every GPU, or the processes the recipe asks
for) on the samples the capture check extracted, at the recipe's drafter shape and
``max_len``. Its peak memory per GPU is held against the card, and its tokens/s give the ETA
of the planned steps (`eyas.train.plan.training_plan`). The drafter it exports is what the
serving check loads.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from eyas.layout import RunLayout
from eyas.preflight.proc import run_bounded
from eyas.preflight.result import CheckFailed, CheckResult
from eyas.train import run as core
from eyas.train.config import TrainConfig
from eyas.train.plan import training_plan

NAME = "training"
MEMORY_LIMIT = 0.95
"""Peak memory above this fraction of the card fails: the long run's longer samples would not fit."""


def memory_verdict(last: Mapping[str, Any], data: dict[str, Any], detail: str = "") -> str:
    """What a step record's peak memory says (each rank's GPU against the card), added to
    `data`; `CheckFailed` when a GPU's peak is above `MEMORY_LIMIT` of its card."""
    card = int(last["gpu_mem_bytes"])
    peaks = [int(p) for p in last.get("peak_mem_bytes_per_rank") or [last["peak_mem_bytes"]]]
    peak = max(peaks)
    data.update(peak_mem_bytes=peak, peak_mem_bytes_per_rank=peaks, gpu_mem_bytes=card)
    gib = 2**30
    where = (f"the highest of {len(peaks)} GPUs, rank {peaks.index(peak)}'s; all of them "
             f"{min(peaks) / gib:,.1f}-{peak / gib:,.1f} GiB" if len(peaks) > 1 else "its GPU")
    said = f"; peak memory {peak / gib:,.1f} of {card / gib:,.1f} GiB ({where})"
    if peak > MEMORY_LIMIT * card:
        raise CheckFailed(detail + said, fix="lower train.micro_batch, or turn on "
                          "train.activation_checkpointing; the long run's samples are as "
                          "long as these at most", data=data,
                          figure=f"{peak / card:.0%} of GPU memory (rank {peaks.index(peak)})")
    return said


def short_config(cfg: TrainConfig, steps: int, processes: int) -> TrainConfig:
    """The recipe's training settings (shape, max_len, micro-batch, precision, device) cut to
    `steps` steps on `processes` processes, logging every step, no evaluation."""
    return cfg.model_copy(update={"steps": steps, "epochs": None, "processes": processes,
                                  "warmup_steps": min(cfg.warmup(), max(0, steps - 1)),
                                  "log_every": 1, "eval_every": steps, "checkpoint_every": steps})


def _readable_tail(lines: list[str], n: int = 15) -> str:
    """The last `n` lines of a training's output, step records as readable lines."""
    out = []
    for line in lines[-n:]:
        rec = core.parse_record(line)
        out.append(core.format_record(rec) if rec is not None else line)
    return "\n".join(out)


def check_training(*, work: Path, model_dir: Path, cfg: TrainConfig, steps: int,
                   processes: int, aux_layers: list[int] | None, timeout_s: float,
                   records: int, tokens: int, gpu_env: Mapping[str, str] | None = None,
                   trust_remote_code: bool = False) -> CheckResult:
    """Check 5 on the shards in ``work/hidden/train``; `records` and `tokens` (the whole
    training split) turn the measured tokens/s into the ETA."""
    run = RunLayout(work)
    shards = run.hidden_dir("train")
    if not shards.is_dir():
        raise CheckFailed("not run: no captured samples to train on (the capture check failed)",
                          fix="fix the capture check first")
    out = run.drafter_dir
    shutil.rmtree(out, ignore_errors=True)  # a fresh short run, never a resume
    short = short_config(cfg, steps, processes)
    config_file = work / "train.yaml"
    config_file.write_text(yaml.safe_dump(short.model_dump(mode="json")))
    argv = core.argv(sys.executable, data="offline", train=str(shards),
                     eval_=str(run.hidden_dir("eval")), model=str(model_dir), out=str(out),
                     config_file=str(config_file), aux_layers=aux_layers,
                     trust_remote_code=trust_remote_code, processes=processes,
                     die_with_parent=True)
    records_seen: list[dict[str, Any]] = []

    def on_line(line: str) -> None:
        rec = core.parse_record(line)
        if rec is not None and rec["kind"] == "train":
            records_seen.append(rec)

    done = run_bounded(argv, timeout_s=timeout_s, env={**os.environ, **(gpu_env or {})},
                       on_line=on_line)
    if done.timed_out:
        if records_seen:
            rate = records_seen[-1]["tok_s"]
            raise CheckFailed(
                f"the {steps}-step training did not finish within {timeout_s:g}s: it was still "
                f"stepping ({len(records_seen)} of {steps} steps, {rate:,.0f} tokens/s)",
                fix="lower preflight.train_steps or raise preflight.check_timeout_s",
                data={"tok_s": rate})
        raise CheckFailed(f"the {steps}-step training did not finish a step within "
                          f"{timeout_s:g}s:\n{_readable_tail(done.lines)}",
                          fix="a hang in training's collectives (see the collectives check) "
                              "or a slow host: raise preflight.check_timeout_s")
    if done.code != 0:
        raise CheckFailed(f"the {steps}-step training over {processes} process(es) exited with "
                          f"{done.code}:\n{_readable_tail(done.lines)}",
                          fix="see the error above (train.* settings, the GPU memory, the "
                              "target folder); rerun preflight once fixed")
    if not records_seen:
        raise CheckFailed("the training printed no step records", fix="see its output")
    last = records_seen[-1]
    tok_s = float(last["tok_s"])
    plan = training_plan(cfg, records=records, tokens=tokens, processes=processes, tok_s=tok_s)
    detail = (f"{last['step']} steps over {processes} process(es) at max_len {cfg.max_len}, "
              f"micro_batch {cfg.micro_batch}: loss {records_seen[0]['loss']:.3f} -> "
              f"{last['loss']:.3f}, {tok_s:,.0f} tokens/s; the plan: {plan['steps']:,} steps, "
              f"{plan['tokens']:,} tokens")
    data: dict[str, Any] = {"tok_s": tok_s, "train_s": plan["eta_s"], "plan": plan,
                            "export": str(run.export)}
    partial = ""
    if "peak_mem_bytes" in last:
        detail += memory_verdict(last, data, detail)
    else:
        partial = "no GPU here: peak GPU memory not measured (CPU training)"
    if not (run.export / "config.json").is_file():
        raise CheckFailed(f"the training exported no drafter to {run.export}",
                          fix="see the training output", data=data)
    return CheckResult(NAME, True, detail, figure=f"{tok_s:,.0f} tokens/s", partial=partial,
                       data=data)
