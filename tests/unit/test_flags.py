"""Command-line flags derived from a config type (eyas.flags)."""

from __future__ import annotations

import argparse

import pytest

from eyas.errors import ConfigError
from eyas.extract.config import ExtractConfig
from eyas.flags import add_config_flags, config_from_flags
from eyas.train.config import TrainConfig


def _parser(model) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_flags(p, model)
    return p


def test_flags_follow_the_field_types_and_leave_defaults_to_the_config():
    p = _parser(ExtractConfig)
    args = p.parse_args(["--storage", "topk", "--topk", "8", "--aux-layers", "1,29,57",
                         "--no-quarantine-nonfinite", "--disk-margin", "0.5"])
    cfg = config_from_flags(ExtractConfig, args)
    assert (cfg.storage, cfg.topk, cfg.aux_layers, cfg.quarantine_nonfinite, cfg.disk_margin) == (
        "topk", 8, [1, 29, 57], False, 0.5)
    assert cfg.shard_size == ExtractConfig().shard_size  # not given: the config's default
    with pytest.raises(SystemExit):
        p.parse_args(["--storage", "everything"])  # choices come from the Literal
    assert "--shard-size" in p.format_help() and "(default: 256)" in p.format_help()


def test_flags_override_a_base_and_invalid_values_name_the_field():
    p = _parser(TrainConfig)
    cfg = config_from_flags(TrainConfig, p.parse_args(["--steps", "7"]), {"steps": 3, "lr": 0.5})
    assert (cfg.steps, cfg.lr) == (7, 0.5)
    assert "--betas" not in p.format_help()  # a tuple: YAML only
    with pytest.raises(ConfigError, match="steps"):
        config_from_flags(TrainConfig, p.parse_args(["--steps", "0"]))


def test_a_nested_sections_fields_are_flags_under_its_name_and_merge_with_its_base():
    p = _parser(TrainConfig)
    assert "--mla-kv-lora-rank" in p.format_help() and "--kv-lora-rank" not in p.format_help()
    args = p.parse_args(["--drafter", "mla", "--mla-kv-lora-rank", "64",
                         "--mla-init-attention", "target"])
    cfg = config_from_flags(TrainConfig, args, {"mla": {"q_lora_rank": 96}, "steps": 5})
    assert (cfg.mla.kv_lora_rank, cfg.mla.q_lora_rank, cfg.mla.init_attention, cfg.steps) == (
        64, 96, "target", 5)  # the base's other section fields stay
    untouched = config_from_flags(TrainConfig, p.parse_args([]), {"drafter": "mla",
                                                                  "mla": {"v_head_dim": 8}})
    assert untouched.mla.v_head_dim == 8 and untouched.mla.kv_lora_rank is None
    with pytest.raises(ConfigError, match="mla.qk_rope_head_dim"):
        config_from_flags(TrainConfig, p.parse_args(["--drafter", "mla",
                                                     "--mla-qk-rope-head-dim", "1"]))
