"""Small real drafters and batches for the training tests (no tiny target needed)."""

from __future__ import annotations

import torch

from eyas.train.model import Drafter, DrafterConfig
from eyas.train.vocab import DraftVocab


def small_config(**overrides) -> DrafterConfig:
    """A 32-wide drafter over a 50-token target vocabulary, 24 of them drafted."""
    fields = dict(
        hidden_size=32,
        target_hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=50,
        draft_vocab_size=24,
    )
    fields.update(overrides)
    return DrafterConfig(**fields)


def small_drafter(seed: int = 0, **overrides) -> Drafter:
    return _drafter(small_config(**overrides), seed)


def _drafter(cfg: DrafterConfig, seed: int) -> Drafter:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=g)
    torch.manual_seed(seed)
    # A larger init than training's so that attention weights are far from uniform and a
    # wrong mask changes the logits visibly.
    drafter = Drafter(cfg, embed)
    drafter.reset_parameters(std=0.2)
    return drafter


def small_vocab(cfg: DrafterConfig) -> DraftVocab:
    """Every other target id, then the rest, up to draft_vocab_size (increasing)."""
    ids = sorted((list(range(0, cfg.vocab_size, 2)) + list(range(1, cfg.vocab_size, 2)))
                 [: cfg.draft_vocab_size])
    return DraftVocab(torch.tensor(ids, dtype=torch.int64), cfg.vocab_size)


def random_samples(n: int, *, vocab: int = 50, width: int = 32, seed: int = 0,
                   storage: str = "final", topk: int = 4) -> list[dict[str, torch.Tensor]]:
    """`n` samples of 6..13 tokens, loss mask on their second half, bf16 states."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        T = int(torch.randint(6, 14, (1,), generator=g))
        mask = torch.zeros(T, dtype=torch.long)
        mask[T // 2 :] = 1
        s = {"input_ids": torch.randint(0, vocab, (T,), generator=g), "loss_mask": mask,
             "aux_hidden": torch.randn(T, 3 * width, generator=g).bfloat16()}
        if storage == "final":
            s["final_hidden"] = torch.randn(T, width, generator=g).bfloat16()
        else:
            logits = torch.randn(T, vocab, generator=g).log_softmax(-1)
            values, ids = logits.topk(topk, -1)
            s["topk_ids"], s["topk_logprobs"] = ids, values.half()
        out.append(s)
    return out


YARN = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16, "beta_fast": 4.0,
        "beta_slow": 1.0, "mscale": 0.7, "mscale_all_dim": 1.0}
"""Kimi-K2.5's kind of YaRN scaling at toy size (its own: factor 64 of 4,096 positions); the
two mscales differ so that both the cos/sin factor and the softmax factor are not 1."""


def small_mla_config(**overrides) -> DrafterConfig:
    """A 32-wide MLA drafter (4 heads, latent 12, query 20, 8 + 4 query/key, 6 values)."""
    fields = dict(attention="mla", num_key_value_heads=4, q_lora_rank=20, kv_lora_rank=12,
                  qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    fields.update(overrides)
    return small_config(**fields)


def small_mla_drafter(seed: int = 0, **overrides) -> Drafter:
    drafter = _drafter(small_mla_config(**overrides), seed)
    if drafter.cfg.fc_norm:  # norms away from 1 so that a missing one shows
        with torch.no_grad():
            for norm in drafter.fc_norm:
                norm.weight.uniform_(0.5, 1.5)
    return drafter
