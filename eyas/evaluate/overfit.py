"""The overfit gate: a drafter trained to memorise one or two answers must be served as well
as it was trained, or training and serving disagree about something.

SpecForge's one-sample serving check, built from eyas's own parts:

1. **Samples** (`gate_records`): the prompts of the first usable merged records, each with
   the *target's own greedy answer* (`answer_tokens` long at most). A drafter can only be
   accepted on every draft when the served target writes what it was trained on, and greedy
   decoding is what the target writes deterministically (the merged answers were usually
   sampled, or written by another model).
2. **Capture and train** (`train_overfit`): eyas's extraction (`eyas.extract.run.extract`,
   the recipe's backend: HF on CPU, SGLang on a host) and eyas's trainer
   (`eyas.train.run.train_drafter`) at the recipe's drafter shape and options, `steps` steps
   of a large learning rate on those samples only, evaluated on the same samples; then the
   trainer's own export. Training's τ on the samples (the export manifest's evaluation at
   ``draft_tokens`` k) is the **offline τ**; memorised, it is near k + 1.
3. **Measure** the export on the same prompts, greedy, k draft tokens: on CPU with eyas's
   offline evaluator (`eyas.evaluate.run.evaluate`: the export loaded as a server loads it,
   real speculative decoding against the HF target: `measure_offline`); on a host with
   SGLang (`eyas.preflight.serving.serve_prompts`).
4. **Verdict** (`verdict`): the offline τ must be at least `NEAR_MAX` × (k + 1) (else the
   drafter did not memorise: a training problem, not a serving one), and the measured accept
   length at least (1 - `tolerance`) × the offline τ.

The tolerance (`TOLERANCE`, 0.15 by default): what separates the two figures legitimately is
small -- the export's bfloat16 weights against training's float32, the last verification of an
answer cut short by its length, a near tie the server's kernels break the other way; each costs
a few per cent of τ. Anything a broken export does costs far more: aux layers one off, a d2t
shifted by one, ``fc_norm`` weights missing or rope scaling dropped take τ to 1-2 out of 4
(tests/unit/evaluate/test_overfit.py breaks exports on purpose, `break_export`, and holds the gate
failing on each).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from eyas.errors import ConfigError, DataError
from eyas.io import read_json, write_json

TOLERANCE = 0.15
"""Default: the measured accept length may fall this fraction below the offline τ."""
NEAR_MAX = 0.85
"""Training's τ on the samples must reach this fraction of k + 1 (the drafter memorised them)."""
STEPS = 60
"""Default optimizer steps of the overfit training."""
LR = 3e-3
"""Learning rate of the overfit training: memorising two answers wants a large one."""
ANSWER_TOKENS = 48
"""Default length of the target's greedy answer to each gate prompt."""
BREAKS = ("aux-shift", "fc-norm-dropped", "d2t-off-by-one", "rope-scaling-removed")
"""The ways `break_export` breaks an export on purpose."""


@dataclass
class GateResult:
    """What the gate measured and said."""

    ok: bool
    detail: str
    offline_tau: float | None
    measured_tau: float | None
    max_tau: int
    tolerance: float
    export: str | None = None
    measured_by: str = ""
    per_prompt: list[dict[str, Any]] = field(default_factory=list)
    measured_ok: bool | None = None
    """The measured accept length's verdict alone (None: nothing measured)."""
    static_failures: list[str] = field(default_factory=list)
    """The static checks (`eyas.train.export_check`) the export failed."""

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail, "offline_tau": self.offline_tau,
                "measured_tau": self.measured_tau, "max_tau": self.max_tau,
                "tolerance": self.tolerance, "export": self.export,
                "measured_by": self.measured_by, "per_prompt": self.per_prompt,
                "measured_ok": self.measured_ok, "static_failures": self.static_failures}


# -- 1. samples -----------------------------------------------------------------------------
def gate_prompts(merged: Path, samples: int, *, max_prompt_tokens: int = 1024) -> list[list[int]]:
    """The prompts (tokens before the first supervised one) of the first `samples` records of
    `merged` that have one of at most `max_prompt_tokens` tokens. DataError when none has."""
    from eyas.evaluate.prompts import prompt_of_record

    out: list[list[int]] = []
    with open(merged) as fh:
        for line in fh:
            if len(out) == samples:
                break
            if line.strip():
                rec = json.loads(line)
                ids = prompt_of_record(rec["input_ids"], rec["loss_mask"])
                if ids and len(ids) <= max_prompt_tokens:
                    out.append(list(ids))
    if not out:
        raise DataError(f"no record has a prompt of at most {max_prompt_tokens} tokens before "
                        "its answer", path=merged)
    return out


