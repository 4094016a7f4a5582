"""Phases 1-3 as functions of (config, run layout), and their command line (eyas.prepare.phases):
what phase 2 reads of phase 1's answers, when a phase is skipped, the host command."""

from __future__ import annotations

import json

import pytest
import yaml
from support.fault_proxy import Fault, FaultProxy
from support.loss_mask_fixtures import build_test_tokenizer

from eyas.config import load_config
from eyas.conversation import Conversation, Message
from eyas.errors import DataError
from eyas.io import AtomicJsonlWriter, read_json
from eyas.layout import RunLayout
from eyas.manifest import write_manifest
from eyas.prepare import phases
from eyas.prepare.generate import ServerOutputError


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_test_tokenizer(tmp_path_factory.mktemp("tok"))


def _config(tmp_path, tok_dir, **tokenize):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "name": "phases", "target": {"model": str(tok_dir)},
        "datasets": [{"name": "chat", "source": "prompts.jsonl"}],
        "tokenize": {"num_proc": 1, **tokenize},
    }))
    return path


def _answers(layout: RunLayout, cut: set[int]) -> None:
    """Phase 1's output as it leaves it: answers with their finish reasons, then the manifest."""
    with AtomicJsonlWriter(layout.responses("chat")) as w:
        for i in range(6):
            answer = Message("assistant", f"It is {2 * i}",
                             finish_reason="length" if i in cut else "stop")
            w.write(Conversation(f"c{i}", [Message("user", f"{i} + {i}?"), answer]).to_json())
    write_manifest(layout.generated_dir("chat"), phase="generate", outputs=["responses.jsonl"],
                   counts={"samples": 6, "cut_answers": len(cut)})


def test_tokenize_reads_cut_answers_and_reruns_when_the_policy_changes(tmp_path, tok_dir):
    layout = RunLayout(tmp_path / "run")
    _answers(layout, cut={2, 5})
    cfg = load_config(_config(tmp_path, tok_dir))
    stats = phases.tokenize_phase(cfg, layout, "chat", target_dir=tok_dir)
    assert (stats["samples"], stats["cut_answers"], stats["cut_answers_dropped"]) == (6, 2, 0)
    assert stats["cut_answer_share"] == 2 / 6
    assert phases.tokenize_phase(cfg, layout, "chat", target_dir=tok_dir)["skipped"]
    # Another policy is another output: the phase runs again.
    dropped = load_config(_config(tmp_path, tok_dir, cut_answers="drop"))
    stats = phases.tokenize_phase(dropped, layout, "chat", target_dir=tok_dir)
    assert "skipped" not in stats and (stats["samples"], stats["cut_answers_dropped"]) == (4, 2)
    assert read_json(layout.prepared_stats("chat"))["cut_answers"] == 2


def test_tokenize_waits_for_generation_and_merge_for_tokenization(tmp_path, tok_dir):
    layout = RunLayout(tmp_path / "run")
    cfg = load_config(_config(tmp_path, tok_dir))
    layout.generated_dir("chat").mkdir(parents=True)
    layout.responses("chat").write_text("")  # answers still coming: no manifest yet
    with pytest.raises(DataError, match="generation has not finished"):
        phases.tokenize_phase(cfg, layout, "chat", target_dir=tok_dir)
    with pytest.raises(DataError, match="not tokenized yet"):
        phases.merge_phase(cfg, layout)


