"""The drafter module: shapes, names, frozen embedding, configuration errors; causal attention
and its backward against the dense reference, on both kernels (fused: torch's flash kernel with
the diagonal merged through its log-sum-exp; chunked: the reference)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eyas.errors import ConfigError
from eyas.train import fused_attention
from eyas.train.fused_attention import FusedAttention
from eyas.train.model import (
    CausalAttention,
    Drafter,
    DrafterConfig,
    KVCache,
    attend,
    attend_causal,
)

from .helpers import YARN, small_config, small_drafter, small_mla_drafter, small_vocab


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


# Kimi-K2.5's config.json as published (text fields nested under text_config; MLA, no head_dim).
KIMI_K25_CONFIG = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "model_type": "kimi_k2", "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
        "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "vocab_size": 163840, "rope_theta": 50000.0, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 262144,
    },
}


def test_from_target_gives_an_mla_target_the_public_kimi_drafter_shape():
    cfg = DrafterConfig.from_target(KIMI_K25_CONFIG, 32000)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (64, 64, 128)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (7168, 18432, 163840)
    assert cfg.rope_theta == 50000.0
    # Without the MLA rule the drafter would get 7168 / 64 = 112-wide heads.
    assert cfg.dim_per_head == 128 != 7168 // 64


def test_from_target_ignores_the_rotary_head_dim_transformers_writes_for_deepseek_v3():
    # transformers 5 saves DeepSeek-V3 configs with head_dim = qk_rope_head_dim and the rope
    # base inside rope_parameters.
    saved = dict(KIMI_K25_CONFIG["text_config"], head_dim=64,
                 rope_parameters={"rope_theta": 50000.0, "rope_type": "default"})
    del saved["rope_theta"]
    cfg = DrafterConfig.from_target(saved, 32000)
    assert cfg.head_dim == 128 and cfg.rope_theta == 50000.0


def test_from_target_mla_without_value_head_width_falls_back_to_128():
    bare = {k: v for k, v in KIMI_K25_CONFIG["text_config"].items()
            if k not in ("v_head_dim", "qk_nope_head_dim", "num_key_value_heads")}
    cfg = DrafterConfig.from_target(bare, 32000)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (64, 64, 128)


@pytest.mark.parametrize("kernel", ["fused", "chunked"])
def test_causal_forward_without_a_mask_equals_the_explicit_mask(kernel):
    """``attend_causal`` (fused, or in chunks of one query) equals ``attend`` over a tril mask
    (float64, 1e-12), gradients included; grouped-query heads (4 query, 2 key/value)."""
    drafter = small_drafter(seed=4).double()
    ids = torch.randint(0, 50, (2, 9))
    hidden = torch.randn(2, 9, 32, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(9).expand(2, 9)
    chunked = drafter.forward_causal(ids, hidden, pos, chunk_mb=1e-6, kernel=kernel)
    (g_chunked,) = torch.autograd.grad(chunked.square().sum(), hidden)
    tril = torch.ones(9, 9, dtype=torch.bool).tril().expand(2, 9, 9)
    dense = drafter.forward_causal(ids, hidden, pos, tril)
    (g_dense,) = torch.autograd.grad(dense.square().sum(), hidden)
    torch.testing.assert_close(chunked, dense, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_chunked, g_dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["llama", "mla"])
def test_steps_through_a_kv_cache_equal_one_causal_pass(kind):
    """``Drafter.step`` fed a sequence a few entries at a time through a ``KVCache`` (as the
    evaluator drafts) equals one causal pass over it (float64, 1e-12), for both attention
    kinds; the cache is a value: a step leaves the cache it was given as it was."""
    drafter = (small_mla_drafter(seed=4, rope_scaling=YARN) if kind == "mla"
               else small_drafter(seed=4)).double()
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, 50, (1, 10), generator=g)
    hidden = torch.randn(1, 10, 32, generator=g, dtype=torch.float64)
    pos = torch.arange(10)[None]
    whole = drafter.forward_causal(ids, hidden, pos)
    cache, parts = KVCache(), []
    for a, b in [(0, 4), (4, 5), (5, 8), (8, 10)]:
        before = cache
        out, cache = drafter.step(ids[:, a:b], hidden[:, a:b], pos[:, a:b], cache)
        assert (before.length, cache.length) == (a, b)
        parts.append(out)
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-12, atol=1e-12)
    # the last entry again on the cache of the first 9: the same output, not one seeing itself twice
    nine = KVCache(cache.keys_BASD[:, :, :9], cache.values_BASD[:, :, :9])
    again, _ = drafter.step(ids[:, 9:], hidden[:, 9:], pos[:, 9:], nine)
    torch.testing.assert_close(again, whole[:, 9:], rtol=1e-12, atol=1e-12)
    shifted, _ = drafter.step(ids[:, 9:], hidden[:, 9:], pos[:, 9:], cache)
    assert not torch.allclose(shifted, whole[:, 9:], atol=1e-6)


def dense_attention_with_extras(q, k, v, extra_k, extra_v):
    """The reference: ``attend`` over keys ``k ‖ extra_k[0] ‖ ...`` with a mask letting query
    t see keys 0..t and row t of each extra."""
    B, A, T, _ = q.shape
    eye = torch.eye(T, dtype=torch.bool)
    mask = torch.cat([torch.ones(T, T, dtype=torch.bool).tril(), *[eye] * len(extra_k)], 1)
    return attend(q, torch.cat([k, *extra_k], 2), torch.cat([v, *extra_v], 2),
                  mask.expand(B, T, -1))


def attention_inputs(T: int, extras: int, seed: int = 0, *, qk_width: int = 4,
                     v_width: int = 4, dtype: torch.dtype = torch.float64, std: float = 2.0):
    """q, k, v, then `extras` extra keys and `extras` extra values, [2, 3, T, width]."""
    g = torch.Generator().manual_seed(seed)
    widths = [qk_width, qk_width, v_width] + [qk_width] * extras + [v_width] * extras
    return [(torch.randn(2, 3, T, w, generator=g, dtype=torch.float64) * std).to(dtype)
            .requires_grad_() for w in widths]


@pytest.mark.parametrize(("rows_mb", "extras"), [(1e-6, 0), (1e-6, 2), (4 * 2 * 3 * 13 * 8 * 5
                                                                         / 2**20, 3), (1, 1)])
def test_causal_attention_and_its_gradients_equal_the_dense_reference(rows_mb, extras):
    """float64, 1e-12: output and the gradients of q, k, v and every extra key and value,
    for chunks of 1 and 5 queries and all 13 at once."""
    inputs = attention_inputs(13, extras)
    q, k, v, rest = *inputs[:3], inputs[3:]
    chunked = attend_causal(q, k, v, rest[:extras], rest[extras:], chunk_mb=rows_mb,
                            kernel="chunked")
    dense = dense_attention_with_extras(q, k, v, rest[:extras], rest[extras:])
    torch.testing.assert_close(chunked, dense, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(dense)
    got = torch.autograd.grad((chunked * w).sum(), inputs)
    want = torch.autograd.grad((dense * w).sum(), inputs)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"input {i}")


def test_causal_attention_passes_gradcheck():
    """float64 finite differences, 2 queries a chunk, two extra keys and values; and the
    case where only some inputs need a gradient."""
    inputs = attention_inputs(5, 2, seed=1)
    assert torch.autograd.gradcheck(lambda *x: CausalAttention.apply(2, *x), inputs)
    q, k, v, *rest = (x.detach() for x in inputs)
    k.requires_grad_()
    (g,) = torch.autograd.grad(CausalAttention.apply(2, q, k, v, *rest).sum(), k)
    (want,) = torch.autograd.grad(dense_attention_with_extras(q, k, v, rest[:2], rest[2:]).sum(),
                                  k)
    torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12)


class CountFullSize(TorchDispatchMode):
    """Counts the tensors of `numel` elements or more that operations create (not views)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:
            return out
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() >= self.numel:
                self.count += 1
        return out


