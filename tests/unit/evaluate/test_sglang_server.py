"""SGLang command lines and request bodies: checked against SGLang 0.5.23's source shapes
(flag names and value types pinned below) everywhere, and against SGLang's own ``ServerArgs``
parser and ``/generate`` contract where a python with SGLang is at hand (this interpreter, or
``EYAS_SGLANG_PYTHON``: e.g. a side venv with ``pip install --no-deps sglang==0.5.23`` plus
torch CPU and the pure-Python deps its ``server_args`` import needs)."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
from pathlib import Path

import pytest
from support.paths import REPO
from support.sglang_env import sglang_python, sglang_source

from eyas.evaluate.serving_config import ServingConfig, SpecKnobs
from eyas.evaluate.sglang_server import (
    LAUNCH_MODULE,
    PINNED_SGLANG,
    ServerSpec,
    generate_body,
    server_args,
    server_command,
)

# SGLang 0.5.23, sglang/srt/arg_groups/fields/*.py: flag -> (ServerArgs field, value type).
PINNED_FLAGS = {
    "--model-path": ("model_path", str),              # fields/model.py (alias --model)
    "--host": ("host", str),                          # fields/serving.py
    "--port": ("port", int),                          # fields/serving.py
    "--tp-size": ("tp_size", int),                    # fields/parallel.py (--tensor-parallel-size)
    "--trust-remote-code": ("trust_remote_code", bool),   # fields/model.py, a switch
    "--incremental-streaming-output": ("incremental_streaming_output", bool),  # fields/serving.py
    "--speculative-algorithm": ("speculative_algorithm", str),          # fields/spec.py
    "--speculative-draft-model-path": ("speculative_draft_model_path", str),
    "--speculative-num-steps": ("speculative_num_steps", int),
    "--speculative-eagle-topk": ("speculative_eagle_topk", int),
    "--speculative-num-draft-tokens": ("speculative_num_draft_tokens", int),
    "--speculative-use-rejection-sampling": ("speculative_use_rejection_sampling", bool),
    # n-gram speculation, fields/spec.py "Speculative decoding (ngram)"
    "--speculative-ngram-min-bfs-breadth": ("speculative_ngram_min_bfs_breadth", int),
    "--speculative-ngram-max-bfs-breadth": ("speculative_ngram_max_bfs_breadth", int),
    "--speculative-ngram-match-type": ("speculative_ngram_match_type", str),
    "--speculative-ngram-max-trie-depth": ("speculative_ngram_max_trie_depth", int),
    "--speculative-ngram-capacity": ("speculative_ngram_capacity", int),
}

BASELINE = ServerSpec("/data/models/kimi k2.5", 30001, tp_size=8, trust_remote_code=True)
EAGLE3 = ServerSpec("/data/models/kimi k2.5", 30001, tp_size=8, trust_remote_code=True,
                    draft_model_path="/data/runs/100k/drafter/export",
                    knobs=SpecKnobs(3, 1, 4), extra_args=("--mem-fraction-static", "0.85"))
NGRAM_CFG = ServingConfig(ngram_num_draft_tokens=8, ngram_args={
    "speculative_ngram_max_bfs_breadth": 1, "speculative_ngram_max_trie_depth": 12})
NGRAM = ServerSpec("/data/models/kimi k2.5", 30001, tp_size=8, trust_remote_code=True,
                   ngram=True, ngram_args=tuple(NGRAM_CFG.ngram_flags()))
EXPECTED_NGRAM = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 8,
                  "speculative_ngram_max_bfs_breadth": 1, "speculative_ngram_max_trie_depth": 12}
EXPECTED = {
    "model_path": "/data/models/kimi k2.5", "host": "127.0.0.1", "port": 30001, "tp_size": 8,
    "trust_remote_code": True, "incremental_streaming_output": True,
    "speculative_algorithm": "EAGLE3",
    "speculative_draft_model_path": "/data/runs/100k/drafter/export",
    "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
    "speculative_use_rejection_sampling": False,
}


def _pinned_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)
    for flag, (dest, kind) in PINNED_FLAGS.items():
        if kind is bool:
            p.add_argument(flag, dest=dest, action="store_true")
        else:
            p.add_argument(flag, dest=dest, type=kind)
    return p


def test_command_lines_against_sglang_0_5_23_source_shapes():
    parser = _pinned_parser()
    base = {k: v for k, v in vars(parser.parse_args(server_args(BASELINE))).items()
            if not k.startswith("speculative_ngram_")}
    assert base == {**{k: None for k in EXPECTED}, "trust_remote_code": True,
                    "incremental_streaming_output": True,
                    "speculative_use_rejection_sampling": False,
                    **{k: EXPECTED[k] for k in ("model_path", "host", "port", "tp_size")}}
    args = server_args(EAGLE3)
    assert args[-2:] == ["--mem-fraction-static", "0.85"]  # extra flags go through untouched
    assert {k: v for k, v in vars(parser.parse_args(args[:-2])).items()
            if not k.startswith("speculative_ngram_")} == EXPECTED
    # Every flag we emit is a pinned one (a typo would not parse).
    assert {a for a in args[:-2] if a.startswith("--")} <= set(PINNED_FLAGS)
    assert "--trust-remote-code" not in server_args(ServerSpec("/m", 30000))
    # every server eyas starts streams deltas (SGLang 0.5.23 defaults to whole answers)
    for spec in (BASELINE, EAGLE3, NGRAM, ServerSpec("/m", 30000)):
        assert server_args(spec).count("--incremental-streaming-output") == 1


def test_the_ngram_server_speaks_sglangs_ngram_flags():
    """SGLang's own n-gram speculation: NGRAM, no draft model, its flags by ServerArgs name."""
    args = server_args(NGRAM)
    parsed = vars(_pinned_parser().parse_args(args))
    assert {k: parsed[k] for k in EXPECTED_NGRAM} == EXPECTED_NGRAM
    assert parsed["speculative_draft_model_path"] is None and parsed["tp_size"] == 8
    assert NGRAM.mode == "ngram"
    # SGLang's defaults (12 draft tokens, breadth 10 ...) unless set: no flag at all.
    assert server_args(ServerSpec("/m", 30000, ngram=True))[-2:] == [
        "--speculative-algorithm", "NGRAM"]
    with pytest.raises(ValueError, match="not both"):
        ServerSpec("/m", 30000, ngram=True, draft_model_path="/d", knobs=SpecKnobs(3, 1, 4))
    with pytest.raises(ValueError, match="not an n-gram flag"):
        ServingConfig(ngram_args={"speculative_num_steps": 3})
    with pytest.raises(ValueError, match="not an n-gram flag"):
        ServingConfig(ngram_args={"speculative_ngram_max_bfs_breath": 3})  # a typo


