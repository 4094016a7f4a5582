"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) for the EAGLE-3 drafter: the attention
of SGLang's ``Eagle3DeepseekV2ForCausalLM``, in the form training needs.

What it computes from the 2·H attention input ``x`` (normed embedding ‖ normed hidden), as
SGLang's ``DeepseekV2AttentionMLA`` with the EAGLE-3 layer's doubled input does:

    q      = q_b_proj(q_a_layernorm(q_a_proj(x)))           [A heads × (nope + rope)]
    c, kpe = kv_a_proj_with_mqa(x)                          [latent kv_lora_rank | rope]
    k, v   = kv_b_proj(kv_a_layernorm(c))                   [A heads × (nope | v)]
    key    = k ‖ rotate(kpe)   (the rotary key is one for all heads)
    out    = o_proj(softmax(q·keyᵀ · scale) · v)

SGLang computes the same attention "absorbed" (``w_kc``/``w_vc``, split from ``kv_b_proj`` on
load, fold the up-projection into the query and the output, so its cache holds the latent
``c`` and ``kpe`` only: kv_lora_rank + rope values per token); the product is the same, and
training works in the expanded form above so that ``eyas.train.model.attend_causal`` (memory
linear in T) and the training-time test run unchanged. ``qkv`` returns queries, keys and values
[B, A, T, ·] like the Llama kind's; the keys are (nope + rope) wide and the values v wide.

