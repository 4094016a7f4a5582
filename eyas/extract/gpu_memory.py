"""GPU memory of the SGLang extraction engine for a DeepSeek-V3-style MoE target with MLA
(DeepSeek-V3, Kimi-K2/K2.5), per GPU under tensor parallelism: arithmetic, not a measurement.

    m = engine_memory(text_config, tp_size=8, gpu_bytes=97887 * 2**20,
                      mem_fraction_static=0.85, forward_tokens=8192,
                      routed_bytes_per_param=0.5 + 2 / 32,
                      vision_params=moonvit_params(vision_config))
    m.weights / 2**30, m.kv_pool_tokens, m.outside_static / 2**30

What SGLang does with such a model under TP (read from its DeepSeek-V2 model class): the
routed and shared experts, the dense MLPs, the up-projections of attention (q_b, kv_b), the
output projection, the embedding and the LM head are split `tp_size` ways; the MLA
down-projections (q_a, kv_a) and the routers are replicated, and so is the latent KV cache:
``(kv_lora_rank + qk_rope_head_dim)`` values per token and layer on every rank.
``mem_fraction_static`` is the share of the card for weights + KV pool; activations, CUDA
context and NCCL live in the rest. docs/runbook-kimi.md applies it to Kimi-K2.5 on 96 GB cards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def mla_kv_bytes_per_token(num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int,
                           dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token takes with multi-head latent attention (every layer)."""
    return num_layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes


@dataclass(frozen=True)
class EngineMemory:
    """Bytes per GPU (parameters are counted over the whole model)."""

    routed_params: int
    split_params: int
    """bf16 parameters split over the ranks (shared experts, dense MLPs, attention
    up/out-projections, embedding, LM head)."""
    replicated_params: int
    """bf16 parameters on every rank (MLA down-projections, routers), the vision tower aside."""
    weights: float
    kv_bytes_per_token: int
    kv_pool: float
    kv_pool_tokens: int
    outside_static: float
    """What ``mem_fraction_static`` leaves for activations, CUDA context, NCCL."""
    activations: float
    """Estimate for one forward of `forward_tokens` (hidden states, MoE and attention
    intermediates, eyas's aux-state copy)."""


def _get(cfg: dict[str, Any], key: str) -> int:
    try:
        return int(cfg[key])
    except KeyError:
        raise ValueError(f"config has no {key!r} (a DeepSeek-V3-style MLA/MoE text config, "
                         f"or for the vision tower a MoonViT vision_config, is expected: "
                         f"Kimi-K2.5's text_config / vision_config)") from None


def moonvit_params(vision: dict[str, Any]) -> int:
    """Parameters of the vision tower SGLang builds for Kimi-K2.5 (``srt/models/kimi_k25.py``:
    ``MoonViT3dPretrainedModel`` + ``K2VLMultiModalProjector``) from its ``vision_config``
    (``vt_hidden_size``, ``vt_intermediate_size``, ``vt_num_hidden_layers``, ``patch_size``,
    ``init_pos_emb_height``/``_width``, ``merge_kernel_size``, ``text_hidden_size``): per block
    two LayerNorms, fused qkv and output projection, a two-layer MLP (biases included); the
    patch convolution, the learned 2-D position table and the final norm; the projector's
    pre-norm and two linears on 2x2-merged patches. Raises ValueError for a missing key."""
    h, i = _get(vision, "vt_hidden_size"), _get(vision, "vt_intermediate_size")
    layers, patch = _get(vision, "vt_num_hidden_layers"), _get(vision, "patch_size")
    pos = _get(vision, "init_pos_emb_height") * _get(vision, "init_pos_emb_width")
    merge_h, merge_w = vision.get("merge_kernel_size", [2, 2])
    merged, text = h * merge_h * merge_w, _get(vision, "text_hidden_size")
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
    tower = layers * block + (3 * patch * patch * h + h) + pos * h + 2 * h
    projector = 2 * h + (merged * merged + merged) + (merged * text + text)
    return tower + projector


def engine_memory(cfg: dict[str, Any], *, tp_size: int, gpu_bytes: float,
                  mem_fraction_static: float, forward_tokens: int,
                  routed_bytes_per_param: float = 2.0, vision_params: float = 0.0,
                  kv_dtype_bytes: int = 2) -> EngineMemory:
    """Per-GPU memory of the engine for the text config `cfg` (``hidden_size``,
    ``num_hidden_layers``, ``first_k_dense_replace``, ``n_routed_experts``,
    ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``,
    ``intermediate_size``, ``num_attention_heads``, ``q_lora_rank``, ``kv_lora_rank``,
    ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``, ``vocab_size``).

    `routed_bytes_per_param`: 2 for bf16; 0.5 + 2/32 for INT4 with one bf16 scale per 32
    (compressed-tensors W4A16, Kimi-K2.5's routed experts). `vision_params`: a replicated
    bf16 vision tower (`moonvit_params` for Kimi-K2.5). Raises ValueError for a missing key.
    """
    h, layers = _get(cfg, "hidden_size"), _get(cfg, "num_hidden_layers")
    dense = _get(cfg, "first_k_dense_replace")
    moe = layers - dense
    experts, topk = _get(cfg, "n_routed_experts"), _get(cfg, "num_experts_per_tok")
    i_e, i_d = _get(cfg, "moe_intermediate_size"), _get(cfg, "intermediate_size")
    shared = _get(cfg, "n_shared_experts")
    heads, q_rank, kv_rank = (_get(cfg, "num_attention_heads"), _get(cfg, "q_lora_rank"),
                              _get(cfg, "kv_lora_rank"))
    nope, rope, vh = (_get(cfg, "qk_nope_head_dim"), _get(cfg, "qk_rope_head_dim"),
                      _get(cfg, "v_head_dim"))
    vocab = _get(cfg, "vocab_size")

    routed = moe * experts * 3 * h * i_e
    split = (moe * shared * 3 * h * i_e + dense * 3 * h * i_d
             + layers * (q_rank * heads * (nope + rope) + kv_rank * heads * (nope + vh)
                         + heads * vh * h)
             + 2 * vocab * h)
    replicated = layers * h * (q_rank + kv_rank + rope) + moe * experts * h
    weights = (routed * routed_bytes_per_param / tp_size + split * 2 / tp_size
               + replicated * 2 + vision_params * 2)
    kv_tok = mla_kv_bytes_per_token(layers, kv_rank, rope, kv_dtype_bytes)
    static = mem_fraction_static * gpu_bytes
    kv_pool = max(0.0, static - weights)
    n = forward_tokens
    activations = (6 * n * h * 2                                   # residual, norms, outputs
                   + 2 * n * topk * (2 * i_e // tp_size) * 2       # experts' gate/up, act
                   + 2 * n * (heads // tp_size) * (2 * (nope + rope) + vh) * 2  # q, k, v
                   + n * 3 * h * 2)                                # the hook's aux states
    return EngineMemory(routed, split, replicated, weights, kv_tok, kv_pool,
                        int(kv_pool // kv_tok), gpu_bytes - static, activations)
