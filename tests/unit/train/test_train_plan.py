"""How long training runs: `train.epochs`, `eyas train --plan` (eyas.train.plan)."""

from __future__ import annotations

import json
import math
import uuid

import pytest
import torch
from support.paths import REPO as ROOT

from eyas.cli import main as eyas_main
from eyas.config import load_config
from eyas.errors import ConfigError
from eyas.io import write_json
from eyas.manifest import write_manifest
from eyas.train.config import TrainConfig
from eyas.train.plan import total_steps, training_plan


def test_epochs_set_the_steps_from_samples_and_the_global_batch():
    assert total_steps(TrainConfig(steps=7), 24_773, 8) == 7
    cfg = TrainConfig(epochs=2, micro_batch=1, grad_accum=1)
    assert total_steps(cfg, 24_773, 8) == math.ceil(2 * 24_773 / 8) == 6_194
    cfg = TrainConfig(epochs=0.5, micro_batch=2, grad_accum=3, steps=5)  # steps ignored
    assert total_steps(cfg, 100, 2) == math.ceil(50 / 12)
    with pytest.raises(ConfigError, match="train.epochs"):
        total_steps(TrainConfig(epochs=1), 0, 1)


def test_a_plan_counts_tokens_at_the_mean_length_cut_at_max_len():
    plan = training_plan(TrainConfig(epochs=3, max_len=100), records=10, tokens=2_000,
                         processes=2, tok_s=50.0)
    assert plan == {"steps": 15, "epochs": 3.0, "samples_per_step": 2, "tokens": 3_000,
                    "eta_s": 60.0, "warmup_steps": 0, "evaluations": 1, "checkpoints": 1,
                    "checkpoint_basis": "every 30 minutes of training and at the end"}
    assert training_plan(TrainConfig(steps=4), records=8, tokens=80, processes=1)["eta_s"] is None


def test_the_kimi_recipe_trains_at_least_two_epochs():
    cfg = load_config(ROOT / "recipes" / "kimi-k2.5.yaml")
    assert cfg.train.epochs is not None and cfg.train.epochs >= 2


def test_train_plan_prints_json_last_from_stated_figures(capsys):
    code = eyas_main(["train", "--plan", "--config", str(ROOT / "recipes" / "kimi-k2.5.yaml"),
                      "--records", "24773", "--tokens", "87800000", "--processes", "8",
                      "--tok-s", "32000"])
    assert code == 0
    out = capsys.readouterr().out.strip().splitlines()
    plan = json.loads(out[-1])
    epochs = load_config(ROOT / "recipes" / "kimi-k2.5.yaml").train.epochs
    assert plan["train_records"] == 24_773 - round(24_773 * 0.01) == 24_525
    assert plan["steps"] == math.ceil(epochs * 24_525 / 8)
    assert plan["samples_per_step"] == 8 and plan["epochs"] >= epochs
    assert plan["eta_s"] == pytest.approx(plan["tokens"] / 32_000, rel=1e-3)
    assert plan["processes_from"] == "stated: --processes"
    assert set(plan) == {"steps", "epochs", "samples_per_step", "tokens", "eta_s",
                         "warmup_steps", "evaluations", "checkpoints", "checkpoint_basis",
                         "processes", "processes_from", "train_records", "merged_records"}


KIMI_PLAN = ["train", "--plan", "--config", str(ROOT / "recipes" / "kimi-k2.5.yaml"),
             "--records", "24773", "--tokens", "87800000"]
"""The issue's command (issue 27): the users' merged totals, no processes stated."""


def _kimi_steps() -> int:
    """The real run's steps: 4 epochs of the train split (24,773 merged less 1 % held out)
    at 8 samples a step (one per GPU of the 8-GPU host)."""
    cfg = load_config(ROOT / "recipes" / "kimi-k2.5.yaml")
    train = 24_773 - round(24_773 * cfg.merge.eval_fraction)
    return math.ceil(cfg.train.epochs * train / 8)


def test_the_kimi_plan_counts_the_processes_training_will_use_without_a_host_block(capsys):
    assert eyas_main(KIMI_PLAN) == 0
    out = capsys.readouterr().out
    plan = json.loads(out.strip().splitlines()[-1])
    assert (plan["processes"], plan["samples_per_step"]) == (8, 8)
    assert plan["processes_from"] == "the recipe's train.processes"
    assert plan["steps"] == _kimi_steps() == 12_263
    assert plan["train_records"] == 24_525 and plan["merged_records"] == 24_773
    assert plan["warmup_steps"] == round(0.015 * 12_263) == 184
    assert "about 24,525 train records" in out and "8 processes (the recipe's" in out


