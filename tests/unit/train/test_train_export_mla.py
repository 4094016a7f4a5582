"""The MLA kind's export against a mirror of SGLang 0.5.23's Eagle3DeepseekV2ForCausalLM loader
(srt/models/kimi_k25_eagle3.py): every parameter it builds is filled by exactly one exported
tensor of its shape, none is skipped, and the config has what it reads."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.sglang_env import sglang_python, sglang_source
from support.sglang_mla_mirror import check_taken_whole, sglang_load, sglang_parameters

from eyas.train.export import export_drafter, load_exported

from .helpers import YARN, small_mla_drafter, small_vocab


@pytest.mark.parametrize("options", [{}, {"fc_norm": True, "norm_output": True,
                                          "rope_scaling": YARN}])
def test_mla_export_is_taken_whole_by_the_sglang_loader_mirror(tmp_path, options):
    drafter = small_mla_drafter(seed=1, **options)
    vocab = small_vocab(drafter.cfg)
    out = export_drafter(tmp_path / "d", drafter, vocab, [1, 2, 3],
                         architecture="KimiK25ForConditionalGeneration",
                         target_config={"eos_token_id": 7})
    c = check_taken_whole(out)
    assert c["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert c["model_type"] == "deepseek_v3" and c["num_hidden_layers"] == 1
    assert c["tie_word_embeddings"] is False and c["draft_vocab_size"] == 24
    assert c["fc_norm"] is bool(options) and c["norm_output"] is bool(options)
    assert c["rope_scaling"] == (YARN if options else None) and c["rope_interleave"] is True
    assert c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert c["eos_token_id"] == 7
    names = set(load_file(str(out / "model.safetensors")))
    assert not any(n.startswith("midlayer.") or "embed" in n for n in names)


def test_the_mirror_refuses_the_llama_kinds_names(tmp_path):
    """The check can fail: a checkpoint under the Llama kind's names loses tensors."""
    drafter = small_mla_drafter(seed=1)
    out = export_drafter(tmp_path / "d", drafter, small_vocab(drafter.cfg), [1, 2, 3],
                         architecture="DeepseekV3ForCausalLM")
    tensors = load_file(str(out / "model.safetensors"))
    renamed = {n.replace("self_attn.kv_a_proj_with_mqa", "self_attn.k_proj"): t
               for n, t in tensors.items()}
    _, skipped, _ = sglang_load(sglang_parameters(json.loads((out / "config.json").read_text())),
                                renamed)
    assert skipped


def test_mla_export_round_trips_through_load_exported(tmp_path):
    drafter = small_mla_drafter(seed=4, fc_norm=True, norm_output=True, rope_scaling=YARN)
    vocab = small_vocab(drafter.cfg)
    out = export_drafter(tmp_path / "d", drafter, vocab, [1, 2, 3], dtype="float32",
                         architecture="DeepseekV3ForCausalLM")
    back, vocab2, layers = load_exported(out, drafter.embed_VH)
    assert back.cfg == drafter.cfg and layers == [1, 2, 3]
    for k, v in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k


def _sglang_python() -> str | None:
    return sglang_python(model_code=True)


@pytest.mark.skipif(_sglang_python() is None,
                    reason="no python with SGLang's model code here (GPU hosts; or set "
                           "EYAS_SGLANG_PYTHON to one with torch and transformers)")
