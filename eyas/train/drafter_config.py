"""The drafter's shape (`DrafterConfig`) and what it reads from the target's ``config.json``:
its attention kind (Llama or MLA), MLA's sizes, rope scaling. No torch: the plan, the export
check and the model card read it without building a model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from eyas.errors import ConfigError
from eyas.hf_target import text_config


class DrafterConfig(BaseModel):
    """Shape of the drafter; written to the exported ``config.json`` (Llama field names)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    hidden_size: int = Field(gt=0)
    """Drafter width H; the frozen embedding it reads must be this wide."""
    target_hidden_size: int = Field(gt=0)
    """Width of each of the target's auxiliary states (``fc`` reads 3× this)."""
    intermediate_size: int = Field(gt=0)
    """MLP width."""
    num_attention_heads: int = Field(gt=0)
    """Query heads."""
    num_key_value_heads: int = Field(gt=0)
    """Key/value heads (grouped-query attention when fewer than query heads)."""
    head_dim: int | None = None
    """Per-head width; ``hidden_size // num_attention_heads`` when unset."""
    vocab_size: int = Field(gt=0)
    """The target's vocabulary size (rows of the embedding)."""
    draft_vocab_size: int = Field(gt=0)
    """Rows of ``lm_head``: the draft vocabulary (see ``eyas.train.vocab``)."""
    rms_norm_eps: float = 1e-5
    """Epsilon of every RMSNorm."""
    rope_theta: float = 10000.0
    """Rotary base (plain RoPE; no scaling is applied, and none is exported)."""
    max_position_embeddings: int = 8192
    """Longest position the drafter is meant to serve (recorded for SGLang)."""
    attention: Literal["llama", "mla"] = "llama"
    """"llama": SGLang's ``LlamaForCausalLMEagle3`` (q/k/v heads); "mla": its
    ``Eagle3DeepseekV2ForCausalLM`` (DeepSeek-V2 multi-head latent attention, `eyas.train.mla`)."""
    q_lora_rank: int | None = Field(None, gt=0)
    """MLA: width of the low-rank query (``q_a_proj`` writes it)."""
    kv_lora_rank: int | None = Field(None, gt=0)
    """MLA: width of the cached key/value latent (``kv_a_proj_with_mqa`` writes it + rope)."""
    qk_nope_head_dim: int | None = Field(None, gt=0)
    """MLA: per-head query/key width without rotary position."""
    qk_rope_head_dim: int | None = Field(None, gt=0)
    """MLA: per-head query/key width that is rotated (the key part is shared by the heads)."""
    v_head_dim: int | None = Field(None, gt=0)
    """MLA: per-head value width."""
    rope_scaling: dict[str, Any] | None = None
    """MLA: the target's YaRN parameters (``factor``, ``original_max_position_embeddings``,
    ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim``); None: plain RoPE."""
    rope_interleave: bool = True
    """MLA: rotate interleaved pairs (2i, 2i+1), as SGLang does unless a config says false."""
    fc_norm: bool = False
    """EAGLE-3.1: an RMSNorm on each auxiliary state before ``fc`` (both SGLang classes read it)."""
    norm_output: bool = False
    """EAGLE-3.1: feed the next draft step the normed output instead of the pre-norm one."""

    @model_validator(mode="after")
    def _check(self) -> DrafterConfig:
        if self.attention == "mla":
            return self._check_mla()
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})",
                where="drafter",
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; set head_dim",
                where="drafter",
            )
        if self.draft_vocab_size > self.vocab_size:
            raise ConfigError(
                f"draft_vocab_size {self.draft_vocab_size} exceeds vocab_size {self.vocab_size}",
                where="drafter",
            )
        return self

    def _check_mla(self) -> DrafterConfig:
        sizes = {k: getattr(self, k) for k in MLA_SIZES}
        missing = [k for k, v in sizes.items() if v is None]
        if missing:
            raise ConfigError(
                f"the MLA drafter needs {', '.join(missing)} (SGLang's Eagle3DeepseekV2ForCausalLM "
                "builds a low-rank query: q_lora_rank cannot be null); set train.mla."
                f"{missing[0]}", where=f"train.mla.{missing[0]}")
        if self.num_key_value_heads != self.num_attention_heads:
            raise ConfigError(
                f"MLA attention has one latent for all heads: num_key_value_heads "
                f"({self.num_key_value_heads}) must equal num_attention_heads "
                f"({self.num_attention_heads})", where="train.mla.num_heads")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim {self.qk_rope_head_dim} must be even "
                              "(rotary pairs)", where="train.mla.qk_rope_head_dim")
        if self.draft_vocab_size > self.vocab_size:
            raise ConfigError(
                f"draft_vocab_size {self.draft_vocab_size} exceeds vocab_size {self.vocab_size}",
                where="drafter",
            )
        return self

    @property
    def dim_per_head(self) -> int:
        """Per-head width of the attention context (MLA: the value heads)."""
        if self.attention == "mla":
            return self.v_head_dim
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """What the server caches per token for this drafter: keys and values of every KV
        head (Llama kind), or the latent and the rotary key (MLA kind)."""
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes
        return 2 * self.num_key_value_heads * self.dim_per_head * dtype_bytes

    @classmethod
    def from_target(cls, target_config: dict, draft_vocab_size: int, *,
                    attention: Literal["llama", "mla"] = "llama",
                    overrides: dict[str, Any] | None = None) -> DrafterConfig:
        """A drafter as wide as the target (its attention/MLP shape), from the target's
        ``config.json`` dict (or its ``text_config``, for Kimi-K2.5's nesting). Raises
        ConfigError naming a missing field.

        A target with multi-head latent attention (DeepSeek-V3, Kimi-K2/K2.5: ``kv_lora_rank``
        in its config) has no Llama head shape to copy: its ``head_dim`` (absent, or written by
        transformers as the rotary slice's width) says nothing about plain attention. The
        drafter then gets `mla_attention_shape`: the target's head counts with heads as wide as
        its value heads (64 heads of 128 for Kimi), the shape public Kimi/DeepSeek EAGLE-3
        drafters use and SGLang's ``LlamaForCausalLMEagle3`` builds from ``head_dim``.
        """
        target_config = text_config(target_config)

        def need(key: str):
            if key not in target_config:
                raise ConfigError(f"target config.json has no '{key}'", where=f"config.json:{key}")
            return target_config[key]

        heads = need("num_attention_heads")
        kv_heads = target_config.get("num_key_value_heads") or heads
        head_dim = target_config.get("head_dim")
        if is_mla(target_config):
            heads, kv_heads, head_dim = mla_attention_shape(target_config)
        rope = target_config.get("rope_parameters") or {}
        extra: dict[str, Any] = {}
        if attention == "mla":
            heads, kv_heads, extra = mla_sizes(target_config)
        extra.update({k: v for k, v in (overrides or {}).items() if v is not None})
        if "num_heads" in extra:
            heads = kv_heads = extra.pop("num_heads")
        return cls(
            hidden_size=need("hidden_size"),
            target_hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=need("vocab_size"),
            draft_vocab_size=draft_vocab_size,
            rms_norm_eps=target_config.get("rms_norm_eps", 1e-5),
            rope_theta=target_config.get("rope_theta") or rope.get("rope_theta", 10000.0),
            max_position_embeddings=target_config.get("max_position_embeddings", 8192),
            attention=attention,
            **extra,
        )


