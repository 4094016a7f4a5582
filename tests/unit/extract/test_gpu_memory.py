"""The engine's GPU-memory arithmetic reproduces the runbook's Kimi-K2.5 figures (TP 8 on
96 GB cards; docs/runbook-kimi.md, recipes/kimi-k2.5.yaml's engine_args)."""

import pytest

from eyas.extract.gpu_memory import engine_memory, mla_kv_bytes_per_token, moonvit_params

GiB = 2**30
CARD = 97887 * 2**20  # nvidia-smi memory.total of an RTX PRO 6000 Blackwell
# Kimi-K2.5's text model: its model card (61 layers, 1 dense, 384 + 1 experts of 2,048, 8 a
# token, hidden 7,168, 64 heads, vocabulary 163,840) with DeepSeek-V3's MLA widths.
KIMI = {"hidden_size": 7168, "num_hidden_layers": 61, "first_k_dense_replace": 1,
        "n_routed_experts": 384, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
        "n_shared_experts": 1, "intermediate_size": 18432, "num_attention_heads": 64,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840}
W4A16 = 0.5 + 2 / 32
# Kimi-K2.5's config.json vision_config (MoonViT), the fields SGLang's tower is built from
VISION = {"vt_hidden_size": 1152, "vt_intermediate_size": 4304, "vt_num_hidden_layers": 27,
          "vt_num_attention_heads": 16, "patch_size": 14, "init_pos_emb_height": 64,
          "init_pos_emb_width": 64, "merge_kernel_size": [2, 2], "mm_hidden_size": 1152,
          "text_hidden_size": 7168}


def _kimi(**kw):
    args = dict(tp_size=8, gpu_bytes=CARD, mem_fraction_static=0.85, forward_tokens=8192,
                routed_bytes_per_param=W4A16, vision_params=moonvit_params(VISION))
    args.update(kw)
    return engine_memory(KIMI, **args)


def test_kimi_vision_tower_as_sglang_builds_it():
    """MoonViT: 27 blocks of 15.24M (LayerNorms, fused qkv + proj, MLP 1,152 -> 4,304 -> 1,152,
    with biases), patch convolution, 64 x 64 position table; the projector on 2x2-merged
    patches: 4,608 -> 4,608 -> 7,168. Loaded on every rank: 0.88 GiB."""
    v = moonvit_params(VISION)
    assert v == 471_143_920
    assert round(v * 2 / GiB, 2) == 0.88
    with pytest.raises(ValueError, match="no 'vt_hidden_size'"):
        moonvit_params({k: x for k, x in VISION.items() if k != "vt_hidden_size"})


def test_kimi_on_eight_96gb_cards_matches_the_runbook():
    m = _kimi()
    assert round(m.routed_params / 1e9, 1) == 1014.7
    assert round(m.split_params / 1e9, 1) == 10.6
    assert round(m.replicated_params / 1e9, 1) == 1.1
    assert round(m.weights / GiB, 1) == 71.8
    assert m.kv_bytes_per_token == 70_272 == mla_kv_bytes_per_token(61, 512, 64)
    assert round(m.kv_pool / GiB, 1) == 9.4 and m.kv_pool_tokens // 1000 == 144
    assert round(m.outside_static / GiB, 1) == 14.3
    assert round(m.activations / GiB, 1) == 1.2
    assert round(_kimi(forward_tokens=16384).activations / GiB, 1) == 2.5
    low = _kimi(mem_fraction_static=0.80)
    assert round(low.kv_pool / GiB, 1) == 4.6 and low.kv_pool_tokens // 1000 == 71
    # the checkpoint: INT4 routed experts, the rest bf16, the vision tower
    ckpt = (m.routed_params * W4A16 + (m.split_params + m.replicated_params) * 2
            + moonvit_params(VISION) * 2)
    assert round(ckpt / 1e9) == 595


def test_bf16_experts_do_not_fit_and_a_missing_key_is_named():
    assert _kimi(routed_bytes_per_param=2).weights > CARD  # why Kimi ships INT4 experts
    assert _kimi(routed_bytes_per_param=2).kv_pool == 0
    with pytest.raises(ValueError, match="config has no 'kv_lora_rank'"):
        engine_memory({k: v for k, v in KIMI.items() if k != "kv_lora_rank"}, tp_size=8,
                      gpu_bytes=CARD, mem_fraction_static=0.85, forward_tokens=8192)
