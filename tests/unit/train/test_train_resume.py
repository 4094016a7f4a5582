"""`eyas.train.resume.claim` on this machine's `LocalHost`: a ``drafter/`` trained with other
settings is moved aside, the same settings resume, a finished one is found finished."""

from __future__ import annotations

import json
from pathlib import Path

from support.paths import REPO as ROOT

from eyas.config import load_config
from eyas.layout import RunLayout
from eyas.manifest import config_fingerprint, write_manifest
from eyas.remote.hosts import HostSpec, connect
from eyas.train.resume import Claim, claim, resume_settings

DATA = {"train": "a" * 64, "eval": "b" * 64}


def _cfg(**train):
    cfg = load_config(ROOT / "recipes" / "tiny-demo.yaml")
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 4, **train})})


def _finished(run: RunLayout, steps: int) -> None:
    run.checkpoint.mkdir(parents=True)
    run.export.mkdir()
    (run.export / "model.safetensors").write_bytes(b"weights")
    write_manifest(run.export, phase="export", outputs=[run.export / "model.safetensors"],
                   counts={"draft_vocab_size": 64})
    run.history.write_text(json.dumps([{"kind": "train", "step": s} for s in range(1, steps + 1)]))


def test_a_fresh_folder_is_claimed_with_the_settings_and_the_data(tmp_path):
    cfg, run = _cfg(), RunLayout(tmp_path)
    with connect(HostSpec.local(data_root="/")) as h:
        assert claim(h, cfg, tmp_path, "offline", DATA, 1) == Claim(None, None)
    assert json.loads(run.resume_record.read_text()) == {
        "settings": config_fingerprint(resume_settings(cfg, "offline")), "data": DATA}


def test_the_same_settings_resume_and_a_finished_training_is_found_finished(tmp_path):
    cfg, run = _cfg(), RunLayout(tmp_path)
    with connect(HostSpec.local(data_root="/")) as h:
        claim(h, cfg, tmp_path, "offline", DATA, 1)
        _finished(run, steps=3)
        assert claim(h, cfg, tmp_path, "offline", DATA, 1) == Claim(None, None)  # resumes
        assert run.checkpoint.is_dir()
        run.history.write_text(json.dumps([{"kind": "train", "step": s} for s in (1, 2, 3, 4)]))
        found = claim(h, cfg, tmp_path, "offline", DATA, 1)
        # More steps is no other drafter (RESUME_IRRELEVANT): resumed, not moved aside.
        more = claim(h, _cfg(steps=8), tmp_path, "offline", DATA, 1)
    assert found.moved_aside is None and found.finished is not None
    assert (found.finished["steps"], found.finished["status"], found.finished["export"],
            found.finished["draft_vocab_size"]) == (4, "complete", str(run.export), 64)
    assert more == Claim(None, None) and run.checkpoint.is_dir()


def test_a_broken_export_is_not_finished(tmp_path):
    cfg, run = _cfg(), RunLayout(tmp_path)
    with connect(HostSpec.local(data_root="/")) as h:
        claim(h, cfg, tmp_path, "offline", DATA, 1)
        _finished(run, steps=4)
        (run.export / "model.safetensors").write_bytes(b"damaged")
        assert claim(h, cfg, tmp_path, "offline", DATA, 1) == Claim(None, None)


def test_other_settings_or_data_move_the_folder_aside(tmp_path):
    cfg, run = _cfg(), RunLayout(tmp_path)
    with connect(HostSpec.local(data_root="/")) as h:
        claim(h, cfg, tmp_path, "offline", DATA, 1)
        _finished(run, steps=4)
        other = claim(h, _cfg(lr=cfg.train.lr * 2), tmp_path, "offline", DATA, 1)
        assert other.finished is None and other.moved_aside is not None
        aside = Path(other.moved_aside)
        assert aside.name.startswith("drafter.replaced-") and (aside / "checkpoint").is_dir()
        assert not run.checkpoint.exists() and run.resume_record.is_file()
        _finished(run, steps=4)
        new_data = claim(h, _cfg(lr=cfg.train.lr * 2), tmp_path, "offline",
                         {**DATA, "train": "c" * 64}, 1)
    assert new_data.moved_aside is not None and new_data.moved_aside != other.moved_aside


def test_the_mla_section_keeps_the_flat_identity_runs_were_claimed_with():
    """`train.mla:` became a section after drafters were trained with its fields at the top of
    `train`: the identity still lists them there, so those runs resume and stay Cached."""
    from eyas.train.resume import train_settings

    flat = train_settings(_cfg(), "offline")["train"]
    assert "mla" not in flat
    assert {k: flat[k] for k in ("num_heads", "kv_lora_rank", "init_attention")} == {
        "num_heads": None, "kv_lora_rank": None, "init_attention": "random"}
    mla = _cfg(drafter="mla")
    mla = mla.model_copy(update={"train": mla.train.model_copy(
        update={"mla": mla.train.mla.model_copy(update={"kv_lora_rank": 64})})})
    assert train_settings(mla, "offline")["train"]["kv_lora_rank"] == 64
