"""Building and caching the tiny target; the real cached target answers in varied text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eyas.manifest import verify_manifest
from eyas.tiny.build import BUILD_INFO, TARGET_NAME, build_tiny_target, read_build_info

REPO = Path(__file__).resolve().parents[2]

BUILD_SNIPPET = (
    "from eyas.tiny import build_tiny_target; "
    "print(build_tiny_target(train_seconds=1.0), flush=True)"
)


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
    assert info["train_seconds_cap"] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == [TARGET_NAME, f"{TARGET_NAME}.lock"]
    assert verify_manifest(folder) == []

    # A cached folder of another recipe (older code, other stdlib) is rebuilt, not reused.
    monkeypatch.setenv("EYAS_CACHE_DIR", str(tmp_path))
    stale = json.loads((folder / BUILD_INFO).read_text())
    stale["recipe"] = "some-older-recipe"
    (folder / BUILD_INFO).write_text(json.dumps(stale))
    assert build_tiny_target(train_seconds=0.5) == folder
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
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert (
        model.generation_config.eos_token_id
        == tokenizer.eos_token_id
        == tokenizer.convert_tokens_to_ids("<|end|>")
    )


HELD_OUT_PROMPTS = [
    "What does `zipimport.zipimporter.get_source` do?",
    "Summarise the module `colorsys`.",
    "Explain `shutil.copytree`.",
    "What is `fractions.Fraction`?",
    "How do I use `textwrap.dedent`?",
]


@pytest.mark.slow
def test_greedy_answers_are_varied_text_that_ends(tiny_target_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_target_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    answers, ended = [], 0
    for prompt in HELD_OUT_PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=80, do_sample=False)
        new = out[0, ids.shape[1] :].tolist()
        ended += int(new[-1] == tokenizer.eos_token_id)
        assert len(set(new)) > 3, f"{prompt!r}: degenerate answer {tokenizer.decode(new)!r}"
        answers.append(tokenizer.decode(new, skip_special_tokens=True))
    assert len(set(answers)) >= 3, answers
    assert ended >= 3, answers