def test_rejection_sampling_is_a_flag_of_the_eagle3_server_only():
    """``serving.rejection_sampling``: SGLang's ``--speculative-use-rejection-sampling`` on the
    EAGLE-3 servers of the grid, never on the baseline or the n-gram server; SGLang 0.5.23
    allows it with topk 1 only (``arg_groups/speculative_hook.py``), so the grid must be a chain."""
    from dataclasses import replace

    spec = replace(EAGLE3, rejection_sampling=True)
    args = server_args(spec)
    parsed = vars(_pinned_parser().parse_args(args[:-2]))
    assert parsed == {**EXPECTED, "speculative_use_rejection_sampling": True,
                      **{k: None for k in parsed if k.startswith("speculative_ngram_")}}
    assert args.count("--speculative-use-rejection-sampling") == 1
    for other in (BASELINE, NGRAM):
        with pytest.raises(ValueError, match="EAGLE-3 server only"):
            replace(other, rejection_sampling=True)
    assert "--speculative-use-rejection-sampling" not in server_args(EAGLE3)
    assert ServingConfig(rejection_sampling=True).rejection_sampling
    with pytest.raises(ValueError, match="eagle_topk"):
        ServingConfig(rejection_sampling=True, eagle_topk=[1, 2], num_draft_tokens=[4])


def test_pinned_flags_are_server_args_of_the_one_pinned_table():
    """One table of SGLang's argument names (eyas.sglang_args): every flag here is in it."""
    from eyas.sglang_args import SERVER_ARGS
    from eyas.sglang_version import SGLANG_VERSION

    assert PINNED_SGLANG is SGLANG_VERSION  # one pin: eyas.sglang_version
    for flag, (dest, _) in PINNED_FLAGS.items():
        assert dest in SERVER_ARGS and flag == "--" + dest.replace("_", "-"), flag


def test_the_sglang_extra_installs_the_one_pinned_release():
    from eyas.sglang_version import SGLANG_VERSION

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["optional-dependencies"]["sglang"] == [f"sglang=={SGLANG_VERSION}"]


def test_server_command_quotes_paths_and_runs_sglang_launch_server():
    cmd = server_command("/opt/sglang venv/bin/python", EAGLE3)
    argv = shlex.split(cmd)
    assert argv[:3] == ["/opt/sglang venv/bin/python", "-m", LAUNCH_MODULE]
    assert argv[3:] == server_args(EAGLE3)
    assert "'/data/models/kimi k2.5'" in cmd


