"""Assembling and caching the tiny target from the shipped weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO
from transformers import AutoModelForCausalLM, AutoTokenizer

from eyas import verified
from eyas.errors import EyasError
from eyas.manifest import verify_manifest
from eyas.tiny.build import BUILD_INFO, TARGET_NAME, build_tiny_target, read_build_info

BUILD_SNIPPET = "from eyas.tiny import build_tiny_target; print(build_tiny_target(), flush=True)"


@pytest.mark.slow
def test_concurrent_builders_build_once_and_stale_recipes_rebuild(tmp_path, monkeypatch):
    env = {**os.environ, "EYAS_CACHE_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD_SNIPPET],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    folder = tmp_path / TARGET_NAME
    assert {Path(out.strip().splitlines()[-1]) for out, _ in outs} == {folder}
    info = read_build_info(folder)
    assert info["builder_pid"] in {p.pid for p in procs}
    # Nothing but the folder, its lock and the table of hashes its manifest's writer took
    # (eyas.verified: the first verification trusts them).
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [TARGET_NAME, f"{TARGET_NAME}.lock", verified.DB_NAME])
    assert verify_manifest(folder) == []

    # A cached folder of other weights (retrained, older recipe) is rebuilt, not reused.
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path))
    stale = json.loads((folder / BUILD_INFO).read_text())
    stale["recipe"] = "some-older-recipe"
    (folder / BUILD_INFO).write_text(json.dumps(stale))
    assert build_tiny_target() == folder
    assert read_build_info(folder)["builder_pid"] == os.getpid()
    # A current one is reused as is.
    before = (folder / "model.safetensors").read_bytes()
    assert build_tiny_target() == folder
    assert (folder / "model.safetensors").read_bytes() == before


@pytest.fixture(scope="module")
def tiny_target_dir() -> Path:
    return build_tiny_target()


@pytest.mark.slow
def test_cached_target_folder_is_complete(tiny_target_dir):
    assert verify_manifest(tiny_target_dir) == []
    info = read_build_info(tiny_target_dir)
    assert info["stats"]["final_loss"] < info["stats"]["first_loss"]
    assert info["answers"]["answers"] > 0  # measured when the weights were trained
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert (
        model.generation_config.eos_token_id
        == tokenizer.eos_token_id
        == tokenizer.convert_tokens_to_ids("<|end|>")
    )


def test_weights_that_do_not_match_the_code_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(
        "eyas.tiny.weights.check_shipped", lambda: ["recipe.json: weights trained for recipe X"]
    )
    with pytest.raises(EyasError, match="do not match the code:\n  recipe.json: weights trained"):
        build_tiny_target()
    assert not (tmp_path / TARGET_NAME).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
