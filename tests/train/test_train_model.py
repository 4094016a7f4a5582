"""The drafter module: shapes, names, frozen embedding, configuration errors."""

from __future__ import annotations

import pytest
import torch

from eyas.errors import ConfigError
from eyas.train.model import Drafter, DrafterConfig

from .helpers import small_config, small_drafter


def test_shapes_with_a_target_wider_than_the_drafter():
    drafter = small_drafter(target_hidden_size=48)
    assert drafter.fc.weight.shape == (32, 144)
    ids = torch.randint(0, 50, (2, 5))
    h = drafter.fc(torch.randn(2, 5, 144))
    out = drafter.forward_causal(ids, h, torch.arange(5).expand(2, 5))
    assert out.shape == (2, 5, 32) and drafter.logits(out).shape == (2, 5, 24)


def test_embedding_is_frozen_and_not_saved():
    drafter = small_drafter()
    names = set(drafter.state_dict())
    assert not any("embed" in n for n in names)
    assert "fc.weight" in names and "midlayer.hidden_norm.weight" in names
    assert all(p is not drafter.embed_VH for p in drafter.parameters())


def test_configuration_errors_name_the_field():
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        small_config(num_key_value_heads=3)
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        small_config(draft_vocab_size=51)
    with pytest.raises(ConfigError, match="hidden_size"):
        Drafter(small_config(), torch.zeros(50, 16))


def test_from_target_copies_the_target_shape():
    cfg = DrafterConfig.from_target({"hidden_size": 4096, "intermediate_size": 14336,
                                     "num_attention_heads": 32, "num_key_value_heads": 8,
                                     "vocab_size": 128256, "rope_theta": 500000.0}, 32000)
    assert cfg.dim_per_head == 128 and cfg.target_hidden_size == 4096
    with pytest.raises(ConfigError, match="vocab_size"):
        DrafterConfig.from_target({"hidden_size": 8, "intermediate_size": 8,
                                   "num_attention_heads": 2}, 4)


def test_causal_forward_without_a_mask_equals_the_explicit_mask():
    """``attend_causal`` in chunks of one query equals ``attend`` over a tril mask (float64,
    1e-12), gradients included."""
    drafter = small_drafter(seed=4).double()
    ids = torch.randint(0, 50, (2, 9))
    hidden = torch.randn(2, 9, 32, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(9).expand(2, 9)
    chunked = drafter.forward_causal(ids, hidden, pos, chunk_mb=1e-6)
    (g_chunked,) = torch.autograd.grad(chunked.square().sum(), hidden)
    tril = torch.ones(9, 9, dtype=torch.bool).tril().expand(2, 9, 9)
    dense = drafter.forward_causal(ids, hidden, pos, tril)
    (g_dense,) = torch.autograd.grad(dense.square().sum(), hidden)
    torch.testing.assert_close(chunked, dense, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_chunked, g_dense, rtol=1e-12, atol=1e-12)


def test_a_bf16_embedding_is_read_exactly_in_float32():
    drafter = small_drafter()
    bf16 = Drafter(drafter.cfg, drafter.embed_VH.bfloat16())
    ids = torch.randint(0, 50, (1, 5))
    rows = bf16.embed(ids)
    assert rows.dtype == torch.float32
    assert torch.equal(rows, drafter.embed_VH.bfloat16().float()[ids])
