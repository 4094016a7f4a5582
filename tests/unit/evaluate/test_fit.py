"""`evaluate.offline: auto`: the target's size against the evaluating device's memory."""

from __future__ import annotations

import json

from eyas.evaluate.fit import config_parameters, facts, plan_offline, target_bytes

KIMI_TEXT = {"hidden_size": 7168, "num_hidden_layers": 61, "first_k_dense_replace": 1,
             "n_routed_experts": 384, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
             "n_shared_experts": 1, "intermediate_size": 18432, "num_attention_heads": 64,
             "num_key_value_heads": 64, "vocab_size": 163840, "torch_dtype": "bfloat16"}
KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": KIMI_TEXT}
RTX_PRO_6000 = [{"driver": "580.82.07", "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                 "memory_mib": 97887}] * 8


def test_kimi_config_counts_about_a_trillion_parameters():
    assert 1.0e12 < config_parameters(KIMI) < 1.1e12
    # A dense 8B Llama: 32 layers, 4096 wide, GQA 8 heads of 128, MLP 14336, 128K vocabulary.
    llama = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    assert 7.9e9 < config_parameters(llama) < 8.1e9


def test_kimi_is_skipped_on_a_96gb_gpu_host_and_the_reason_says_why():
    plan = plan_offline("auto", {"config": KIMI, "gpus": RTX_PRO_6000, "ram_bytes": 2**40},
                        device="auto", dtype="auto", torch_here=False)
    assert not plan.run and plan.setting == "auto"
    assert "skipped" in plan.reason and "97887 MiB" in plan.reason
    assert "loads the whole target on one device" in plan.reason


def test_weight_files_win_over_the_index_and_the_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(KIMI))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 595 * 2**30}, "weight_map": {}}))
    f = facts(tmp_path)
    assert target_bytes(f, "bfloat16") == (
        595 * 2**30, "model.safetensors.index.json's total_size 595.0 GiB")
    (tmp_path / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    assert target_bytes(facts(tmp_path), "float32")[0] == 2000  # bf16 on disk, fp32 in memory
    small = plan_offline("auto", facts(tmp_path), device="cpu", dtype="auto", torch_here=True)
    assert small.run and "it fits" in small.reason


def test_true_and_false_need_no_facts():
    assert plan_offline(True, {}, device="auto", dtype="auto", torch_here=True).run
    off = plan_offline(False, {}, device="auto", dtype="auto", torch_here=True)
    assert not off.run and off.reason == "evaluate.offline is false"