def test_sglangs_own_config_loader_reads_the_mla_export(tmp_path):  # pragma: no cover
    """SGLang's own model config (in its interpreter) reads the exported folder as an MLA
    drafter with our sizes and the YaRN softmax scale we train with."""
    drafter = small_mla_drafter(seed=1, fc_norm=True, rope_scaling=YARN)
    out = export_drafter(tmp_path / "d", drafter, small_vocab(drafter.cfg), [1, 2, 3],
                         architecture="DeepseekV3ForCausalLM")
    script = textwrap.dedent(f"""
        import json
        from sglang.srt.configs.model_config import AttentionArch, ModelConfig
        m = ModelConfig({str(out)!r}, is_draft_model=True)
        print(json.dumps({{"mla": m.attention_arch == AttentionArch.MLA,
                          "kv": m.kv_lora_rank, "rope": m.qk_rope_head_dim,
                          "scaling": m.scaling, "arch": m.hf_config.architectures,
                          "fc_norm": getattr(m.hf_config, "fc_norm", None)}}))
    """)
    run = subprocess.run([_sglang_python(), "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["mla"] and got["kv"] == 12 and got["rope"] == 4
    assert got["arch"] == ["Eagle3DeepseekV2ForCausalLM"] and got["fc_norm"] is True
    from eyas.train.mla import softmax_factor

    want = (8 + 4) ** -0.5 * softmax_factor(drafter.cfg)
    assert abs(got["scaling"] - want) < 1e-9


def _sglang_source() -> Path | None:
    return sglang_source("srt/models/kimi_k25_eagle3.py")


@pytest.mark.skipif(_sglang_source() is None,
                    reason="no SGLang source tree here (set EYAS_SGLANG_SOURCE)")
def test_the_mirror_reads_what_sglangs_own_loader_says():  # pragma: no cover
    """The statements the mirror copies are in SGLang's file (a new SGLang that renames or
    stops fusing shows here)."""
    source = (_sglang_source() / "srt" / "models" / "kimi_k25_eagle3.py").read_text()
    for statement in (
        'class Eagle3DeepseekV2ForCausalLM', 're.sub(r"^layers\\.0\\.", "midlayer.", name)',
        'if not mapped_name.startswith("lm_head."):', '(".gate_up_proj", ".gate_proj", 0)',
        '"q_a_proj" in mapped_name or "kv_a_proj_with_mqa" in mapped_name',
        "[cached_a_proj[q_name], cached_a_proj[kv_name]], dim=0",
        'q_name.replace("q_a_proj", "fused_qkv_a_proj_with_mqa")', "2 * config.hidden_size,",
        'getattr(config, "fc_norm", None)', 'getattr(config, "norm_output", False)',
        "target_hidden_size * self.num_aux_hidden_states",
        'logger.warning("Eagle3 MLA: skipping unexpected weight %s", name)',
        "self.midlayer = Eagle3MLADecoderLayer(",
    ):
        assert statement in source, statement
    deepseek = (_sglang_source() / "srt" / "models" / "deepseek_v2.py").read_text()
    assert 'is_neox_style = not getattr(config, "rope_interleave", True)' in deepseek
    assert "self.scaling = compute_mla_mscale_scaling(rope_scaling, self.scaling)" in deepseek


def test_transformers_reads_the_mla_config_as_sglang_gets_it(tmp_path):
    """SGLang builds the drafter from transformers' config object of the folder: the DeepSeek-V3
    class keeps the MLA sizes, EAGLE-3.1's flags and the YaRN parameters (as
    ``rope_parameters``, which SGLang's Eagle3 MLA layer reads first)."""
    from transformers import AutoConfig

    drafter = small_mla_drafter(seed=1, fc_norm=True, norm_output=True, rope_scaling=YARN)
    out = export_drafter(tmp_path / "d", drafter, small_vocab(drafter.cfg), [1, 2, 3],
                         architecture="DeepseekV3ForCausalLM")
    c = AutoConfig.from_pretrained(out)
    assert c.architectures == ["Eagle3DeepseekV2ForCausalLM"] and c.num_hidden_layers == 1
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim,
            c.v_head_dim) == (20, 12, 8, 4, 6)
    assert c.fc_norm is True and c.norm_output is True and c.rope_interleave is True
    assert c.tie_word_embeddings is False and c.draft_vocab_size == 24
    rope = c.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == YARN["factor"]
    assert rope["mscale_all_dim"] == YARN["mscale_all_dim"]
    assert rope["original_max_position_embeddings"] == YARN["original_max_position_embeddings"]