def test_attention_backward_writes_only_each_chunks_block():
    """48 chunks of one query: the backward creates the gradients' buffers once (a few
    [B, A, T, D] tensors per input), not a whole-sequence gradient per chunk and input (which
    made the work grow as T³)."""
    T, extras = 48, 2
    inputs = attention_inputs(T, extras)
    q, k, v, rest = *inputs[:3], inputs[3:]
    out = attend_causal(q, k, v, rest[:extras], rest[extras:], chunk_mb=1e-6, kernel="chunked")
    with CountFullSize(q.numel()) as seen:
        torch.autograd.grad(out.sum(), inputs)
    assert seen.count <= 3 * len(inputs)


@pytest.mark.parametrize(("extras", "qk_width", "v_width"),
                         [(0, 4, 4), (1, 4, 4), (3, 4, 4), (2, 6, 4), (2, 4, 6)])
def test_fused_attention_and_its_gradients_equal_the_chunked_reference(extras, qk_width,
                                                                       v_width):
    """float64, 1e-12: the fused kernel's output and the gradients of q, k, v and every extra
    key and value equal the chunked reference's (and the dense one's), with no extras (step 0),
    one and three, and heads whose values are narrower (MLA) or wider than the keys."""
    inputs = attention_inputs(13, extras, seed=2, qk_width=qk_width, v_width=v_width)
    q, k, v, rest = *inputs[:3], inputs[3:]
    assert fused_attention.choose(q, k, v, rest) == ("cpu", "")
    outs = {kernel: attend_causal(q, k, v, rest[:extras], rest[extras:], chunk_mb=1e-6,
                                  kernel=kernel) for kernel in ("fused", "chunked")}
    dense = dense_attention_with_extras(q, k, v, rest[:extras], rest[extras:])
    torch.testing.assert_close(outs["fused"], outs["chunked"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(outs["fused"], dense, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(dense)
    got = torch.autograd.grad((outs["fused"] * w).sum(), inputs)
    want = torch.autograd.grad((outs["chunked"] * w).sum(), inputs)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"input {i}")


def test_fused_attention_passes_gradcheck():
    """float64 finite differences with two extra keys and values, values narrower than the
    keys; and only some inputs needing a gradient."""
    inputs = attention_inputs(5, 2, seed=1, qk_width=5, v_width=3)
    assert torch.autograd.gradcheck(lambda *x: FusedAttention.apply("cpu", *x), inputs)
    q, k, v, *rest = (x.detach() for x in inputs)
    rest[0].requires_grad_()
    (g,) = torch.autograd.grad(FusedAttention.apply("cpu", q, k, v, *rest).sum(), rest[0])
    (want,) = torch.autograd.grad(dense_attention_with_extras(q, k, v, rest[:2], rest[2:]).sum(),
                                  rest[0])
    torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12)


def test_bf16_attention_scores_are_accumulated_in_float32_on_both_kernels():
    """bf16 inputs at score std 3 (what a wide query scale gives): both kernels' outputs and
    gradients stay within bf16 rounding of the float64 result of the same inputs. Rounding the
    scores to bf16 before the softmax, as the chunked kernel did, was ~5x further off (0.11 of
    output error here against 0.02-0.03)."""
    T, extras = 96, 2
    inputs = attention_inputs(T, extras, seed=3, qk_width=64, v_width=64, dtype=torch.bfloat16,
                              std=3**0.5)
    wide = [x.detach().double().requires_grad_() for x in inputs]
    ref = attend_causal(*wide[:3], wide[3:5], wide[5:], kernel="chunked")
    assert 2.5 < float(torch.einsum("bhqd,bhkd->bhqk", *wide[:2]).detach().std() / 8) < 3.5
    w = torch.randn_like(ref)
    ref_grads = torch.autograd.grad((ref * w).sum(), wide)
    errors = {}
    for kernel in ("fused", "chunked"):
        out = attend_causal(*inputs[:3], inputs[3:5], inputs[5:], kernel=kernel)
        assert out.dtype == torch.bfloat16
        errors[kernel] = float((out.double() - ref).detach().abs().max())
        grads = torch.autograd.grad((out * w.bfloat16()).sum(), inputs)
        for i, (a, b) in enumerate(zip(grads, ref_grads, strict=True)):
            assert a.dtype == torch.bfloat16
            # bf16 holds ~3 significant digits: 2 % of the gradient's largest entry
            assert float((a.double() - b).abs().max()) <= 0.02 * float(b.abs().max()), \
                (kernel, i)
    assert errors["fused"] < 0.04 and errors["chunked"] < 1.5 * errors["fused"], errors


@pytest.mark.gpu
@pytest.mark.parametrize(("qk_width", "v_width"), [(64, 64), (192, 128)])
def test_cuda_fused_attention_stays_within_bf16_of_the_float64_reference(qk_width, v_width):
    """On a GPU, bf16 (what training runs there), Llama-like and Kimi-MLA-like head widths:
    FlashAttention with the diagonal merged, and the chunked kernel, both within bf16 rounding
    of the float64 chunked result (outputs and every gradient)."""
    inputs = [x.detach().cuda().requires_grad_() for x in attention_inputs(
        300, 2, seed=4, qk_width=qk_width, v_width=v_width, dtype=torch.bfloat16, std=1.0)]
    assert fused_attention.choose(inputs[0], inputs[1], inputs[2], inputs[3:]) == ("cuda", "")
    wide = [x.detach().double().requires_grad_() for x in inputs]
    ref = attend_causal(*wide[:3], wide[3:5], wide[5:], kernel="chunked")
    w = torch.randn_like(ref)
    ref_grads = torch.autograd.grad((ref * w).sum(), wide)
    for kernel in ("fused", "chunked"):
        out = attend_causal(*inputs[:3], inputs[3:5], inputs[5:], kernel=kernel)
        assert float((out.double() - ref).detach().abs().max()) < 0.03, kernel
        grads = torch.autograd.grad((out * w.bfloat16()).sum(), inputs)
        for i, (a, b) in enumerate(zip(grads, ref_grads, strict=True)):
            assert float((a.double() - b).abs().max()) <= 0.02 * float(b.abs().max()), \
                (kernel, i)


def test_auto_falls_back_to_the_chunked_kernel_and_says_why(caplog):
    """Mixed dtypes (no fused kernel takes them): "auto" computes the chunked result and logs
    the reason; "fused" refuses, naming the setting and the reason."""
    q, k, v = attention_inputs(7, 0)
    k32 = k.detach().float()
    caplog.set_level(logging.WARNING, logger="eyas.train.model")
    got = attend_causal(q, k32, v, kernel="auto")
    want = attend_causal(q, k32, v, kernel="chunked")
    assert torch.equal(got, want)
    assert "chunked kernel" in caplog.text and "differ in dtype" in caplog.text
    with pytest.raises(ConfigError, match="attention_kernel.*differ in dtype"):
        attend_causal(q, k32, v, kernel="fused")
    with pytest.raises(ConfigError, match="auto, fused or chunked"):
        attend_causal(q, k, v, kernel="flex")


def test_a_bf16_embedding_is_read_exactly_in_float32():
    drafter = small_drafter()
    bf16 = Drafter(drafter.cfg, drafter.embed_VH.bfloat16())
    ids = torch.randint(0, 50, (1, 5))
    rows = bf16.embed(ids)
    assert rows.dtype == torch.float32
    assert torch.equal(rows, drafter.embed_VH.bfloat16().float()[ids])


def test_head_from_the_target_gives_the_targets_logits_on_its_final_states():
    """init_head "target": lm_head = the target head's draft rows with its final norm folded
    in, so the drafter's head applied to a pre-norm state h gives the target's logits of h,
    restricted to the draft vocabulary."""
    drafter = small_drafter(seed=2).double()
    vocab = small_vocab(drafter.cfg)
    g = torch.Generator().manual_seed(4)
    head_VH = torch.randn(drafter.cfg.vocab_size, drafter.cfg.hidden_size, generator=g,
                          dtype=torch.float64)
    norm_H = 1 + torch.rand(drafter.cfg.hidden_size, generator=g, dtype=torch.float64)
    drafter.norm.weight.data.fill_(3.0)  # reset to 1 by the init
    drafter.init_head_from_target(head_VH, vocab.draft_to_target, norm_H)
    h_TH = torch.randn(5, drafter.cfg.hidden_size, generator=g, dtype=torch.float64)
    normed = h_TH * torch.rsqrt(h_TH.pow(2).mean(-1, keepdim=True) + drafter.cfg.rms_norm_eps)
    target_logits = (norm_H * normed) @ head_VH.T
    torch.testing.assert_close(drafter.logits(h_TH), target_logits[:, vocab.draft_to_target],
                               rtol=1e-6, atol=1e-6)