Rotary position (``rotate_mla``): SGLang rotates interleaved pairs (2i, 2i+1) unless the
config says ``rope_interleave: false``; with the target's YaRN scaling (Kimi-K2.5: factor 64 of
4,096 positions) the frequencies blend interpolation and extrapolation per pair, cos/sin are
scaled by ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)``, and the softmax scale
``(nope + rope)^-½`` is multiplied by ``mscale(factor, mscale_all_dim)²`` -- applied here to the
query, since ``attend`` divides by √(query width).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from eyas.train.drafter_config import DrafterConfig
from eyas.train.norm import RMSNorm


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature for a context `factor` times longer (1 without scaling)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(cfg: DrafterConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [rope/2] of the rotary pairs and the factor on cos/sin.

    Plain RoPE without ``rope_scaling``; with it, YaRN as DeepSeek writes it: pairs that turn
    fewer than `beta_slow` times over the original context are interpolated (divided by
    `factor`), those turning more than `beta_fast` times kept, a linear ramp between."""
    d, base = cfg.qk_rope_head_dim, cfg.rope_theta
    pos_freqs = base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    inv_freq = 1.0 / pos_freqs
    y = cfg.rope_scaling
    if not y:
        return inv_freq.float(), 1.0
    factor = float(y.get("factor", 1.0))
    original = float(y.get("original_max_position_embeddings", cfg.max_position_embeddings))

    def dim_of(rotations: float) -> float:  # pair index that turns `rotations` times
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(dim_of(float(y.get("beta_fast", 32)))), 0)
    high = min(math.ceil(dim_of(float(y.get("beta_slow", 1)))), d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = (1 - ramp) * float(y.get("extrapolation_factor", 1.0))
    inv_freq = inv_freq / factor * (1 - keep) + inv_freq * keep
    scale = (yarn_mscale(factor, float(y.get("mscale", 1.0)))
             / yarn_mscale(factor, float(y.get("mscale_all_dim", 0.0)))
             * float(y.get("attn_factor", 1.0)))
    return inv_freq.float(), scale


def softmax_factor(cfg: DrafterConfig) -> float:
    """What SGLang multiplies the MLA softmax scale by: ``mscale(factor, mscale_all_dim)²``."""
    y = cfg.rope_scaling
    if not y:
        return 1.0
    m = yarn_mscale(float(y.get("factor", 1.0)), float(y.get("mscale_all_dim", 0.0)))
    return m * m


def rotate_mla(x_BATR: torch.Tensor, pos_BT: torch.Tensor, inv_freq: torch.Tensor,
               scale: float, interleave: bool) -> torch.Tensor:
    """Rotate the rotary slice [B, A or 1, T, R] at positions `pos_BT`: pairs (2i, 2i+1)
    when `interleave` (SGLang's default for DeepSeek), else halves (i, i + R/2)."""
    ang_BTd = pos_BT.float()[..., None] * inv_freq.to(x_BATR.device)
    cos = (ang_BTd.cos() * scale)[:, None].to(x_BATR.dtype)
    sin = (ang_BTd.sin() * scale)[:, None].to(x_BATR.dtype)
    if interleave:
        x1, x2 = x_BATR[..., 0::2], x_BATR[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    r = x_BATR.shape[-1] // 2
    x1, x2 = x_BATR[..., :r], x_BATR[..., r:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class MLAAttention(nn.Module):
    """Latent attention whose down-projections read 2·H (embedding ‖ hidden) and whose output
    writes H. Parameter names are DeepSeek's (and the exported checkpoint's)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        A, H2 = cfg.num_attention_heads, 2 * cfg.hidden_size
        nope, rope, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.q_a_proj = nn.Linear(H2, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, A * (nope + rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H2, cfg.kv_lora_rank + rope, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, A * (nope + dv), bias=False)
        self.o_proj = nn.Linear(A * dv, cfg.hidden_size, bias=False)
        inv_freq, self.rope_scale = rope_frequencies(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.q_factor = softmax_factor(cfg)

    def latent(self, x_BT2H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What SGLang caches per token: the normed latent [B, T, kv_lora_rank] and the
        un-rotated rotary key [B, T, rope] (rotated by `qkv`)."""
        c, kpe = self.kv_a_proj_with_mqa(x_BT2H).split(
            [self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim], dim=-1)
        return self.kv_a_layernorm(c), kpe

    def qkv(self, x_BT2H: torch.Tensor, pos_BT: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries and keys [B, A, T, nope + rope] (queries carry the softmax scale's
        YaRN factor) and values [B, A, T, v]."""
        cfg = self.cfg
        B, T, _ = x_BT2H.shape
        A, nope, rope = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x_BT2H)))
        q_nope, q_pe = q.view(B, T, A, nope + rope).transpose(1, 2).split([nope, rope], -1)
        c, kpe = self.latent(x_BT2H)
        k_nope, v = self.kv_b_proj(c).view(B, T, A, nope + cfg.v_head_dim).transpose(1, 2) \
            .split([nope, cfg.v_head_dim], -1)
        q_pe = rotate_mla(q_pe, pos_BT, self.inv_freq, self.rope_scale, cfg.rope_interleave)
        k_pe = rotate_mla(kpe[:, None], pos_BT, self.inv_freq, self.rope_scale,
                          cfg.rope_interleave)
        q = torch.cat([q_nope, q_pe], dim=-1)
        if self.q_factor != 1.0:
            q = q * self.q_factor
        k = torch.cat([k_nope, k_pe.expand(B, A, T, rope)], dim=-1)
        return q, k, v.contiguous()

    def out(self, ctx_BATD: torch.Tensor) -> torch.Tensor:
        B, A, T, d = ctx_BATD.shape
        return self.o_proj(ctx_BATD.transpose(1, 2).reshape(B, T, A * d))


@torch.no_grad()
def init_from_target_attention(attn: MLAAttention, weights: dict[str, torch.Tensor]) -> None:
    """Start the drafter's attention as the target's (weights of one of its layers, by short
    name): the down-projections, which read 2·H (embedding ‖ hidden) where the target's read
    H, take the target's weights on the hidden half and zero on the embedding half, so the
    layer starts by attending as the target's layer does over the fed states; the rest is
    copied. Raises ConfigError naming the first weight whose shape differs (the drafter's MLA
    sizes or width differ from the target's)."""
    from eyas.errors import ConfigError

    H = attn.cfg.hidden_size
    for name, src in weights.items():
        dst = getattr(attn, name).weight
        widened = name in ("q_a_proj", "kv_a_proj_with_mqa")
        want = (dst.shape[0], H) if widened else tuple(dst.shape)
        if tuple(src.shape) != tuple(want):
            raise ConfigError(
                f"the target's {name} is {tuple(src.shape)}, the drafter's needs {tuple(want)}: "
                "train.mla.init_attention: target wants the target's own MLA sizes and hidden size",
                where="train.mla.init_attention")
        if widened:
            dst.zero_()
            dst[:, H:].copy_(src.to(dst.dtype))
        else:
            dst.copy_(src.to(dst.dtype))