def test_the_kimi_plan_takes_the_host_blocks_gpus_when_the_recipe_leaves_processes_unset(
        tmp_path, capsys, prefect_harness):
    from blocks.gpu_host import GpuHost

    name = f"plan-{uuid.uuid4().hex[:8]}"
    GpuHost(host="192.0.2.10", user="train", num_gpus=8, known_hosts=None).save(name)
    recipe = tmp_path / "kimi.yaml"
    text = (ROOT / "recipes" / "kimi-k2.5.yaml").read_text()
    assert "  processes: 8 " in text
    recipe.write_text(text.replace("  processes: 8 ", "  # processes: 8 "))
    assert load_config(recipe).train.processes is None
    args = [*KIMI_PLAN[:3], str(recipe), *KIMI_PLAN[4:], "--host-block", name]
    assert eyas_main(args) == 0
    plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plan["processes"] == 8 and plan["steps"] == _kimi_steps()
    assert plan["processes_from"] == f"one per GPU of host block {name}: num_gpus 8"
    # the recipe's own number wins (training takes it), and a host too small is said
    small = f"plan-small-{uuid.uuid4().hex[:8]}"
    GpuHost(host="192.0.2.11", user="train", num_gpus=4, known_hosts=None).save(small)
    assert eyas_main([*KIMI_PLAN, "--host-block", small]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1])["processes"] == 8
    assert f"host block {small} has 4: training there would refuse to start" in out
    # without the recipe's number and without a host: this machine's GPUs, or 1 and why
    assert eyas_main([*KIMI_PLAN[:3], str(recipe), *KIMI_PLAN[4:]]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1])["processes"] == max(
        1, torch.cuda.device_count())
    if not torch.cuda.is_available():
        assert "pass --host-block or --processes" in out


def test_train_plan_reads_the_workdir_and_a_measured_speed(tmp_path, capsys):
    merged = tmp_path / "run" / "merged"
    merged.mkdir(parents=True)
    write_json(merged / "stats.json", {"train": {"records": 40, "tokens": 4_000}})
    write_manifest(merged, phase="merge", outputs=[merged / "stats.json"],
                   counts={"train_records": 40, "eval_records": 2})
    drafter = tmp_path / "run" / "drafter"
    drafter.mkdir()
    write_json(drafter / "history.json", [{"kind": "train", "step": s, "tok_s": r}
                                          for s, r in ((1, 90.0), (2, 100.0), (3, 110.0))]
               + [{"kind": "eval", "step": 3}])
    recipe = tmp_path / "r.yaml"
    recipe.write_text((ROOT / "recipes" / "tiny-demo.yaml").read_text()
                      .replace("micro_batch: 4", "micro_batch: 4\n  epochs: 2"))
    assert eyas_main(["train", "--plan", "--config", str(recipe), "--workdir",
                      str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    plan = json.loads(out.strip().splitlines()[-1])
    assert plan["steps"] == 20 and plan["tokens"] == 8_000 and plan["eta_s"] == 80.0
    assert "measured (drafter/history.json)" in out
    # no merged data: the error says what to do
    assert eyas_main(["train", "--plan", "--config", str(recipe), "--workdir",
                      str(tmp_path / "x")]) != 0
    assert "run `eyas prepare`, or pass --records and --tokens" in capsys.readouterr().err


def test_training_with_epochs_runs_the_steps_they_make(tiny_target, tmp_path, capsys):
    from eyas.train.data import MemorySource
    from eyas.train.run import train_drafter

    from .helpers import random_samples

    width = json.loads((tiny_target / "config.json").read_text())["hidden_size"]
    vocab = json.loads((tiny_target / "config.json").read_text())["vocab_size"]
    torch.manual_seed(0)
    src = MemorySource(random_samples(6, vocab=vocab, width=width))
    cfg = TrainConfig(epochs=2, micro_batch=4, ttt_steps=2, eval_every=100, log_every=1,
                      device="cpu", draft_vocab_size=64, warmup_steps=1)
    summary = train_drafter(src, None, tiny_target, tmp_path / "out", cfg, aux_layers=[1, 2, 3])
    assert summary["steps"] == math.ceil(2 * 6 / 4) == 3
    assert "2 epochs of 6 samples: 3 steps" in capsys.readouterr().out


def test_the_training_task_counts_epochs_from_the_merged_manifest(tmp_path):
    """What the train task compares a found drafter's steps with (and moves its progress
    bar to): the steps the epochs make of the merged train records; None before the merge."""
    from eyas.config import PipelineConfig
    from eyas.remote.hosts import HostSpec, connect
    from eyas.train.resume import planned_steps

    base = load_config(ROOT / "recipes" / "tiny-demo.yaml").model_dump()
    cfg = PipelineConfig.model_validate(base | {"train": base["train"] | {"epochs": 3}})
    with connect(HostSpec.local(data_root="/")) as h:
        assert planned_steps(cfg, str(tmp_path), h, 2) is None
        merged = tmp_path / "merged"
        merged.mkdir()
        (merged / "x").write_text("x")
        write_manifest(merged, phase="merge", outputs=[merged / "x"], counts={"train_records": 10})
        assert planned_steps(cfg, str(tmp_path), h, 2) == math.ceil(3 * 10 / (2 * 4))
        plain = PipelineConfig.model_validate(base | {"train": base["train"] | {"steps": 9}})
        assert planned_steps(plain, str(tmp_path), h, 2) == 9
