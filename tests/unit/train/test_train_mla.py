"""The MLA drafter (SGLang's Eagle3DeepseekV2ForCausalLM): its attention against SGLang's absorbed
form with transformers' YaRN, its training-time test against step-by-step drafting and the dense
reference, its settings."""

from __future__ import annotations

import math

import pytest
import torch
from support.paths import REPO
from transformers import DeepseekV3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from eyas.errors import ConfigError
from eyas.train import dense
from eyas.train.model import Drafter, DrafterConfig, attend
from eyas.train.ttt import draft_reference, teacher_from_final, ttt_loss, unroll

from .helpers import YARN, small_mla_config, small_mla_drafter, small_vocab


def _sglang_absorbed_attention(attn, x_T2H: torch.Tensor, cfg: DrafterConfig) -> torch.Tensor:
    """Causal MLA as SGLang serves it, written from its DeepseekV2AttentionMLA and the
    Eagle3 loader's post_load_weights: the query's no-rope part is taken into the latent space by
    w_kc (split from kv_b_proj), scores against the cached latent and rotary key, the context
    leaves the latent through w_vc; rotary pairs interleaved, frequencies and cos/sin factor from
    transformers' own YaRN, softmax scale (nope + rope)^-½ · mscale(factor, mscale_all_dim)²."""
    T = x_T2H.shape[0]
    A, nope, rope, dv = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                         cfg.v_head_dim)
    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x_T2H))).view(T, A, nope + rope)
    q_nope, q_pe = q.split([nope, rope], -1)
    c, kpe = attn.kv_a_proj_with_mqa(x_T2H).split([cfg.kv_lora_rank, rope], -1)
    c = attn.kv_a_layernorm(c)
    w = attn.kv_b_proj.weight.view(A, nope + dv, cfg.kv_lora_rank)
    w_kc, w_vc = w[:, :nope], w[:, nope:]
    hf = DeepseekV3Config(hidden_size=cfg.hidden_size, num_attention_heads=A,
                          qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=dv,
                          rope_theta=cfg.rope_theta,
                          max_position_embeddings=cfg.max_position_embeddings,
                          rope_scaling=dict(cfg.rope_scaling) if cfg.rope_scaling else None)
    kind = "yarn" if cfg.rope_scaling else "default"
    inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](hf, "cpu") if kind == "yarn" else (
        1.0 / cfg.rope_theta ** (torch.arange(0, rope, 2).double() / rope), 1.0)
    ang = torch.arange(T).double()[:, None] * inv_freq.double()[None]
    cos, sin = ang.cos() * factor, ang.sin() * factor

    def rot(x):  # [T, ..., rope], pairs (2i, 2i+1)
        shape = (T,) + (1,) * (x.dim() - 2) + (rope // 2,)
        c_, s_ = cos.view(shape).to(x.dtype), sin.view(shape).to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c_ - x2 * s_, x2 * c_ + x1 * s_], -1).flatten(-2)

    q_pe, kpe = rot(q_pe), rot(kpe)
    scale = (nope + rope) ** -0.5
    if cfg.rope_scaling:
        scale *= (0.1 * cfg.rope_scaling["mscale_all_dim"]
                  * math.log(cfg.rope_scaling["factor"]) + 1) ** 2
    q_latent = torch.einsum("tan,anl->tal", q_nope, w_kc)
    scores = (torch.einsum("tal,sl->ats", q_latent, c)
              + torch.einsum("tar,sr->ats", q_pe, kpe)) * scale
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(-1)
    ctx = torch.einsum("tal,avl->tav", torch.einsum("ats,sl->tal", probs, c), w_vc)
    return attn.o_proj(ctx.reshape(T, A * dv))


@pytest.mark.parametrize("scaling", [None, YARN])
def test_attention_equals_sglangs_absorbed_latent_form(scaling):
    """float64 at positions up to 40 (past the toy YaRN's original 16): the training form
    (expanded keys/values, ``attend``) is SGLang's computation."""
    drafter = small_mla_drafter(seed=2, rope_scaling=scaling, rope_theta=50000.0).double()
    attn, cfg = drafter.midlayer.self_attn, drafter.cfg
    T = 40
    x = torch.randn(1, T, 2 * cfg.hidden_size, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        q, k, v = attn.qkv(x, torch.arange(T)[None])
        ours = attn.out(attend(q, k, v, torch.ones(1, T, T, dtype=torch.bool).tril()))[0]
        want = _sglang_absorbed_attention(attn, x[0], cfg)
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-8)  # rotary angles: float32