def test_main_runs_a_phase_and_prints_its_result_as_json(tmp_path, tok_dir, capsys):
    layout = RunLayout(tmp_path / "run")
    _answers(layout, cut=set())
    config = _config(tmp_path, tok_dir)
    argv = ["tokenize", "--config", str(config), "--workdir", str(layout.workdir)]
    assert phases.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["chat"]["samples"] == 6
    assert phases.main(["merge", "--config", str(config), "--workdir", str(layout.workdir)]) == 0
    assert json.loads(capsys.readouterr().out)["records"] > 0
    assert phases.main(["merge", "--config", str(tmp_path / "nope.yaml"),
                        "--workdir", str(layout.workdir)]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_command_runs_the_package_entry_point_with_the_given_python():
    cmd = phases.command("/data/.eyas/venv/bin/python", "tokenize", config="/data/run/c.yaml",
                         workdir="/data/my run", datasets=["B1_glaive", "B2 x"])
    assert cmd == ("/data/.eyas/venv/bin/python -m eyas.prepare tokenize --config /data/run/c.yaml"
                   " --workdir '/data/my run' --dataset B1_glaive --dataset 'B2 x'")


def test_phase_1_refuses_answers_spelling_the_targets_special_tokens(tmp_path, tok_dir):
    """A real HTTP stand-in for a server without a reasoning parser (every answer
    ``reasoning</think>answer``): phase 1 checks answers against the target's own tokenizer
    and template (``</think>`` is an added token of the test tokenizer) and, with
    ``on_bad_record: reject``, stops after the first few, in generic words (not Kimi's)."""
    markers = phases.target_special_text(load_config(_config(tmp_path, tok_dir))).markers
    assert {"<think>", "</think>", "<|end|>"} <= set(markers)
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"{i} + {i}?"}]})
        + "\n" for i in range(30)))
    cfg = load_config(_config(tmp_path, tok_dir, on_bad_record="reject"))
    answer = {"role": "assistant", "content": "Sum them.</think>It is 2."}
    with FaultProxy("http://127.0.0.1:9") as server:  # nothing passes upstream
        server.rules.append(lambda body: Fault.respond(
            {"choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}))
        with pytest.raises(ServerOutputError, match="reasoning parser and tool-call parser"):
            phases.generate_phase(cfg, RunLayout(tmp_path / "run"), "chat",
                                  base_url=server.base_url, model="m", api_key=None)
        # Stopped at the third refusal: only the requests already in flight came after it.
        assert len(server.chat_requests()) <= cfg.generation.concurrency + 3 < 30


def test_top_p_joins_the_answers_fingerprint_only_when_set(tmp_path, tok_dir):
    cfg = load_config(_config(tmp_path, tok_dir))
    assert "top_p" not in phases.generation_settings(cfg, cfg.dataset("chat"), "m")
    cfg.generation.top_p = 0.95
    assert phases.generation_settings(cfg, cfg.dataset("chat"), "m")["top_p"] == 0.95


def test_new_settings_join_the_fingerprints_only_when_set(tmp_path, tok_dir):
    """max_user_turns and the launched server's dtype: outputs made before they existed
    keep their fingerprint; set, they change it."""
    cfg = load_config(_config(tmp_path, tok_dir))
    ds = cfg.dataset("chat")
    before = phases.generation_settings(cfg, ds, "m")
    assert "max_user_turns" not in before["dataset"] and "server_dtype" not in before
    cfg.generation.server_dtype = "bfloat16"
    assert "server_dtype" not in phases.generation_settings(cfg, ds, "m")  # no server launched
    cfg.generation.launch_server = True
    assert phases.generation_settings(cfg, ds, "m")["server_dtype"] == "bfloat16"
    ds.max_user_turns = 1
    assert phases.dataset_settings(ds)["max_user_turns"] == 1


def test_prompts_longer_than_max_prompt_tokens_are_counted_and_never_sent(tmp_path, tok_dir):
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"id": f"p{i}", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "word " * (400 if i % 3 == 0 else 3)},
            {"role": "assistant", "content": "old answer"},
            {"role": "user", "content": "word " * 400}]}) + "\n" for i in range(6)))
    cfg = load_config(_config(tmp_path, tok_dir))
    cfg.generation.max_prompt_tokens = 64
    count = phases.first_request_tokens(*phases.target_tokenizer(cfg))
    rec = Conversation("x", [Message("system", "Be brief."), Message("user", "word " * 3),
                             Message("assistant", "a"), Message("user", "word " * 400)])
    assert 3 < count(rec) <= 64  # the first request: system + first user turn, not the rest
    answer = {"role": "assistant", "content": "Short."}
    with FaultProxy("http://127.0.0.1:9") as server:
        server.rules.append(lambda body: Fault.respond(
            {"choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}))
        counts = phases.generate_phase(cfg, RunLayout(tmp_path / "run"), "chat",
                                       base_url=server.base_url, model="m", api_key=None)
        sent = server.chat_requests()
    assert counts["long_prompts"] == 2 and counts["samples_done"] == 4
    assert len(sent) == 4 * 2  # two user turns each; the long first turns never went out
    ids = [json.loads(line)["id"] for line in
           RunLayout(tmp_path / "run").responses("chat").read_text().splitlines()]
    assert ids == ["p1", "p2", "p4", "p5"]
