"""The overfit gate on the tiny target: it passes on the trainer's own export and fails on
exports broken on purpose (aux layers one later, fc_norm weights dropped, d2t off by one; rope
scaling removed: on an MLA drafter of a YaRN target, `test_rope_scaling_removed_fails_the_gate`).
All but that one share one built gate run (tests/support/gate_fixtures.py)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from support.gate_fixtures import DRAFT_TOKENS, SAMPLES, tiny_gate_run

from eyas.errors import ConfigError
from eyas.evaluate import overfit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def run():
    return tiny_gate_run()


def _judge(run, export, tmp_path):
    torch.set_num_threads(1)
    prompts = overfit.gate_prompts(run.merged, SAMPLES)
    return overfit.judge(export, work=run.work, model_dir=run.target, prompts=prompts,
                         draft_tokens=DRAFT_TOKENS, max_new_tokens=overfit.ANSWER_TOKENS,
                         offline=run.result.offline_tau)


def test_the_gate_passes_on_the_tiny_target(run):
    r = run.result
    assert r.ok, r.detail
    assert r.offline_tau >= overfit.NEAR_MAX * (DRAFT_TOKENS + 1)
    assert r.measured_tau >= (1 - overfit.TOLERANCE) * r.offline_tau
    assert r.static_failures == [] and r.measured_ok
    assert len(r.per_prompt) == SAMPLES and all(p["accept_length"] > 1 for p in r.per_prompt)
    saved = json.loads((run.work / "gate.json").read_text())
    assert saved["ok"] and saved["measured_tau"] == r.measured_tau


def test_aux_layers_shifted_by_one_fail_the_gate(run, tmp_path):
    broken = overfit.break_export(run.export, tmp_path / "broken", "aux-shift")
    r = _judge(run, broken, tmp_path)
    assert not r.ok
    assert "aux_layers" in r.static_failures and "trained on [0, 1, 2]" in r.detail
    # The tiny target's 4 layers are alike enough that a memorised drafter is still accepted
    # about as often on the next ones (measured: 3.14-3.30 against 3.47): the static check is what
    # catches this one here.
    assert r.measured_tau is not None


def test_fc_norm_weights_dropped_fail_the_gate(run, tmp_path):
    broken = overfit.break_export(run.export, tmp_path / "broken", "fc-norm-dropped")
    r = _judge(run, broken, tmp_path)
    assert not r.ok and r.measured_tau is None  # eyas's loader refuses missing weights
    assert "fc_norm.0.weight" in r.detail and "weights" in r.static_failures


def test_d2t_off_by_one_fails_the_gate(run, tmp_path):
    broken = overfit.break_export(run.export, tmp_path / "broken", "d2t-off-by-one")
    r = _judge(run, broken, tmp_path)
    assert not r.ok and r.measured_ok is False
    assert r.measured_tau < 1.5  # every draft names the wrong token
    assert "vocab" in r.static_failures


def test_the_clean_export_judged_again_passes(run, tmp_path):
    """The judge itself, on an untouched copy: the failures above come from the breaks."""
    clean = tmp_path / "clean"
    shutil.copytree(run.export, clean)
    r = _judge(run, clean, tmp_path)
    assert r.ok, r.detail


def test_a_break_with_nothing_to_break_is_refused(run, tmp_path):
    with pytest.raises(ConfigError, match="no rope_scaling"):
        overfit.break_export(run.export, tmp_path / "b", "rope-scaling-removed")
    with pytest.raises(ConfigError, match="unknown break"):
        overfit.break_export(run.export, tmp_path / "b", "everything")


def _yarn_replica(root):
    """The Kimi replica (DeepSeek-V3 MLA in Kimi-K2.5's wrapper) with YaRN rope scaling, so
    that its MLA drafter trains with (and exports) ``rope_scaling``."""
    from eyas.tiny import build_kimi_replica

    target = root / "yarn-replica"
    shutil.copytree(build_kimi_replica(), target)
    config = json.loads((target / "config.json").read_text())
    yarn = {"rope_type": "yarn", "type": "yarn", "factor": 8.0, "rope_theta": 50000.0,
            "original_max_position_embeddings": 256, "beta_fast": 32, "beta_slow": 1,
            "mscale": 1.0, "mscale_all_dim": 1.0}
    config["text_config"]["rope_scaling"] = config["text_config"]["rope_parameters"] = yarn
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_rope_scaling_removed_fails_the_gate(tmp_path):
    """An MLA drafter (fc_norm) of a YaRN target memorises two answers (200 steps: the MLA
    kind learns slower than the Llama kind's 60); config.json without its rope_scaling is
    accepted far less often (measured: 2.48 against 3.65 clean) and fails the rope check."""
    from eyas.extract.config import ExtractConfig
    from eyas.train.config import TrainConfig
    from eyas.train.tiny_data import write_jsonl

    torch.set_num_threads(1)
    target = _yarn_replica(tmp_path)
    g = torch.Generator().manual_seed(0)
    merged = write_jsonl(tmp_path / "train.jsonl", [
        {"id": f"p{i}", "dataset": "toy", "input_ids": [*torch.randint(
            100, 4000, (24,), generator=g).tolist(), 5], "loss_mask": [0] * 24 + [1]}
        for i in range(2)])
    kw = dict(model_dir=target, draft_tokens=3, trust_remote_code=True)
    clean = overfit.run_gate(work=tmp_path / "gate", merged=merged,
                             extract_cfg=ExtractConfig(device="cpu"),
                             train_cfg=TrainConfig(device="cpu", draft_vocab_size=1024,
                                                   drafter="mla", fc_norm=True),
                             samples=2, steps=200, answer_tokens=32, say=lambda _m: None, **kw)
    assert clean.ok, clean.detail
    assert json.loads((clean_export := tmp_path / "gate" / "drafter" / "export" /
                       "config.json").read_text())["rope_scaling"]["factor"] == 8.0
    broken = overfit.break_export(clean_export.parent, tmp_path / "broken", "rope-scaling-removed")
    r = overfit.judge(broken, work=tmp_path / "gate", prompts=overfit.gate_prompts(merged, 2),
                      max_new_tokens=32, offline=clean.offline_tau, **kw)
    assert not r.ok and r.measured_ok is False
    assert r.measured_tau < (1 - overfit.TOLERANCE) * clean.offline_tau
    assert "rope" in r.static_failures