def test_a_softmax_scale_without_yarns_mscale_would_differ():
    """The check above can fail: the same weights without the scaling's factors differ."""
    drafter = small_mla_drafter(seed=2, rope_scaling=YARN).double()
    plain = Drafter(small_mla_config(rope_scaling=None), drafter.embed_VH).double()
    plain.load_state_dict(drafter.state_dict())
    x = torch.randn(1, 20, 64, dtype=torch.float64)
    with torch.no_grad():
        a = drafter.midlayer.self_attn.qkv(x, torch.arange(20)[None])[0]
        b = plain.midlayer.self_attn.qkv(x, torch.arange(20)[None])[0]
    assert not torch.allclose(a, b)


@pytest.mark.parametrize("kernel", ["fused", "chunked"])
@pytest.mark.parametrize("options", [{}, {"rope_scaling": YARN},
                                     {"fc_norm": True, "norm_output": True}])
def test_unrolled_mla_logits_equal_step_by_step_drafting(options, kernel):
    torch.manual_seed(1)
    drafter = small_mla_drafter(seed=3, **options).double()
    B, T, steps = 2, 11, 4
    ids = torch.randint(0, 50, (B, T))
    aux = torch.randn(B, T, 96, dtype=torch.float64)
    with torch.no_grad():
        unrolled = unroll(drafter, ids, aux, steps, chunk_mb=1e-5, kernel=kernel)
    for b in range(B):
        for origin in (0, 4, T - 1):
            ref = draft_reference(drafter, ids[b], aux[b], origin, steps)
            for i in range(steps):
                torch.testing.assert_close(unrolled[i][b, origin], ref[i], rtol=1e-9, atol=1e-9)


def test_norm_output_and_fc_norm_change_the_drafts():
    """Both options are computed (the norms' weights are not 1, the fed state is normed)."""
    ids = torch.randint(0, 50, (1, 9), generator=torch.Generator().manual_seed(0))
    aux = torch.randn(1, 9, 96, dtype=torch.float64)
    base = small_mla_drafter(seed=3).double()
    logits = {}
    for name, opts in {"base": {}, "fc_norm": {"fc_norm": True},
                       "norm_output": {"norm_output": True}}.items():
        d = small_mla_drafter(seed=3, **opts).double()
        d.load_state_dict(base.state_dict(), strict=False)
        with torch.no_grad():
            logits[name] = unroll(d, ids, aux, 3)
    assert not torch.allclose(logits["fc_norm"][0], logits["base"][0])
    torch.testing.assert_close(logits["norm_output"][0], logits["base"][0])  # step 0 alike
    assert not torch.allclose(logits["norm_output"][1], logits["base"][1])


@pytest.mark.parametrize("kernel", ["fused", "chunked"])
@pytest.mark.parametrize("checkpoint_steps", [False, True])
def test_mla_memory_bounded_loss_and_gradients_equal_the_dense_reference(checkpoint_steps,
                                                                        kernel):
    g = torch.Generator().manual_seed(5)
    B, T = 2, 9
    ids = torch.randint(0, 50, (B, T), generator=g)
    aux = torch.randn(B, T, 96, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.long)
    final = torch.randn(B, T, 32, generator=g, dtype=torch.float64)
    head = torch.randn(50, 32, generator=g, dtype=torch.float64)
    results, grads = [], []
    for path in ("dense", "chunked"):
        drafter = small_mla_drafter(seed=6, rope_scaling=YARN, fc_norm=True,
                                    norm_output=True).double()
        vocab = small_vocab(drafter.cfg)
        if path == "dense":
            r = dense.ttt_loss(drafter, ids, mask, aux, dense.teacher_from_final(final, head, vocab),
                               vocab, steps=4)
        else:
            r = ttt_loss(drafter, ids, mask, aux, teacher_from_final(final, head, vocab), vocab,
                         steps=4, chunk_mb=1e-5, checkpoint_steps=checkpoint_steps,
                         kernel=kernel)
        r.loss.backward()
        results.append(r)
        grads.append({n: p.grad for n, p in drafter.named_parameters()})
    want, got = results
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-10, atol=0)
    assert torch.equal(got.correct, want.correct)
    for name, grad in grads[0].items():
        assert grad is not None, name
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-9, atol=1e-12, msg=name)


KIMI_TEXT = {"hidden_size": 7168, "intermediate_size": 18432, "num_attention_heads": 64,
             "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
             "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
             "vocab_size": 163840, "rope_theta": 50000.0, "max_position_embeddings": 262144,
             "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                              "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                              "type": "yarn"}}


def test_from_target_takes_kimis_attention_sizes_and_yarn():
    cfg = DrafterConfig.from_target(KIMI_TEXT, 32000, attention="mla")
    assert (cfg.num_attention_heads, cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim, cfg.v_head_dim) == (64, 1536, 512, 128, 64, 128)
    assert cfg.rope_scaling["factor"] == 64.0 and cfg.rope_interleave
    # What the server caches per token: 576 bf16 values, against 64 x 128 keys and values.
    assert cfg.kv_bytes_per_token() == 1152
    assert DrafterConfig.from_target(KIMI_TEXT, 32000).kv_bytes_per_token() == 32768


