"""Helpers of the serving-benchmark tests: a run folder with held-out prompts, a config that
starts the SGLang stand-in (``sglang_standin/``), a scan for left-over processes, and a driver
(``python serving_fixtures.py SPEC_JSON CFG_JSON RUN_DIR``) that runs the benchmark in a
process of its own, so that tests can interrupt or kill it mid-sweep."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import psutil

from eyas.evaluate.serving_config import ServingConfig

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "sglang_standin"
REPO = HERE.parents[1]  # not support.paths: this file also runs as a script
MAX_TOKENS = 24


def make_run(root: Path) -> dict[str, Any]:
    """Target and drafter folders (a config.json each) and a workdir whose merged split holds
    train and held-out records with distinct prompts (train ids start at 1000)."""
    model, drafter, merged = root / "target", root / "drafter-export", root / "run" / "merged"
    for d in (model, drafter, merged):
        d.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (drafter / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))

    def record(rid: str, start: int, n: int) -> dict:
        return {"id": rid, "input_ids": list(range(start, start + n + 4)),
                "loss_mask": [0] * n + [1] * 4}

    train = [record(f"t{i}", 1000 + 10 * i, 6) for i in range(4)]
    held = [record(f"e{i}", 10 * i, 5 + i) for i in range(3)]
    (merged / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (merged / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    return {"model": model, "drafter": drafter, "prompts": merged / "eval.jsonl",
            "held_out": held, "train": train, "requests": root / "requests.jsonl"}


def standin_config(run: dict[str, Any], port: int, **overrides: Any) -> ServingConfig:
    """A small sweep (batch 1 and 8, steps 3 and 5) against the stand-in on `port`."""
    # Steps of 30 ms (the stand-in's default is 10): on a loaded 2-core machine a batch of 8
    # then still has all its requests in flight at once, which the verdict's shape needs.
    env = {"PYTHONPATH": str(STANDIN), "EYAS_STANDIN_REQUESTS": str(run["requests"]),
           "EYAS_STANDIN_STEP_S": "0.03"}
    env.update(overrides.pop("env", {}))
    # One run per point and no n-gram server unless a test asks (the defaults, 3 runs and the
    # n-gram server, would make every sweep 4.5 times longer).
    fields = dict(batch_sizes=[1, 8], num_steps=[3, 5], eagle_topk=[1], num_prompts=8,
                  warmup_requests=1, max_tokens=MAX_TOKENS, port=port, repeats=1, ngram=False,
                  sglang_python=sys.executable, eyas_python=sys.executable, server_env=env,
                  startup_timeout_s=60, stop_grace_s=3, request_timeout_s=60, run_timeout_s=120)
    fields.update(overrides)
    return ServingConfig(**fields)


def leftovers(tag: str) -> list[psutil.Process]:
    """Live processes whose command line mentions `tag` (a test's own temp folder)."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and tag in " ".join(
                    proc.info["cmdline"] or []):
                out.append(proc)
        except psutil.Error:
            pass
    return [p for p in out if p.pid != os.getpid()]


def _drive(spec_json: str, cfg_json: str, run_dir: str) -> int:
    from eyas.evaluate.serving import run_serving_benchmark
    from eyas.remote.hosts import HostSpec, connect

    run = {"model": Path(run_dir) / "target", "drafter": Path(run_dir) / "drafter-export",
           "prompts": Path(run_dir) / "run" / "merged" / "eval.jsonl"}
    with connect(HostSpec.model_validate_json(spec_json)) as host:
        result = run_serving_benchmark(
            host, ServingConfig.model_validate_json(cfg_json), model_path=str(run["model"]),
            draft_model_path=str(run["drafter"]), prompts_path=str(run["prompts"]),
            say=lambda line: print(line, flush=True))
    print("VERDICT " + result.verdict, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_drive(*sys.argv[1:4]))
