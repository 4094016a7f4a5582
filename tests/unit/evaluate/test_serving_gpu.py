"""The serving benchmark for real: SGLang on this machine's GPU serving the tiny target without
speculation, with SGLang's own n-gram speculation and with an exported drafter (untrained,
seeded: this checks the path end to end, not the speed), on merged records and chat messages
rendered with the target's template; every point 3 times, SGLang's prefix cache flushed
(``POST /flush_cache``) before each run, answers streamed (TTFT, decode tok/s per request), the
GPU checked free (nvidia-smi) before each server, draft and verification costs read back.

    EYAS_SGLANG_PYTHON=/venv-with-sglang/bin/python bash scripts/gpu_check.sh serving

Needs a CUDA GPU (marker ``gpu``) and a python whose environment has SGLang, given as
``EYAS_SGLANG_PYTHON``; ``EYAS_SERVING_DRAFTER`` may name an exported drafter of the tiny target
to serve instead, ``EYAS_SERVING_EXTRA_ARGS`` extra SGLang flags (shell words)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _untrained_drafter(target: Path, out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from eyas.layers import default_aux_layers
    from eyas.train.export import export_drafter
    from eyas.train.model import Drafter, DrafterConfig
    from eyas.train.vocab import DraftVocab

    config = json.loads((target / "config.json").read_text())
    embed_VH = AutoModelForCausalLM.from_pretrained(target).get_input_embeddings().weight
    size = min(config["vocab_size"], 2048)
    torch.manual_seed(0)
    drafter = Drafter(DrafterConfig.from_target(config, size), embed_VH)
    return export_drafter(out, drafter, DraftVocab(torch.arange(size), config["vocab_size"]),
                          default_aux_layers(config["num_hidden_layers"]), target_config=config)


def test_serving_benchmark_with_sglang_on_the_gpu(tmp_path, tiny_target):
    python = os.environ.get("EYAS_SGLANG_PYTHON")
    if not python:
        pytest.skip("set EYAS_SGLANG_PYTHON to a python whose environment has SGLang")
    from eyas.evaluate.serving import run_serving_benchmark
    from eyas.evaluate.serving_config import ServingConfig
    from eyas.proc import free_port
    from eyas.remote.hosts import HostSpec, LocalHost
    from eyas.train.tiny_data import tiny_records, write_jsonl

    drafter = Path(os.environ.get("EYAS_SERVING_DRAFTER")
                   or _untrained_drafter(tiny_target, tmp_path / "drafter"))
    # Merged records (token ids) and MT-Bench-style messages, which the load generator renders
    # with the tiny target's chat template: both reach SGLang's /generate as ids.
    prompts = write_jsonl(tmp_path / "merged" / "eval.jsonl",
                          tiny_records(tiny_target, 6, heldout=True) + [
                              {"id": f"mt-{i}", "messages": [{"role": "user", "content": q}]}
                              for i, q in enumerate(["Name three colours.", "What is 2 + 3?"])])
    host = LocalHost(HostSpec(kind="local", known_hosts=None, data_root=str(tmp_path / "data"),
                              python=sys.executable))
    cfg = ServingConfig(batch_sizes=[1, 8], num_steps=[3], num_prompts=16, warmup_requests=2,
                        max_tokens=256, port=free_port(), sglang_python=python,
                        eyas_python=sys.executable, startup_timeout_s=600,
                        extra_server_args=shlex.split(os.environ.get("EYAS_SERVING_EXTRA_ARGS", "")))
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    result = run_serving_benchmark(host, cfg, model_path=str(tiny_target),
                                   draft_model_path=str(drafter), prompts_path=str(prompts),
                                   say=say)
    print(json.dumps(result.to_dict(), indent=2, default=str))
    assert (cfg.repeats, cfg.flush_cache, cfg.ngram) == (3, True, True)  # the defaults
    assert [(r["mode"], r["batch_size"]) for r in result.rows] == [
        ("baseline", 1), ("baseline", 8), ("ngram", 1), ("ngram", 8), ("eagle3", 1),
        ("eagle3", 8)]
    assert "--speculative-algorithm NGRAM" in result.servers[1].command
    assert all(r["output_tok_s"] > 0 and r["repeats"] == 3 for r in result.rows)
    assert all(r["decode_tok_s"] > 0 and r["ttft_s"] > 0 for r in result.rows)
    assert all(r["accept_length"] >= 1.0 for r in result.rows if r["mode"] != "baseline")
    # SGLang's /flush_cache answered 200 before every measured run.
    assert all(len(s.results) == 6 and all(x["cache_flushed"] for x in s.results)
               for s in result.servers)
    assert sum(line.startswith("GPUs [0] free") for line in lines) == 3
    costs = result.draft_cost_measured
    assert costs["target_step_ms"] > 0 and costs["verify_ms"] > 0
    assert "n-gram" in costs["method"]
    assert not result.warnings, result.warnings
    from eyas.evaluate.accept_check import accept_check

    check = accept_check({"draft_tokens": 3, "mode": "greedy", "acceptance_length": None,
                          "simulated": {"available": False}, "serving": result.to_dict()})
    assert check["available"] and check["served"] >= 1.0
    assert sum(line.startswith("stopped job sglang-") for line in lines) == 3