MLA_DEFAULT_HEAD_DIM = 128
"""Drafter head width for an MLA target that names no value-head width."""


def is_mla(target_config: dict) -> bool:
    """Whether a target config describes multi-head latent attention (DeepSeek-V3, Kimi-K2)."""
    return target_config.get("kv_lora_rank") is not None


def mla_attention_shape(target_config: dict) -> tuple[int, int, int]:
    """``(num_attention_heads, num_key_value_heads, head_dim)`` of a drafter for an MLA target.

    The target's query heads and key/value heads (64 and 64 for Kimi-K2.5; DeepSeek-V3 writes
    ``num_key_value_heads`` equal to its heads), each as wide as the target's value heads
    (``v_head_dim``, 128 for both), else ``qk_nope_head_dim``, else 128. This is the shape of
    the public EAGLE-3 drafters for Kimi-K2/K2.5 (SpecForge's ``kimi-k2-eagle3.json``:
    64 heads x 128, 64 KV heads; TorchSpec's ``kimi_k25_eagle3.json`` likewise). Other
    shapes (grouped KV heads, say) are not offered as settings yet.
    """
    heads = target_config["num_attention_heads"]
    kv_heads = target_config.get("num_key_value_heads") or heads
    head_dim = (
        target_config.get("v_head_dim")
        or target_config.get("qk_nope_head_dim")
        or MLA_DEFAULT_HEAD_DIM
    )
    return heads, kv_heads, head_dim


MLA_SIZES = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""The attention sizes of an MLA drafter (``train.*`` settings of the same names)."""


def mla_sizes(target_config: dict) -> tuple[int, int, dict[str, Any]]:
    """``(heads, heads, sizes)`` of an MLA drafter for a target: an MLA target's own sizes,
    heads and YaRN scaling (Kimi-K2.5: 64 heads, q 1536, latent 512, 128 + 64 query/key, 128
    values); for another target, its heads with DeepSeek-V3's proportions of its head width d
    (no-rope d, rope d/2, values d, latent 4d and query 12d, both at most hidden_size)."""
    heads = target_config["num_attention_heads"]
    scaling = yarn_parameters(target_config)
    if is_mla(target_config):
        sizes = {k: target_config.get(k) for k in MLA_SIZES}
    else:
        d = target_config.get("head_dim") or target_config["hidden_size"] // heads
        hidden = target_config["hidden_size"]
        sizes = {"q_lora_rank": min(12 * d, hidden), "kv_lora_rank": min(4 * d, hidden),
                 "qk_nope_head_dim": d, "qk_rope_head_dim": max(2, d // 2 // 2 * 2),
                 "v_head_dim": d}
    sizes["rope_scaling"] = scaling
    sizes["rope_interleave"] = bool(target_config.get("rope_interleave", True))
    return heads, heads, sizes


def yarn_parameters(target_config: dict) -> dict[str, Any] | None:
    """The target's YaRN rope scaling as SGLang's DeepSeek attention reads it (from
    ``rope_scaling``, or transformers 5's ``rope_parameters``); None for plain RoPE. Raises
    ConfigError for another scaling kind, which the MLA drafter does not reproduce."""
    rope = target_config.get("rope_scaling") or target_config.get("rope_parameters") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":
        return None
    if kind not in ("yarn", "deepseek_yarn"):
        raise ConfigError(f"target rope scaling {kind!r}: the MLA drafter reproduces YaRN only",
                          where="config.json:rope_scaling")
    keep = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
            "mscale_all_dim", "extrapolation_factor", "attn_factor")
    return {"type": "yarn", **{k: rope[k] for k in keep if rope.get(k) is not None}}