def greedy_answers_hf(model_dir: Path, prompts: Sequence[Sequence[int]], *, answer_tokens: int,
                      device: str = "cpu", trust_remote_code: bool = False) -> list[list[int]]:
    """The target's greedy answer to each prompt (HF transformers, eyas's own decoding loop:
    the one the offline evaluator verifies with), stopping at its end-of-answer token."""
    from eyas.devices import resolve_device
    from eyas.evaluate.run import stop_ids
    from eyas.evaluate.speculate import generate
    from eyas.evaluate.target import Target, load_target, resolve_dtype
    from eyas.extract.hf_backend import decoder_layers
    from eyas.layers import default_aux_layers

    dev = resolve_device(device)
    model = load_target(Path(model_dir), dev, resolve_dtype("auto", dev),
                        trust_remote_code=trust_remote_code)
    tokenizer = _tokenizer(model_dir, trust_remote_code)
    layers = default_aux_layers(len(decoder_layers(model)[1]))
    target = Target(model, layers)
    stops = stop_ids(model, tokenizer)
    return [generate(target, None, p, max_new_tokens=answer_tokens, stop_ids=stops).tokens
            for p in prompts]


def _tokenizer(model_dir: Path, trust_remote_code: bool):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None


def gate_records(prompts: Sequence[Sequence[int]],
                 answers: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
    """Merged-format records: each prompt (unsupervised) followed by its answer (supervised)."""
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts, {len(answers)} answers")
    out = []
    for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
        if not a:
            raise DataError(f"the target answered gate prompt {i} with nothing")
        out.append({"id": f"overfit-{i}", "dataset": "overfit", "input_ids": [*p, *a],
                    "loss_mask": [0] * len(p) + [1] * len(a)})
    return out


# -- 2. capture and train -------------------------------------------------------------------
def overfit_config(cfg, *, samples: int, steps: int, draft_tokens: int, lr: float = LR):
    """The recipe's `TrainConfig` (drafter kind, shape, EAGLE-3.1 options, precision, device)
    made to memorise `samples` samples: `steps` steps of `lr` without warmup or decay, all
    samples in every step, TTT as long as the k drafts served, evaluated at the end, one
    process, whole samples."""
    return cfg.model_copy(update={
        "steps": steps, "epochs": None, "lr": lr, "warmup_steps": 0, "min_lr_ratio": 1.0,
        "weight_decay": 0.0, "micro_batch": samples, "grad_accum": 1, "group_batches": 1,
        "processes": 1, "max_len": None, "ttt_steps": draft_tokens, "eval_every": steps,
        "eval_samples": None, "checkpoint_every": steps, "log_every": steps, "prefetch": 0,
        "init_head": "target"})


def train_overfit(work: Path, model_dir: Path, records: list[dict[str, Any]], *, extract_cfg,
                  train_cfg, draft_tokens: int, steps: int = STEPS,
                  trust_remote_code: bool = False,
                  say: Callable[[str], None] = print) -> Path:
    """Capture `records` into ``work/hidden`` with `extract_cfg` (storage "final"), train the
    overfit drafter into ``work/drafter`` (`overfit_config` of `train_cfg`) and return its
    export folder. Every rerun starts fresh."""
    from eyas.extract.run import extract
    from eyas.train.run import open_sources, train_drafter
    from eyas.train.tiny_data import write_jsonl

    work = Path(work)
    for sub in ("hidden", "drafter"):
        shutil.rmtree(work / sub, ignore_errors=True)
    merged = write_jsonl(work / "samples.jsonl", records)
    ecfg = extract_cfg.model_copy(update={"storage": "final", "shard_size": len(records)})
    extract(merged, work / "hidden", model_dir=Path(model_dir), cfg=ecfg,
            trust_remote_code=trust_remote_code)
    cfg = overfit_config(train_cfg, samples=len(records), steps=steps, draft_tokens=draft_tokens)
    shards = work / "hidden"
    source, evals = open_sources("offline", shards, shards, Path(model_dir), cfg)
    summary = train_drafter(source, evals, Path(model_dir), work / "drafter", cfg,
                            aux_layers=source.aux_layers, on_log=None)
    if not summary.get("export"):
        raise DataError("the overfit training exported no drafter", path=work / "drafter")
    say(f"overfit drafter: {summary['steps']} steps on {len(records)} sample(s), exported to "
        f"{summary['export']}")
    return Path(summary["export"])


def offline_tau(export: Path, draft_tokens: int) -> float:
    """Training's τ on the gate samples at k = `draft_tokens` drafts, from the evaluation the
    export's manifest records. DataError when it records none."""
    from eyas.evaluate.drafters import exported_metrics
    from eyas.evaluate.metrics import simulated_acceptance_length

    metrics = exported_metrics(Path(export))
    if not metrics or not metrics.get("acc"):
        raise DataError("the export records no training evaluation (acc)", path=export)
    return float(simulated_acceptance_length(metrics["acc"], draft_tokens))


# -- 3. measure ------------------------------------------------------------------------------
def measure_offline(model_dir: Path, export: Path, prompts: Sequence[Sequence[int]], out: Path,
                    *, draft_tokens: int, max_new_tokens: int, device: str = "cpu",
                    trust_remote_code: bool = False) -> tuple[float, list[dict[str, Any]]]:
    """The accept length of `export` on `prompts` by eyas's offline evaluator (greedy, k drafts,
    no baselines), its report in `out`; with one ``{"prompt", "accept_length", "tokens"}``
    per prompt."""
    from eyas.evaluate.config import EvaluateConfig
    from eyas.evaluate.prompts import Prompt, PromptSelection
    from eyas.evaluate.run import GENERATIONS, TRAINED, evaluate

    cfg = EvaluateConfig(draft_tokens=draft_tokens, mode="greedy", max_new_tokens=max_new_tokens,
                         baselines=[], device=device, merged_eval=False,
                         prompts_per_dataset=None)
    selection = PromptSelection([Prompt(f"overfit-{i}", "overfit", tuple(p))
                                 for i, p in enumerate(prompts)])
    report = evaluate(Path(model_dir), Path(export), selection, cfg, Path(out),
                      trust_remote_code=trust_remote_code, tokenizer=_tokenizer(
                          model_dir, trust_remote_code), on_log=None)
    per_prompt = []
    with open(Path(out) / GENERATIONS) as fh:
        for line in fh:
            row = json.loads(line)
            if row["method"] == TRAINED:
                al = row["accept_lengths"]
                per_prompt.append({"prompt": row["id"], "tokens": len(row["tokens"]),
                                   "accept_length": sum(al) / len(al) if al else None})
    tau = report["acceptance_length"]
    if tau is None:
        raise DataError("the offline evaluator measured no verification", path=out)
    return float(tau), per_prompt


# -- 4. verdict ------------------------------------------------------------------------------
def verdict(offline: float, measured: float, draft_tokens: int, *,
            tolerance: float = TOLERANCE, measured_by: str = "served") -> tuple[bool, str]:
    """``(ok, what it says)`` for the offline and measured τ (module docstring's rule)."""
    top = draft_tokens + 1
    if offline < NEAR_MAX * top:
        return False, (f"the overfit drafter did not memorise its samples: training's τ "
                       f"{offline:.2f} < {NEAR_MAX:.0%} of the maximum {top} (raise the "
                       "overfit steps; the gate cannot judge serving before)")
    floor = (1 - tolerance) * offline
    if measured < floor:
        return False, (f"{measured_by} accept length {measured:.2f} against training's "
                       f"{offline:.2f} on the same samples (maximum {top}): below the "
                       f"{floor:.2f} the tolerance {tolerance:.0%} allows -- training and "
                       "serving disagree (aux layer ids, d2t, fc_norm/norm_output weights, "
                       "rope scaling, the chat template); `eyas check-export` names which")
    return True, (f"{measured_by} accept length {measured:.2f}, training's τ {offline:.2f} on "
                  f"the same samples (maximum {top}, floor {floor:.2f} at tolerance "
                  f"{tolerance:.0%})")


def run_gate(*, work: Path, model_dir: Path, merged: Path, extract_cfg, train_cfg,
             draft_tokens: int, samples: int = 2, steps: int = STEPS,
             answer_tokens: int = ANSWER_TOKENS, tolerance: float = TOLERANCE,
             device: str = "cpu", trust_remote_code: bool = False,
             answers: Callable[[list[list[int]]], list[list[int]]] | None = None,
             measure: Callable[[Path, list[list[int]]], tuple[float, list[dict[str, Any]]]]
             | None = None, measured_by: str = "offline evaluator's",
             say: Callable[[str], None] = print) -> GateResult:
    """The whole gate in ``work`` (module docstring). `answers` gives the target's greedy
    answers to the gate prompts (default: HF, `greedy_answers_hf`); `measure` the accept
    length of an export on them (default: eyas's offline evaluator, `measure_offline`)."""
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    prompts = gate_prompts(Path(merged), samples)
    if answers is None:
        def answers(ps):
            return greedy_answers_hf(model_dir, ps, answer_tokens=answer_tokens, device=device,
                                     trust_remote_code=trust_remote_code)
    records = gate_records(prompts, answers(prompts))
    export = train_overfit(work, model_dir, records, extract_cfg=extract_cfg,
                           train_cfg=train_cfg, draft_tokens=draft_tokens, steps=steps,
                           trust_remote_code=trust_remote_code, say=say)
    result = judge(export, work=work, model_dir=model_dir, prompts=prompts,
                   draft_tokens=draft_tokens, max_new_tokens=max(
                       len(r["input_ids"]) - len(p) for r, p in zip(records, prompts, strict=True)),
                   tolerance=tolerance, device=device, trust_remote_code=trust_remote_code,
                   measure=measure, measured_by=measured_by)
    write_json(work / "gate.json", {**result.to_json(), "prompts": prompts})
    return result


def judge(export: Path, *, work: Path, model_dir: Path, prompts: list[list[int]],
          draft_tokens: int, max_new_tokens: int, tolerance: float = TOLERANCE,
          device: str = "cpu", trust_remote_code: bool = False, offline: float | None = None,
          measure=None, measured_by: str = "offline evaluator's",
          static: bool = True) -> GateResult:
    """Measure `export` on `prompts` and give the verdict against `offline` (default: the τ
    its own manifest records). With `static`, the export's static checks
    (`eyas.train.export_check`) are held against the overfit run in `work` (its shards and
    vocabulary) too, and any that fails fails the gate. An export that does not load fails
    the gate, naming why."""
    from eyas.errors import EyasError
    from eyas.train.export_check import check_export, failures

    top = draft_tokens + 1
    work = Path(work)
    if offline is None:
        offline = offline_tau(export, draft_tokens)
    if measure is None:
        def measure(exp, ps):
            return measure_offline(model_dir, exp, ps, work / "evaluate",
                                   draft_tokens=draft_tokens, max_new_tokens=max_new_tokens,
                                   device=device, trust_remote_code=trust_remote_code)
    failed = failures(check_export(export, shard_dirs=[work / "hidden"],
                                   vocab_dir=work / "drafter" / "vocab")) if static else []
    said = "".join(f"; static check {c.name} fails: {c.detail}" for c in failed)
    try:
        measured, per_prompt = measure(Path(export), prompts)
    except (EyasError, KeyError, RuntimeError, ValueError) as exc:
        return GateResult(False, f"the export at {export} does not load or serve: "
                          f"{type(exc).__name__}: {exc}{said}", offline, None, top, tolerance,
                          str(export), measured_by, static_failures=[c.name for c in failed])
    ok, detail = verdict(offline, measured, draft_tokens, tolerance=tolerance,
                         measured_by=measured_by)
    return GateResult(ok and not failed, detail + said, offline, measured, top, tolerance,
                      str(export), measured_by, per_prompt,
                      measured_ok=ok, static_failures=[c.name for c in failed])


# -- exports broken on purpose --------------------------------------------------------------
def break_export(export: Path, out: Path, how: str) -> Path:
    """A copy of `export` at `out` broken the way `how` (one of `BREAKS`) says, as a mistake
    would break it: config.json naming every aux layer one later; the ``fc_norm`` weights
    left out of the weights; ``d2t`` mapping each draft token onto the next target token;
    ``rope_scaling`` cleared from config.json. Raises ConfigError when the export has nothing
    to break that way (no fc_norm, no rope scaling)."""
    if how not in BREAKS:
        raise ConfigError(f"unknown break {how!r}; one of {list(BREAKS)}", where="how")
    from eyas.train.export import WEIGHTS

    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(export, out)
    config = read_json(out / "config.json")
    if how == "aux-shift":
        ec = config["eagle_config"]
        ec["eagle_aux_hidden_state_layer_ids"] = [
            i + 1 for i in ec["eagle_aux_hidden_state_layer_ids"]]
        write_json(out / "config.json", config)
    elif how == "rope-scaling-removed":
        if not config.get("rope_scaling"):
            raise ConfigError(f"{export}/config.json has no rope_scaling to remove",
                              where="rope_scaling")
        config["rope_scaling"] = None
        write_json(out / "config.json", config)
    else:
        tensors = load_file(str(out / WEIGHTS))
        if how == "fc-norm-dropped":
            dropped = [k for k in tensors if k.startswith("fc_norm.")]
            if not dropped:
                raise ConfigError(f"{export} has no fc_norm weights to drop", where="fc_norm")
            for k in dropped:
                del tensors[k]
        else:  # d2t off by one: draft id i names target token d2t[i] + i + 1 (in range)
            d2t = tensors["d2t"]
            target = d2t + torch.arange(d2t.numel(), dtype=d2t.dtype)
            tensors["d2t"] = torch.where(target + 1 < int(config["vocab_size"]), d2t + 1, d2t)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / WEIGHTS),
                  metadata={"format": "pt"})
    return out
