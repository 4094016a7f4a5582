"""Serve eyas flows as Prefect deployments, so runs can be triggered from the UI or on a schedule.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.serve \\
        --config recipes/tiny-demo.yaml --workdir runs/tiny-demo [--cron "0 3 * * *"]

The process stays up and executes the runs it is given (Ctrl-C stops it). Each deployment's
default parameters are the config and workdir given here; the UI can override them per run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.evaluate import evaluate_drafter_flow
from flows.extract import extract_hidden_states
from flows.pipeline import run_pipeline
from flows.prepare import prepare_data
from flows.train import train_drafter_flow


def build_deployments(config: Path, workdir: Path, cron: str | None = None) -> list:
    """The deployments this module serves (also used by tests to check their parameters)."""
    params = {"config_path": str(config.resolve()), "workdir": str(workdir.resolve())}
    return [
        prepare_data.to_deployment(
            name="prepare-data", parameters=params, cron=cron, tags=["eyas", "data"],
            description="Phases 1-3: generate answers, tokenize, merge and shuffle.",
        ),
        run_pipeline.to_deployment(
            name="pipeline", parameters=params, tags=["eyas", "host"],
            description="Probe the host, merge while deleting old outputs, then (parameter "
                        "`then`) extract and train.",
        ),
        extract_hidden_states.to_deployment(
            name="extract", parameters=params, tags=["eyas", "gpu"],
            description="Phase 4: hidden states, one task per shard; `only_failed` retries "
                        "just the shards that failed.",
        ),
        train_drafter_flow.to_deployment(
            name="train", parameters=params, tags=["eyas", "gpu"],
            description="Phase 5: train the EAGLE-3 drafter and export it for SGLang.",
        ),
        evaluate_drafter_flow.to_deployment(
            name="evaluate", parameters=params, tags=["eyas", "gpu"],
            description="Phase 6: speculative decoding with the trained drafter on held-out "
                        "prompts beside two baselines; τ, tokens/s, predicted speedup, report.",
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    from prefect import serve

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--cron", default=None, help="schedule, e.g. '0 3 * * *' for a nightly rerun")
    args = parser.parse_args(argv)
    serve(*build_deployments(args.config, args.workdir, args.cron))


if __name__ == "__main__":
    main()
