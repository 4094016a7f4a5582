"""Tiny randomly initialised models of several architectures, for tests.

They let the pipeline be tested against more than one architecture (dense Llama, Qwen3 with
its q/k norms, a Qwen3 mixture-of-experts, DeepSeek-V3 with multi-head latent attention and
a mixture of experts -- Kimi-K2.5's architecture) without downloading anything. Weights are
seeded random, so outputs are meaningless but reproducible.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoTokenizer,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
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

ARCHES = ("llama", "qwen3", "qwen3_moe", "deepseek_v3")

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
    if arch == "deepseek_v3":
        return _deepseek_v3_config(vocab_size, special), DeepseekV3ForCausalLM
    raise ConfigError(f"unknown architecture {arch!r} (expected one of {', '.join(ARCHES)})")


def _deepseek_v3_config(vocab_size: int, special: dict[str, int]) -> DeepseekV3Config:
    """Kimi-K2.5's layout at toy width: MLA attention (low-rank q and kv, a separate rotary
    slice, value heads of their own width), a dense first layer, then mixture-of-experts
    layers with a shared expert and sigmoid top-k routing, no multi-token-prediction layer.

    Seven layers, so the EAGLE-3 default auxiliary layers are ``[1, 2, 3]`` and start at 1,
    as Kimi's ``[1, 29, 57]`` do. Kimi's YaRN rope scaling is left out (plain RoPE, Kimi's
    base 50,000): it changes no shape or config field eyas reads.
    """
    config = DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        num_nextn_predict_layers=0,
        max_position_embeddings=2048,
        rope_theta=50000.0,
        tie_word_embeddings=False,
        **special,
    )
    return config


def _copy_tokenizer(tokenizer_dir: Path, dest: Path) -> bool:
    """Put the tokenizer of `tokenizer_dir` into `dest`; True when it needs remote code.

    A tokenizer whose class ships with it (``auto_map``, Kimi's kind) is copied file by file,
    as it is; any other is loaded and saved again.
    """
    tokenizer_dir = Path(tokenizer_dir)
    config_path = tokenizer_dir / "tokenizer_config.json"
    if config_path.is_file() and "auto_map" in json.loads(config_path.read_text("utf-8")):
        for item in sorted(tokenizer_dir.iterdir()):
            if item.is_file():
                shutil.copyfile(item, dest / item.name)
        return True
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(dest)
    for extra in ("tokenizer_config.json",):  # keep the portable config as written
        if (tokenizer_dir / extra).exists():
            shutil.copyfile(tokenizer_dir / extra, dest / extra)
    return False


def build_random_model(
    arch: str, out_dir: Path, *, tokenizer_dir: Path | None = None, seed: int = 0
) -> Path:
    """Save a tiny seeded-random `arch` model with the tiny tokenizer into `out_dir`.

    `arch` is one of ``llama``, ``qwen3``, ``qwen3_moe``, ``deepseek_v3`` (ConfigError
    otherwise). The tokenizer is copied from `tokenizer_dir` (a ``trust_remote_code``
    tokenizer, such as `eyas.tiny.kimi_tokenizer`'s, file by file), or trained afresh when it
    is None. The folder holds config, safetensors weights, generation config (eos = the
    tokenizer's eos) and tokenizer files; ``AutoModelForCausalLM.from_pretrained(out_dir)``
    loads it (the model classes are transformers' own; only such a tokenizer needs
    ``trust_remote_code``). Returns `out_dir`.
    """
    out_dir = Path(out_dir)
    if arch not in ARCHES:
        raise ConfigError(f"unknown architecture {arch!r} (expected one of {', '.join(ARCHES)})")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tmp-model-", dir=out_dir) as tmp_str:
        tmp = Path(tmp_str)
        remote_code = False
        if tokenizer_dir is None:
            from eyas.tiny.tokenizer import build_tokenizer

            build_tokenizer(tmp)
        else:
            remote_code = _copy_tokenizer(Path(tokenizer_dir), tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp, trust_remote_code=remote_code)
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
