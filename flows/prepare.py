"""The `prepare-data` flow: phases 1-3 (generate → tokenize → merge/shuffle).

Datasets run concurrently (a bounded thread pool); each dataset's tokenization waits
for its own generation only; the merge waits for every dataset. Tasks whose output still
holds for unchanged inputs, settings and code come back Cached (`tasks.caching`); one that
finds its output complete by its manifest comes back "Skipped". `datasets_stage` is the same
stage inside the `eyas-pipeline` flow.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner

from eyas import stopping
from eyas.config import PipelineConfig
from eyas.errors import EyasError
from eyas.layout import RunLayout
from eyas.prepare.phases import generation_done
from tasks.hosts import run_lock
from tasks.prepare import generate_task, merge_task, resolve_target_task, tokenize_task
from tasks.report import publish_prepare_report

PreparePhase = Literal["generate", "tokenize", "merge"]
"""A data-preparation phase (1, 2, 3)."""
PHASES: tuple[str, ...] = ("generate", "tokenize", "merge")


@flow(name="prepare-data", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True)
def prepare_data(config: PipelineConfig, workdir: str,
                 phases: list[PreparePhase] | None = None) -> dict[str, Any]:
    """Run phases 1-3 of a pipeline config into `workdir`.

    Args:
        config: the pipeline configuration (see ``recipes/``); a recipe's path is loaded here.
        workdir: the run's folder; outputs go to ``generated/``, ``prepared/``, ``merged/``.
        phases: a subset of ``generate``, ``tokenize``, ``merge`` (default: all three).

    Returns the merge statistics (or, without the merge, the per-dataset statistics).
    """
    stopping.watch()  # a deployment's run: a cancel's SIGTERM reaches the tasks
    phases = list(phases or PHASES)
    workdir = str(Path(workdir).resolve())
    with run_lock(workdir, None, "prepare-data"):
        tokenized = datasets_stage(config, workdir, phases)
        merge_stats = None
        if "merge" in phases:
            merge_stats = merge_task.submit(config, workdir).result()
        if tokenized:
            publish_prepare_report(config.name, tokenized, merge_stats, Path(workdir),
                                   cut_answers_policy=config.tokenize.cut_answers)
        return merge_stats if merge_stats is not None else tokenized


def datasets_stage(cfg: PipelineConfig, workdir: str, phases: list[str],
                   wait_for: list[Any] | None = None) -> dict[str, dict]:
    """Phases 1-2 inside the running flow, on this machine: every dataset at once, each
    tokenization after its own generation. A `transformers serve` of the target runs while
    answers are still missing (``generation.launch_server``).

    Returns ``{dataset: tokenize statistics}``; raises EyasError naming every dataset that
    failed, once the others have finished.
    """
    logger = get_run_logger()
    target_dir = resolve_target_task.submit(cfg, wait_for=wait_for or []).result()
    layout = RunLayout(Path(workdir))
    regenerated = [d.name for d in cfg.datasets if d.regenerate] if "generate" in phases else []
    model = ""
    if regenerated:
        model = cfg.generation.model or _served_name(target_dir, cfg.generation.launch_server)
    # A server is needed only for datasets whose answers are not all there yet.
    missing = [n for n in regenerated if not generation_done(cfg, layout, n, model=model)]
    server: contextlib.AbstractContextManager[str]
    if missing and cfg.generation.launch_server:
        from eyas.serve import launch_server

        server = launch_server(
            Path(target_dir), log_path=Path(workdir) / "logs" / "server.log",
            trust_remote_code=cfg.target.trust_remote_code,
            dtype=cfg.generation.server_dtype,
            continuous_batching=cfg.generation.server_continuous_batching,
        )
    elif missing:
        if not cfg.generation.base_url:
            raise EyasError("generation.base_url is not set (or set generation.launch_server: true)")
        server = contextlib.nullcontext(cfg.generation.base_url)
    else:
        server = contextlib.nullcontext(cfg.generation.base_url or "")
    if regenerated and not missing:
        logger.info("generation: every answer is already there (%s)", ", ".join(regenerated))

    gen_futures: dict[str, Any] = {}
    tok_futures: dict[str, Any] = {}
    with server as base_url:
        for name in regenerated:
            gen_futures[name] = generate_task.submit(cfg, workdir, name, base_url, model)
        if "tokenize" in phases:
            for ds in cfg.datasets:
                tok_futures[ds.name] = tokenize_task.submit(
                    cfg, workdir, ds.name, target_dir,
                    wait_for=[gen_futures[ds.name]] if ds.name in gen_futures else [])
        # The server must outlive every generation request.
        wait(list(gen_futures.values()))
    wait(list(tok_futures.values()))
    failed = [
        f"{phase} {name}: {fut.state.message or fut.state.name}"
        for phase, futs in (("generate", gen_futures), ("tokenize", tok_futures))
        for name, fut in futs.items()
        if not fut.state.is_completed()
    ]
    if failed:
        for line in failed:
            logger.error(line)
        raise EyasError(
            f"{len(failed)} dataset phase(s) failed; rerun the flow to retry only those "
            "(finished work is skipped):\n  " + "\n  ".join(failed)
        )
    return {n: f.result() for n, f in tok_futures.items()}


def _served_name(target_dir: str, launched: bool) -> str:
    if launched:
        from eyas.serve import served_model_name

        return served_model_name(Path(target_dir))
    return target_dir
