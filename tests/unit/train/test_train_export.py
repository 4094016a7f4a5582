"""Export: names, shapes, dtypes and config against SGLang's LlamaForCausalLMEagle3 loader."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file

from eyas.errors import ConfigError, DataError
from eyas.train.export import export_drafter, load_exported
from eyas.train.vocab import DraftVocab

from .helpers import small_drafter, small_vocab

# Written from reading sglang/srt/models/llama_eagle3.py (LlamaModel, LlamaDecoderLayer,
# LlamaForCausalLMEagle3.load_weights). Shapes in terms of H (hidden_size), Ht
# (target_hidden_size), I (intermediate_size), nq/nkv heads, D head_dim, V (target vocab),
# Vd (draft vocab). q/k/v read 2·H: SGLang rebuilds qkv_proj with 2 * hidden_size inputs.
EXPECTED_SGLANG_WEIGHTS = {
    "fc.weight": ("H", "3*Ht"),
    "midlayer.input_layernorm.weight": ("H",),
    "midlayer.hidden_norm.weight": ("H",),
    "midlayer.self_attn.q_proj.weight": ("nq*D", "2*H"),
    "midlayer.self_attn.k_proj.weight": ("nkv*D", "2*H"),
    "midlayer.self_attn.v_proj.weight": ("nkv*D", "2*H"),
    "midlayer.self_attn.o_proj.weight": ("H", "nq*D"),
    "midlayer.post_attention_layernorm.weight": ("H",),
    "midlayer.mlp.gate_proj.weight": ("I", "H"),
    "midlayer.mlp.up_proj.weight": ("I", "H"),
    "midlayer.mlp.down_proj.weight": ("H", "I"),
    "norm.weight": ("H",),
    "lm_head.weight": ("Vd", "H"),
    "d2t": ("Vd",),
    "t2d": ("V",),
}
EXPECTED_DTYPES = {"d2t": torch.int64, "t2d": torch.bool}


def _dims(cfg):
    return {"H": cfg.hidden_size, "Ht": cfg.target_hidden_size, "I": cfg.intermediate_size,
            "nq": cfg.num_attention_heads, "nkv": cfg.num_key_value_heads, "D": cfg.dim_per_head,
            "V": cfg.vocab_size, "Vd": cfg.draft_vocab_size}


def test_exported_weights_match_the_sglang_specification(tmp_path):
    drafter = small_drafter(seed=1, head_dim=16)
    vocab = small_vocab(drafter.cfg)
    out = export_drafter(tmp_path / "drafter", drafter, vocab, [0, 1, 2])
    tensors = load_file(str(out / "model.safetensors"))
    assert set(tensors) == set(EXPECTED_SGLANG_WEIGHTS)
    dims = _dims(drafter.cfg)
    for name, shape in EXPECTED_SGLANG_WEIGHTS.items():
        expected = tuple(eval(s, {}, dims) for s in shape)  # noqa: S307 - our own table
        assert tuple(tensors[name].shape) == expected, name
        assert tensors[name].dtype == EXPECTED_DTYPES.get(name, torch.bfloat16), name
    assert not any("embed" in n for n in tensors)
    # SGLang: hot_token_id = d2t + arange; must be the draft vocabulary, and agree with t2d.
    hot = tensors["d2t"] + torch.arange(tensors["d2t"].numel())
    assert torch.equal(hot, vocab.draft_to_target)
    assert torch.equal(torch.nonzero(tensors["t2d"])[:, 0], hot)


def test_exported_config_has_what_sglang_reads(tmp_path):
    drafter = small_drafter(seed=1, target_hidden_size=48)
    out = export_drafter(tmp_path / "d", drafter, small_vocab(drafter.cfg), [1, 29, 57],
                         target_config={"eos_token_id": 7})
    c = json.loads((out / "config.json").read_text())
    assert c["architectures"] == ["LlamaForCausalLMEagle3"]
    assert c["num_hidden_layers"] == 1 and c["tie_word_embeddings"] is False
    assert c["vocab_size"] == 50 and c["draft_vocab_size"] == 24
    assert c["target_hidden_size"] == 48 and c["hidden_size"] == 32
    assert c["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 29, 57],
                                 "use_aux_hidden_state": True}
    assert c["eos_token_id"] == 7
    assert (out / "manifest.json").is_file()
    assert load_file(str(out / "model.safetensors"))["fc.weight"].shape == (32, 144)


def test_export_round_trips_through_load_exported(tmp_path):
    drafter = small_drafter(seed=4)
    vocab = small_vocab(drafter.cfg)
    out = export_drafter(tmp_path / "d", drafter, vocab, [0, 1, 2], dtype="float32")
    back, vocab2, layers = load_exported(out, drafter.embed_VH)
    assert layers == [0, 1, 2] and torch.equal(vocab2.draft_to_target, vocab.draft_to_target)
    for k, v in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


@pytest.mark.parametrize(("architecture", "eyas_ids", "sglang_ids"), [
    (None, [0, 1, 2], [0, 1, 2]),
    ("LlamaForCausalLM", [3, 15, 28], [3, 15, 28]),
    ("DeepseekV3ForCausalLM", [1, 29, 57], [1, 29, 57]),
    ("DeepseekV3ForCausalLM", [3, 30, 57], [4, 31, 58]),
    ("KimiK25ForConditionalGeneration", [2, 30, 58], [3, 31, 59]),
])
def test_export_names_the_layers_in_sglangs_numbering_for_the_family_and_reads_them_back(
        tmp_path, architecture, eyas_ids, sglang_ids):
    """SGLang's DeepSeek-family classes add 1 only when the first id is 1: there, eyas layers
    [3, 30, 57] must be written [4, 31, 58] or SGLang would capture one layer early."""
    drafter = small_drafter(seed=2)
    out = export_drafter(tmp_path / "d", drafter, small_vocab(drafter.cfg), eyas_ids,
                         architecture=architecture, dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == sglang_ids
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["target_architecture"] == architecture
    assert manifest["counts"]["aux_layers"] == eyas_ids
    # Back to eyas numbering: from the manifest's architecture, or the one given.
    assert load_exported(out, drafter.embed_VH)[2] == eyas_ids
    assert load_exported(out, drafter.embed_VH, architecture=architecture)[2] == eyas_ids


def test_export_refuses_layers_sglang_cannot_name_on_a_deepseek_target(tmp_path):
    drafter = small_drafter()
    with pytest.raises(ConfigError, match=r"cannot capture layers \[0, 1, 2\]"):
        export_drafter(tmp_path / "d", drafter, small_vocab(drafter.cfg), [0, 1, 2],
                       architecture="DeepseekV3ForCausalLM")
    assert not (tmp_path / "d").exists() and not list(tmp_path.iterdir())


def test_export_refuses_a_vocabulary_of_another_size(tmp_path):
    drafter = small_drafter()
    with pytest.raises(DataError, match="draft vocabulary"):
        export_drafter(tmp_path / "d", drafter, DraftVocab(torch.arange(10), 50), [0, 1, 2])
    assert not (tmp_path / "d").exists()


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                    reason="SGLang is not installed here (GPU hosts, own environment)")
def test_sglang_own_eagle3_code_names_every_exported_module():  # pragma: no cover
    """Where SGLang imports: its Eagle3 model code declares each module our export names.

    (Constructing the class needs SGLang's parallel state, and importing its models package
    pulls in multimodal code that needs torchvision; reading the file needs neither.)
    """
    from pathlib import Path

    package = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    source = (package / "srt" / "models" / "llama_eagle3.py").read_text()
    assert "LlamaForCausalLMEagle3" in source
    for name in EXPECTED_SGLANG_WEIGHTS:
        for part in name.split(".")[:-1]:
            if part in ("self_attn", "mlp") or part.endswith("_proj"):
                continue  # inherited from SGLang's Llama layer (q/k/v stacked as qkv_proj)
            # A module of the class, or a name its load_weights maps onto one ("midlayer" is
            # mapped to "layers.0" in SGLang 0.5.23).
            assert f"self.{part}" in source or f'"{part}"' in source, part
    assert '"d2t"' in source and "hot_token_id" in source


def _sglang_attention_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """The q/k/v/o weight shapes SGLang builds from an exported config.json.

    As sglang/srt/models/llama.py (LlamaAttention) and llama_eagle3.py (LlamaDecoderLayer)
    compute them: ``head_dim = getattr(config, "head_dim", hidden_size // num_heads)``,
    q/k/v read ``2 * hidden_size`` (qkv_proj is rebuilt for the EAGLE-3 layer), o_proj reads
    ``num_heads * head_dim``.
    """
    hidden, heads, kv = (config["hidden_size"], config["num_attention_heads"],
                         config["num_key_value_heads"])
    head_dim = config.get("head_dim") or hidden // heads
    return {
        "midlayer.self_attn.q_proj.weight": (heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * head_dim),
    }


def test_mla_target_drafter_exports_the_shape_sglang_builds_against_sglang_source_shapes(
    tmp_path,
):
    from eyas.train.model import Drafter, DrafterConfig

    # An MLA target whose hidden/heads (96/4 = 24) differs from its value-head width (16):
    # only an explicit head_dim in config.json makes SGLang build the trained shape.
    target = {"hidden_size": 96, "intermediate_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 4, "kv_lora_rank": 16, "q_lora_rank": 32,
              "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
              "head_dim": 8, "vocab_size": 50}
    cfg = DrafterConfig.from_target(target, 24)
    assert cfg.head_dim == 16
    torch.manual_seed(0)
    drafter = Drafter(cfg, torch.randn(50, 96))
    out = export_drafter(tmp_path / "d", drafter, small_vocab(cfg), [0, 1, 2])
    config = json.loads((out / "config.json").read_text())
    assert config["head_dim"] == 16
    tensors = load_file(str(out / "model.safetensors"))
    for name, shape in _sglang_attention_shapes(config).items():
        assert tuple(tensors[name].shape) == shape, name
    reloaded, _, _ = load_exported(out, torch.randn(50, 96))
    assert reloaded.cfg == cfg


def test_eagle31_options_on_the_llama_kind_export_what_sglangs_llama_class_reads(tmp_path):
    """``fc_norm`` adds ``fc_norm.{0,1,2}.weight`` (SGLang's Llama class maps them onto
    ``model.fc_norm.i``; it skips unknown names silently) and both flags go into config.json
    (``getattr(config, "fc_norm")``, ``getattr(config, "norm_output")``); read back whole."""
    drafter = small_drafter(seed=1, fc_norm=True, norm_output=True)
    vocab = small_vocab(drafter.cfg)
    out = export_drafter(tmp_path / "d", drafter, vocab, [0, 1, 2], dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["fc_norm"] is True and config["norm_output"] is True
    tensors = load_file(str(out / "model.safetensors"))
    fc_norms = {f"fc_norm.{i}.weight" for i in range(3)}
    assert set(tensors) == set(EXPECTED_SGLANG_WEIGHTS) | fc_norms
    assert all(tensors[n].shape == (drafter.cfg.target_hidden_size,) for n in fc_norms)
    back, _, _ = load_exported(out, drafter.embed_VH)
    assert back.cfg.fc_norm and back.cfg.norm_output
    for k, v in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    plain = export_drafter(tmp_path / "p", small_drafter(seed=1), vocab, [0, 1, 2])
    assert "fc_norm" not in json.loads((plain / "config.json").read_text())