def test_an_eagle3_server_needs_both_drafter_and_knobs():
    with pytest.raises(ValueError, match="both"):
        ServerSpec("/m", 30000, draft_model_path="/d")
    assert (BASELINE.mode, EAGLE3.mode) == ("baseline", "eagle3")


def test_generate_body_against_sglang_0_5_23_source_shapes():
    # sglang/api/v1/api_types.py GenerateRequest: input_ids (token ids) + sampling_params.
    body = generate_body((1, 2, 3), max_tokens=16, temperature=0.0)
    assert body == {"input_ids": [1, 2, 3],
                    "sampling_params": {"max_new_tokens": 16, "temperature": 0.0}}


# --------------------------------------------------------------------------- real SGLang


_CHECK = r"""
import argparse, json, sys, pathlib
import sglang
from sglang.srt.server_args import ServerArgs
from sglang.api.v1.api_types import GenerateRequest
argvs, body = json.loads(sys.argv[1]), json.loads(sys.argv[2])
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
types = {}
for a in parser._actions:
    for flag in a.option_strings:
        types[flag] = [a.dest, getattr(a.type, "__name__", None), a.nargs, a.const]
parsed = []
for argv in argvs:
    args = ServerArgs.from_cli_args(parser.parse_args(argv))   # unknown flags exit 2
    parsed.append({k: getattr(args, k) for k in json.loads(sys.argv[3])})
GenerateRequest.from_json_value(body)          # raises JsonContractError on a bad body
root = pathlib.Path(sglang.__file__).parent / "srt"
sources = {name: (root / name).read_text() for name in (
    "arg_groups/speculative_hook.py", "speculative/eagle_utils.py",
    "managers/tokenizer_manager.py", "managers/scheduler_components/internal_state.py",
    "entrypoints/http_server.py")}
print(json.dumps({"version": sglang.__version__, "parsed": parsed, "types": types,
                  "sources": sources}))
"""


@pytest.mark.skipif(sglang_python() is None,
                    reason="no python with SGLang here (GPU hosts; or set EYAS_SGLANG_PYTHON)")
