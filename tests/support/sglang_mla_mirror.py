"""A mirror of SGLang 0.5.23's Eagle3DeepseekV2ForCausalLM loader
(srt/models/kimi_k25_eagle3.py), for tests that check an MLA drafter's export is taken
whole: every parameter it builds filled by exactly one exported tensor of its shape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file


def sglang_parameters(c: dict) -> dict[str, tuple[int, ...]]:
    """The parameters ``Eagle3DeepseekV2ForCausalLM(config)`` declares, by its own names, as
    read from its __init__s: Eagle3MLAModel (embed_tokens, fc over n_aux x target_hidden_size,
    fc_norm.i when ``fc_norm``, midlayer, norm), Eagle3MLADecoderLayer (the three norms, the
    DeepseekV2AttentionMLA whose q/kv down-projection is rebuilt as one fused ReplicatedLinear
    over 2 x hidden_size, DeepseekV2MLP with gate and up stacked), lm_head of
    draft_vocab_size rows (``tie_word_embeddings`` false)."""
    H, Ht, M, A = c["hidden_size"], c["target_hidden_size"], c["intermediate_size"], \
        c["num_attention_heads"]
    n_aux = len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    q, kv, nope, rope, v = (c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"],
                            c["qk_rope_head_dim"], c["v_head_dim"])
    attn = "model.midlayer.self_attn."
    p = {
        "model.embed_tokens.weight": (c["vocab_size"], H),
        "model.fc.weight": (H, n_aux * Ht),
        attn + "fused_qkv_a_proj_with_mqa.weight": (q + kv + rope, 2 * H),
        attn + "q_a_layernorm.weight": (q,),
        attn + "q_b_proj.weight": (A * (nope + rope), q),
        attn + "kv_b_proj.weight": (A * (nope + v), kv),
        attn + "o_proj.weight": (H, A * v),
        attn + "kv_a_layernorm.weight": (kv,),
        "model.midlayer.mlp.gate_up_proj.weight": (2 * M, H),
        "model.midlayer.mlp.down_proj.weight": (H, M),
        "model.midlayer.input_layernorm.weight": (H,),
        "model.midlayer.hidden_norm.weight": (H,),
        "model.midlayer.post_attention_layernorm.weight": (H,),
        "model.norm.weight": (H,),
        "lm_head.weight": (c["draft_vocab_size"], H),
    }
    if c.get("fc_norm"):
        p.update({f"model.fc_norm.{i}.weight": (Ht,) for i in range(n_aux)})
    return p


def sglang_load(params: dict[str, tuple[int, ...]], tensors: dict[str, torch.Tensor]):
    """Mirror of ``Eagle3DeepseekV2ForCausalLM.load_weights``: d2t/t2d taken aside,
    ``layers.0.`` -> ``midlayer.``, ``model.`` prefixed except ``lm_head``, gate/up stacked into
    gate_up_proj (shards 0/1), q_a_proj and kv_a_proj_with_mqa cached until both are there and
    concatenated (q first) into fused_qkv_a_proj_with_mqa, anything else loaded by name or
    skipped with a warning. Returns (what each parameter received, skipped names, hot ids)."""
    loaded: dict[str, list[tuple[object, tuple[int, ...]]]] = {}
    skipped, hot, cached = [], None, {}
    for name, w in tensors.items():
        if name == "d2t" or name.endswith(".d2t"):
            hot = w + torch.arange(w.shape[0])
            continue
        if name == "t2d" or name.endswith(".t2d"):
            continue
        mapped = re.sub(r"^layers\.0\.", "midlayer.", name)
        if not mapped.startswith("lm_head."):
            mapped = f"model.{mapped}"
        stacked = False
        for param, shard_name, shard in ((".gate_up_proj", ".gate_proj", 0),
                                         (".gate_up_proj", ".up_proj", 1)):
            if shard_name in mapped and mapped.replace(shard_name, param) in params:
                loaded.setdefault(mapped.replace(shard_name, param), []).append(
                    (shard, tuple(w.shape)))
                stacked = True
                break
        if stacked:
            continue
        if "q_a_proj" in mapped or "kv_a_proj_with_mqa" in mapped:
            cached[mapped] = w
            q_name = mapped.replace("kv_a_proj_with_mqa", "q_a_proj")
            kv_name = q_name.replace("q_a_proj", "kv_a_proj_with_mqa")
            if q_name in cached and kv_name in cached:
                fused = torch.cat([cached.pop(q_name), cached.pop(kv_name)], dim=0)
                fused_name = q_name.replace("q_a_proj", "fused_qkv_a_proj_with_mqa")
                if fused_name in params:
                    loaded.setdefault(fused_name, []).append((None, tuple(fused.shape)))
                else:
                    skipped.append(fused_name)
            continue
        if mapped not in params:
            skipped.append(name)
            continue
        loaded.setdefault(mapped, []).append((None, tuple(w.shape)))
    skipped += list(cached)  # a half of the fused projection never completed
    return loaded, skipped, hot


def check_taken_whole(folder: Path) -> dict:
    """Assert the mirror loads `folder` whole; return its config."""
    config = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    params = sglang_parameters(config)
    loaded, skipped, hot = sglang_load(params, tensors)
    assert skipped == [], f"SGLang would skip {skipped}"
    # the embedding is the target's (set_embed), everything else comes from the file
    assert set(loaded) == set(params) - {"model.embed_tokens.weight"}
    for name, got in loaded.items():
        want = params[name]
        if name.endswith("gate_up_proj.weight"):
            half = (want[0] // 2, want[1])
            assert sorted(got, key=lambda g: g[0]) == [(0, half), (1, half)], name
        else:
            assert got == [(None, want)], name
    assert hot is not None
    for name, t in tensors.items():
        if name not in ("d2t", "t2d"):
            assert t.dtype == torch.bfloat16, name
    # post_load_weights: kv_b_proj splits per head into w_kc [A, nope, kv] / w_vc [A, v, kv]
    w = tensors["layers.0.self_attn.kv_b_proj.weight"]
    w_kc, w_vc = w.unflatten(0, (-1, config["qk_nope_head_dim"] + config["v_head_dim"])).split(
        [config["qk_nope_head_dim"], config["v_head_dim"]], dim=1)
    assert w_kc.shape[0] == config["num_attention_heads"] == w_vc.shape[0]
    return config