def test_from_target_settings_override_each_size_and_a_llama_target_gets_proportions():
    llama = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 4,
             "vocab_size": 100}
    cfg = DrafterConfig.from_target(llama, 50, attention="mla",
                                    overrides={"kv_lora_rank": 64, "num_heads": 2})
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 2)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
            cfg.v_head_dim) == (256, 64, 64, 32, 64)
    assert cfg.rope_scaling is None


def test_mla_settings_that_sglang_cannot_build_are_refused_by_name():
    with pytest.raises(ConfigError, match="q_lora_rank"):
        small_mla_config(q_lora_rank=None)
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        small_mla_config(num_key_value_heads=2)
    with pytest.raises(ConfigError, match="even"):
        small_mla_config(qk_rope_head_dim=3)
    with pytest.raises(ConfigError, match="YaRN only"):
        DrafterConfig.from_target({**KIMI_TEXT, "rope_scaling": {"type": "linear", "factor": 2}},
                                  10, attention="mla")


def test_train_settings_choose_the_kind_and_refuse_mla_settings_on_the_llama_kind():
    from pydantic import ValidationError

    from eyas.train.config import TrainConfig

    assert TrainConfig().drafter == "llama"
    with pytest.raises(ValidationError, match="mla.init_attention are settings of the MLA drafter; "
                                              "set drafter: mla"):
        TrainConfig(mla={"init_attention": "target"})
    assert TrainConfig(fc_norm=True, norm_output=True).drafter_overrides() == {
        "fc_norm": True, "norm_output": True}  # EAGLE-3.1's options: either kind
    with pytest.raises(ValidationError, match="mla.kv_lora_rank"):
        TrainConfig(mla={"kv_lora_rank": 64})
    with pytest.raises(ValidationError, match="kv_lora_rank"):  # the old flat spelling
        TrainConfig(drafter="mla", kv_lora_rank=8)
    cfg = TrainConfig(drafter="mla", norm_output=True, mla={"kv_lora_rank": 8, "num_heads": 4})
    assert cfg.drafter_overrides() == {"kv_lora_rank": 8, "num_heads": 4, "norm_output": True}
    d = DrafterConfig.from_target(KIMI_TEXT, 100, attention=cfg.drafter,
                                  overrides=cfg.drafter_overrides())
    assert d.attention == "mla" and d.norm_output and not d.fc_norm and d.kv_lora_rank == 8
    assert d.num_attention_heads == 4


def test_attention_starts_as_the_targets_layer_on_the_fed_hidden_state():
    """init_attention: target -- the down-projections read the hidden half with the target's
    weights (the embedding half zero), the rest is the target's; other shapes are refused."""
    from eyas.train.mla import init_from_target_attention

    drafter = small_mla_drafter(seed=1)
    attn, H = drafter.midlayer.self_attn, 32
    g = torch.Generator().manual_seed(0)
    target = {name: torch.randn(getattr(attn, name).weight.shape[0],
                                *([H] if name in ("q_a_proj", "kv_a_proj_with_mqa")
                                  else getattr(attn, name).weight.shape[1:]), generator=g)
              for name in ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
                           "kv_a_layernorm", "kv_b_proj", "o_proj")}
    init_from_target_attention(attn, {k: v.bfloat16() for k, v in target.items()})
    e, h = torch.randn(5, H, generator=g), torch.randn(5, H, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(attn.q_a_proj(torch.cat([e, h], -1)),
                                   h @ target["q_a_proj"].bfloat16().float().T)
        torch.testing.assert_close(attn.kv_b_proj.weight, target["kv_b_proj"].bfloat16().float())
    with pytest.raises(ConfigError, match="train.mla.init_attention.*kv_b_proj"):
        init_from_target_attention(attn, {"kv_b_proj": torch.zeros(3, 3)})


def test_the_kimi_recipe_trains_the_mla_drafter_with_eagle31s_options():
    """recipes/kimi-k2.5.yaml's choice (docs/training.md "Drafter kinds"): at Kimi-K2.5's
    geometry that drafter caches 1,152 bytes per token in the server."""

    from eyas.config import load_config

    recipe = REPO / "recipes" / "kimi-k2.5.yaml"
    train = load_config(recipe).train
    assert (train.drafter, train.fc_norm, train.norm_output) == ("mla", True, True)
    cfg = DrafterConfig.from_target(KIMI_TEXT, train.draft_vocab_size, attention=train.drafter,
                                    overrides=train.drafter_overrides())
    assert cfg.fc_norm and cfg.norm_output and cfg.kv_bytes_per_token() == 1152
