"""Tiny randomly initialised models of several architectures, for tests.

They let the pipeline be tested against more than one architecture (dense Llama, Qwen3 with
its q/k norms, a Qwen3 mixture-of-experts) without downloading anything. Weights are seeded
random, so outputs are meaningless but reproducible.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from eyas.errors import ConfigError

ARCHES = ("llama", "qwen3", "qwen3_moe")

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)


def _config(arch: str, vocab_size: int, special: dict[str, int]) -> tuple[PretrainedConfig, type]:
    if arch == "llama":
        return LlamaConfig(vocab_size=vocab_size, **_COMMON, **special), LlamaForCausalLM
    if arch == "qwen3":
        return (
            Qwen3Config(vocab_size=vocab_size, head_dim=16, **_COMMON, **special),
            Qwen3ForCausalLM,
        )
    if arch == "qwen3_moe":
        config = Qwen3MoeConfig(
            vocab_size=vocab_size,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            **_COMMON,
            **special,
        )
        return config, Qwen3MoeForCausalLM
    raise ConfigError(f"unknown architecture {arch!r} (expected one of {', '.join(ARCHES)})")


def build_random_model(
    arch: str, out_dir: Path, *, tokenizer_dir: Path | None = None, seed: int = 0
) -> Path:
    """Save a tiny seeded-random `arch` model with the tiny tokenizer into `out_dir`.

    `arch` is one of ``llama``, ``qwen3``, ``qwen3_moe`` (ConfigError otherwise). The
    tokenizer is copied from `tokenizer_dir`, or trained afresh when it is None. The folder
    holds config, safetensors weights, generation config (eos = end-of-turn) and tokenizer
    files; ``AutoModelForCausalLM.from_pretrained(out_dir)`` loads it. Returns `out_dir`.
    """
    out_dir = Path(out_dir)
    if arch not in ARCHES:
        raise ConfigError(f"unknown architecture {arch!r} (expected one of {', '.join(ARCHES)})")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tmp-model-", dir=out_dir) as tmp_str:
        tmp = Path(tmp_str)
        if tokenizer_dir is None:
            from eyas.tiny.tokenizer import build_tokenizer

            build_tokenizer(tmp)
        else:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
            tokenizer.save_pretrained(tmp)
            for extra in ("tokenizer_config.json",):  # keep the portable config as written
                if (Path(tokenizer_dir) / extra).exists():
                    shutil.copyfile(Path(tokenizer_dir) / extra, tmp / extra)
        tokenizer = AutoTokenizer.from_pretrained(tmp)
        special = {
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        }
        config, model_cls = _config(arch, len(tokenizer), special)
        torch.manual_seed(seed)
        model: PreTrainedModel = model_cls(config)
        model.generation_config = GenerationConfig(**special, do_sample=False)
        model.save_pretrained(tmp, safe_serialization=True)
        for item in sorted(tmp.iterdir()):
            target = out_dir / item.name
            if target.is_dir():
                shutil.rmtree(target)
            shutil.move(str(item), str(target))
    return out_dir