def test_command_lines_and_http_shapes_against_sglang_own_server_args():  # pragma: no cover
    python = sglang_python()
    argvs = [server_args(BASELINE), server_args(EAGLE3), server_args(NGRAM)]
    body = generate_body([1, 2, 3], max_tokens=16, temperature=0.0)
    res = subprocess.run([python, "-c", _CHECK, json.dumps(argvs), json.dumps(body),
                          json.dumps(list(EXPECTED) + list(EXPECTED_NGRAM)[1:])],
                         capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["version"] == PINNED_SGLANG
    assert {k: got["parsed"][1][k] for k in EXPECTED} == EXPECTED
    assert {k: got["parsed"][2][k] for k in EXPECTED_NGRAM} == EXPECTED_NGRAM
    assert got["parsed"][0]["speculative_algorithm"] is None
    assert got["parsed"][0]["model_path"] == EXPECTED["model_path"]
    for flag, (dest, kind) in PINNED_FLAGS.items():  # the pinned table is SGLang's own
        sg_dest, sg_type, _, const = got["types"][flag]
        assert sg_dest == dest, flag
        assert (const is True) if kind is bool else (sg_type == kind.__name__), flag
    src = got["sources"]
    # The grid's rules (eyas.evaluate.serving_config) are SGLang's.
    assert "speculative_num_draft_tokens=cfg.speculative_num_steps + 1" in \
        src["arg_groups/speculative_hook.py"]
    assert "topk + (num_steps-1) * topk" in src["speculative/eagle_utils.py"]
    # What the benchmark reads back from a server.
    assert 'meta_info["spec_verify_ct"]' in src["managers/tokenizer_manager.py"]
    assert "recv_obj.completion_tokens[i] / recv_obj.spec_verify_ct[i]" in \
        src["managers/tokenizer_manager.py"]
    assert 'state["avg_spec_accept_length"]' in \
        src["managers/scheduler_components/internal_state.py"]
    http = src["entrypoints/http_server.py"]
    assert '@app.get("/health_generate")' in http and '@app.get("/server_info")' in http
    assert '"/generate"' in http
    # Streaming (one server-sent event per step) and the prefix-cache flush between runs.
    assert 'yield b"data: " + dumps_json(out)' in http and 'b"data: [DONE]' in http
    assert '@app.api_route("/flush_cache", methods=["GET", "POST"])' in http
    # The n-gram server's defaults, as docs/serving.md states them.
    hook = src["arg_groups/speculative_hook.py"]
    assert "def _handle_ngram" in hook and "speculative_num_draft_tokens=12" in hook
    # --incremental-streaming-output: each event its delta of output_ids, while
    # meta_info.completion_tokens stays the running total (what loadgen reads).
    tm = src["managers/tokenizer_manager.py"]
    assert "incremental = is_stream and self.incremental_streaming_output" in tm
    assert "output_token_ids = delta_output_ids" in tm
    assert '"completion_tokens": recv_obj.completion_tokens[i],' in tm
    assert got["parsed"][0]["incremental_streaming_output"] is True


def _host_check(tmp_path, target_cfg: dict, drafter_cfg: dict, rejection: bool) -> list[str]:
    """The serving benchmark's check of the host (`eyas.evaluate.serving._PREFLIGHT`), run here
    as the host runs it: a python script over the model and drafter folders."""
    import socket
    import sys

    from eyas.evaluate.serving import _PREFLIGHT
    from eyas.hf_target import WRAPPER_KEYS

    for name, cfg in (("target", target_cfg), ("drafter", drafter_cfg)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "eval.jsonl").write_text('{"input_ids": [1], "loss_mask": [1]}\n')
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = subprocess.run([sys.executable, "-c", _PREFLIGHT, str(tmp_path / "target"),
                          str(tmp_path / "drafter"), str(tmp_path / "eval.jsonl"), str(port),
                          "1" if rejection else "0", json.dumps(list(WRAPPER_KEYS))],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_the_host_check_refuses_rejection_sampling_for_a_reduced_draft_vocabulary(tmp_path):
    """SGLang 0.5.23 raises at startup when rejection sampling meets a drafter of fewer tokens
    than the target (``eagle_worker_v2.py``); the benchmark says so before any server starts,
    naming the drafter, both sizes and the two ways out. Kimi-K2.5 keeps its vocabulary
    under ``text_config``."""
    reduced = {"vocab_size": 163840, "draft_vocab_size": 32000}
    kimi = {"architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {"vocab_size": 163840, "num_hidden_layers": 61}}
    problems = _host_check(tmp_path, kimi, reduced, rejection=True)
    assert len(problems) == 1 and str(tmp_path / "drafter") in problems[0]
    assert "drafts 32000 of the target's 163840" in problems[0]
    assert "train.draft_vocab_size 163840" in problems[0]
    assert "rejection_sampling false" in problems[0]
    assert _host_check(tmp_path, kimi, reduced, rejection=False) == []
    assert _host_check(tmp_path, kimi, {"vocab_size": 163840, "draft_vocab_size": 163840},
                       rejection=True) == []
    assert _host_check(tmp_path, {"vocab_size": 49152}, {"vocab_size": 49152},
                       rejection=True) == []  # no draft_vocab_size: SGLang drafts them all
    # The host script reads a wrapper's vocabulary where eyas.hf_target.text_config does, for
    # every wrapper key eyas knows (it is handed them: the host runs stdlib only).
    from eyas.hf_target import WRAPPER_KEYS, text_config

    for key in WRAPPER_KEYS:
        wrapped = {key: {"vocab_size": 1000, "num_hidden_layers": 2}}
        assert text_config(wrapped)["vocab_size"] == 1000
        assert _host_check(tmp_path, wrapped, {"vocab_size": 1000, "draft_vocab_size": 1000},
                           rejection=True) == [], key
        assert "of the target's 1000 tokens" in _host_check(
            tmp_path, wrapped, {"vocab_size": 1000, "draft_vocab_size": 500}, rejection=True)[0]


def _sglang_speculative_source() -> Path | None:
    return sglang_source("srt/speculative/eagle_worker_v2.py")


@pytest.mark.skipif(_sglang_speculative_source() is None,
                    reason="SGLang's source is not unpacked here (EYAS_SGLANG_SOURCE)")
def test_rejection_sampling_rules_are_sglangs_own():  # pragma: no cover
    """What the knob and the host check assume, read in SGLang 0.5.23's source: rejection
    sampling needs the draft vocabulary to be the target's (the EAGLE-3 drafter's ``d2t`` sets
    ``hot_token_id``, whose length is compared) and topk 1."""
    src = _sglang_speculative_source()
    worker = (src / "srt/speculative/eagle_worker_v2.py").read_text()
    assert "requires the draft and" in worker and "draft_vocab_size != target_vocab_size" in worker
    assert "self.hot_token_id = self.draft_runner.model.hot_token_id" in worker
    eagle3 = (src / "srt/models/llama_eagle3.py").read_text()
    assert "self.hot_token_id = loaded_weight + torch.arange" in eagle3
    hook = (src / "srt/arg_groups/speculative_hook.py").read_text()
    assert "--speculative-use-rejection-sampling requires --speculative-eagle-topk=1." in hook
