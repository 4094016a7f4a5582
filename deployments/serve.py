"""Serve eyas flows as Prefect deployments: runs started from the UI's forms, or on schedules.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.serve \\
        --config recipes/tiny-demo.yaml --workdir runs/tiny-demo \\
        [--host-block gpu-8x] [--cron pipeline="0 3 * * *"] [--cron extract="30 * * * *"]

One process serves every deployment (one machine; for a team, ``prefect.yaml`` declares the
same deployments for a work pool and its workers). It registers the `GpuHost` block type, so
the UI lists saved hosts, then stays up and executes the runs it is given (Ctrl-C stops it).

Each deployment's run form is drawn from the flow's typed parameters: the whole
`PipelineConfig` (training steps, learning rate, the datasets and their ``regenerate``
switch, storage, ...) pre-filled from the recipe given here, the host (a list of saved
`GpuHost` blocks), and each flow's own choices as lists (phases, splits, training data).

Deployments: ``pipeline`` (the whole job), ``prepare-data``, ``preflight`` (the GPU host's
GO / NO-GO in minutes), ``extract``, ``train``, ``evaluate`` (each phase alone) and ``extract-retry-failed`` (only the shards that are not
complete). Failed shards are redone without a person: a failed ``extract`` run starts
``extract-retry-failed`` once, with its own parameters (a deployment trigger on the run's
Failed event); a failed ``pipeline`` run is retried by Prefect after `PIPELINE_RETRY_DELAY_S`
(flow retries: cached tasks hit, complete shards are skipped, the failed ones run again, then
what depends on them).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from eyas.config import load_config
from eyas.errors import ConfigError
from flows.evaluate import evaluate_drafter_flow
from flows.extract import extract_hidden_states
from flows.pipeline import run_pipeline
from flows.preflight import preflight_flow
from flows.prepare import prepare_data
from flows.train import train_drafter_flow

AUTO_RETRY_TAG = "eyas-auto-retry"
"""Flow runs of deployments with this tag start ``extract-retry-failed`` when they fail."""
PIPELINE_RETRIES = 1
"""Times Prefect reruns a failed ``pipeline`` run by itself."""
PIPELINE_RETRY_DELAY_S = 300
"""Seconds before that rerun (a host that rebooted, a network that came back)."""

DEPLOYMENTS = ("pipeline", "prepare-data", "preflight", "extract", "extract-retry-failed", "train", "evaluate")
"""Deployment names, in the order they are served."""


retrying_pipeline = run_pipeline.with_options(retries=PIPELINE_RETRIES,
                                              retry_delay_seconds=PIPELINE_RETRY_DELAY_S)
"""The ``pipeline`` deployment's flow: `run_pipeline`, rerun by Prefect once after a failure
(the entry point ``deployments/serve.py:retrying_pipeline`` of ``prefect.yaml``)."""


def parse_crons(values: list[str] | None) -> dict[str, str]:
    """``--cron`` values as ``{deployment: cron expression}``: ``NAME=EXPR`` schedules that
    deployment; a bare ``EXPR`` schedules ``prepare-data`` (what ``--cron`` always did).
    Raises ConfigError for an unknown deployment name."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, expr = value.partition("=")
        if not sep:
            name, expr = "prepare-data", value
        name, expr = name.strip(), expr.strip()
        if name not in DEPLOYMENTS:
            raise ConfigError(f"no deployment {name!r}; choose from {list(DEPLOYMENTS)}",
                              where="--cron")
        out[name] = expr
    return out


def retry_trigger() -> Any:
    """The deployment trigger of ``extract-retry-failed``: a flow run tagged
    `AUTO_RETRY_TAG` failed; the retry runs with that run's config, workdir and host (each
    template a single expression, so the values keep their JSON types)."""
    from prefect.events import DeploymentEventTrigger

    return DeploymentEventTrigger(
        name="retry failed shards when a run fails",
        expect={"prefect.flow-run.Failed"},
        match_related={"prefect.resource.role": "tag",
                       "prefect.resource.id": f"prefect.tag.{AUTO_RETRY_TAG}"},
        parameters={"config": "{{ flow_run.parameters.config }}",
                    "workdir": "{{ flow_run.parameters.workdir }}",
                    "host_block": "{{ flow_run.parameters.host_block }}",
                    "only_failed": True},
    )


