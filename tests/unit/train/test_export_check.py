"""`eyas check-export` and the static checks of an export (`eyas.train.export_check`), on the
tiny target's overfit-gate run laid out as a run folder (tests/support/gate_fixtures.py): it passes on
the trainer's export, and fails, naming the check, on copies broken on purpose."""

from __future__ import annotations

import contextlib
import io
import shutil

import pytest
from support.gate_fixtures import tiny_gate_run
from support.paths import REPO

from eyas.cli import main
from eyas.evaluate.overfit import break_export
from eyas.train.export_check import check_chat_template, check_positions, required_weights


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A demo-like run folder: hidden/train (the shards trained on), drafter/ (vocab/, export/)."""
    run = tiny_gate_run()
    w = tmp_path_factory.mktemp("run")
    shutil.copytree(run.work / "hidden", w / "hidden" / "train")
    shutil.copytree(run.work / "drafter", w / "drafter")
    return w


def _check_export(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check-export", "--config", str(REPO / "recipes" / "tiny-demo.yaml"), *argv])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_check_export_passes_on_the_demo_like_export(workdir):
    code, out, err = _check_export("--workdir", str(workdir))
    assert code == 0, out + err
    lines = out.strip().splitlines()
    names = [line.split()[1] for line in lines[:-1]]
    assert names == ["files", "aux_layers", "vocab", "weights", "rope", "positions",
                     "chat_template"]
    assert all(line.startswith("ok") for line in lines[:-1])
    assert "fc_norm=True" in out and "check-export: all 7 checks passed" in out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_check_export_fails_on_aux_layers_shifted_by_one(workdir, tmp_path):
    broken = break_export(workdir / "drafter" / "export", tmp_path / "export", "aux-shift")
    code, out, err = _check_export("--workdir", str(workdir), "--drafter", str(broken))
    assert code == 1
    failed = {line.split()[1]: line for line in out.splitlines() if line.startswith("FAIL")}
    assert set(failed) == {"files", "aux_layers"}
    assert "ids [1, 2, 3] serve layers [1, 2, 3]" in failed["aux_layers"]
    assert "trained on [0, 1, 2]" in failed["aux_layers"]
    assert "2 of 7 checks failed: files, aux_layers" in err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_break_is_named_by_its_own_check(workdir, tmp_path):
    from eyas.train.export_check import check_export

    kw = dict(shard_dirs=[workdir / "hidden" / "train"], vocab_dir=workdir / "drafter" / "vocab")
    for how, check in (("fc-norm-dropped", "weights"), ("d2t-off-by-one", "vocab")):
        broken = break_export(workdir / "drafter" / "export", tmp_path / how, how)
        failed = {c.name for c in check_export(broken, **kw) if not c.ok}
        assert failed == {"files", check}, how
    # d2t left alone, t2d missing one of its tokens: the round trip fails.
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "t2d"
    shutil.copytree(workdir / "drafter" / "export", copy)
    t = load_file(str(copy / "model.safetensors"))
    t["t2d"][7] = False
    save_file(t, str(copy / "model.safetensors"))
    vocab = next(c for c in check_export(copy, **kw) if c.name == "vocab")
    assert not vocab.ok and "t2d and d2t name different target tokens" in vocab.detail


def test_max_position_embeddings_below_the_served_context_fails():
    assert check_positions({"max_position_embeddings": 8192}, 8192).ok
    c = check_positions({"max_position_embeddings": 2048}, 8192)
    assert not c.ok and "2048 < the longest served context 8192" in c.detail


def test_sglang_needs_one_fc_norm_per_aux_state():
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64,
              "target_hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 4, "head_dim": 16, "vocab_size": 100,
              "draft_vocab_size": 50, "rms_norm_eps": 1e-5, "rope_theta": 1e4,
              "max_position_embeddings": 512,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}
    plain = required_weights(config)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t",
            "midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight"} <= set(plain)
    assert not any(n.startswith("fc_norm") for n in plain)
    assert set(required_weights({**config, "fc_norm": True})) - set(plain) == {
        "fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"}


def test_a_server_template_other_than_trainings_fails(tiny_target):
    own = check_chat_template(tiny_target, trained_template=None, served_template=None)
    assert own.ok
    other = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    c = check_chat_template(tiny_target, trained_template=None, served_template=other)
    assert not c.ok and "render different ids" in c.detail
    assert check_chat_template(tiny_target, trained_template=other, served_template=other).ok