def build_deployments(config: Path, workdir: Path, cron: str | dict[str, str] | None = None,
                      host_block: str | None = None, auto_retry: bool = True) -> list:
    """The deployments this module serves (also used by tests to check their parameters).

    `cron`: ``{deployment: expression}`` (a bare string schedules ``prepare-data``).
    `host_block`: a saved `GpuHost` every deployment defaults to (changeable per run).
    `auto_retry`: failed runs are retried without a person (see the module docstring).
    """
    cfg = load_config(config)  # validated once; its paths resolved against the recipe
    crons = cron if isinstance(cron, dict) else parse_crons([cron] if cron else None)
    params: dict[str, Any] = {"config": cfg.model_dump(mode="json"),
                              "workdir": str(workdir.resolve())}
    if host_block:  # a reference to the saved block: the UI's host list shows it selected
        from blocks.gpu_host import GpuHost

        block_id = GpuHost.load(host_block)._block_document_id
        params["host_block"] = {"$ref": {"block_document_id": str(block_id)}}
    retry_tags = [AUTO_RETRY_TAG] if auto_retry else []

    def deployment(flow: Any, name: str, description: str, tags: list[str],
                   extra: dict[str, Any] | None = None, **kw: Any) -> Any:
        return flow.to_deployment(name=name, parameters={**params, **(extra or {})},
                                  cron=crons.get(name), tags=["eyas", *tags],
                                  description=description, **kw)

    pipeline = retrying_pipeline if auto_retry else run_pipeline
    return [
        deployment(pipeline, "pipeline",
                   "The whole job: generate, tokenize, merge (while deleting old outputs), "
                   "extract both splits, train, evaluate (and the serving benchmark on a GPU "
                   "host). Cached: a rerun does only what changed.", ["host"]),
        deployment(prepare_data, "prepare-data",
                   "Phases 1-3: generate answers, tokenize, merge and shuffle.", ["data"]),
        deployment(preflight_flow, "preflight",
                   "Minutes on the GPU host that prove every GPU piece before the long phases: "
                   "environment, disk, collectives, capture, training, serving; a go/no-go "
                   "table with each check's figure and fix, and the ETAs.", ["gpu"]),
        deployment(extract_hidden_states, "extract",
                   "Phase 4: hidden states, one task per shard, both splits at once.",
                   ["gpu", *retry_tags]),
        deployment(extract_hidden_states, "extract-retry-failed",
                   "Phase 4 for the shards that are not complete only (failed, missing, "
                   "corrupted); `shards` narrows it further. Starts by itself once when a "
                   "run of `extract` fails.",
                   ["gpu"], extra={"only_failed": True},
                   triggers=[retry_trigger()] if auto_retry else None),
        deployment(train_drafter_flow, "train",
                   "Phase 5: train the EAGLE-3 drafter and export it for SGLang.", ["gpu"]),
        deployment(evaluate_drafter_flow, "evaluate",
                   "Phase 6: speculative decoding with the trained drafter on held-out "
                   "prompts beside two baselines; τ, tokens/s, predicted speedup, report; the "
                   "serving benchmark on a GPU host when `evaluate.serving` is set.", ["gpu"]),
    ]


def main(argv: list[str] | None = None) -> None:
    from prefect import serve

    from blocks.gpu_host import register

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, required=True,
                        help="the recipe that pre-fills every run form")
    parser.add_argument("--workdir", type=Path, required=True, help="the run folder by default")
    parser.add_argument("--host-block", default=None,
                        help="a saved GpuHost every deployment uses by default")
    parser.add_argument("--cron", action="append", default=None, metavar="[NAME=]EXPR",
                        help="schedule deployment NAME (repeatable), e.g. pipeline='0 3 * * *' "
                             "for a nightly rerun; a bare EXPR schedules prepare-data")
    parser.add_argument("--no-auto-retry", action="store_true",
                        help="no automatic retry of failed runs (see above)")
    args = parser.parse_args(argv)
    register()
    serve(*build_deployments(args.config, args.workdir, parse_crons(args.cron),
                             host_block=args.host_block, auto_retry=not args.no_auto_retry))


if __name__ == "__main__":
    main()
