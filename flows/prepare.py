"""The `prepare-data` flow: phases 1-3 (generate → tokenize → merge/shuffle).

Datasets run concurrently (a bounded thread pool); each dataset's tokenization waits
for its own generation only; the merge waits for every dataset. Tasks whose inputs and
settings are unchanged and whose outputs still verify come back Cached.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner

from eyas.config import load_config
from eyas.errors import EyasError
from eyas.layout import RunLayout
from eyas.manifest import is_up_to_date
from eyas.prepare.phases import generation_done
from tasks.prepare import (
    generate_task,
    merge_task,
    phase_inputs,
    resolve_target_task,
    tokenize_task,
)
from tasks.report import publish_prepare_report

PHASES = ("generate", "tokenize", "merge")


def _fresh(task_name: str, config_path: str, workdir: str, name: str | None, folder: Path) -> bool:
    """Whether `folder` already holds this phase's output for these inputs (may use the cache)."""
    try:
        inputs, settings = phase_inputs(task_name, config_path, workdir, name)
        return is_up_to_date(folder, inputs, settings)
    except (OSError, EyasError):
        return False


@flow(name="prepare-data", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=True)
def prepare_data(config_path: str, workdir: str, phases: list[str] | None = None) -> dict[str, Any]:
    """Run phases 1-3 of a pipeline config into `workdir`.

    Args:
        config_path: the pipeline YAML (see ``recipes/``).
        workdir: the run's folder; outputs go to ``generated/``, ``prepared/``, ``merged/``.
        phases: a subset of ``generate``, ``tokenize``, ``merge`` (default: all three).

    Returns the merge statistics (or, without the merge, the per-dataset statistics).
    """
    logger = get_run_logger()
    phases = list(phases or PHASES)
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise ValueError(f"unknown phases {unknown}; choose from {list(PHASES)}")
    config_path = str(Path(config_path).resolve())
    workdir = str(Path(workdir).resolve())
    cfg = load_config(config_path)
    layout = RunLayout(Path(workdir))
    target_dir = resolve_target_task(config_path)

    # Phase 1 needs a server only for datasets that are regenerated and not already done.
    model = cfg.generation.model or _served_name(target_dir, cfg.generation.launch_server)
    generating = [
        d.name for d in cfg.datasets
        if d.regenerate and "generate" in phases
        and not generation_done(cfg, layout, d.name, model=model)
    ]
    for d in cfg.datasets:
        if d.regenerate and "generate" in phases and d.name not in generating:
            logger.info("generate %s: already complete, skipped", d.name)
    gen_futures: dict[str, Any] = {}
    server: contextlib.AbstractContextManager[str]
    if generating and cfg.generation.launch_server:
        from eyas.serve import launch_server

        server = launch_server(
            Path(target_dir), log_path=Path(workdir) / "logs" / "server.log",
            trust_remote_code=cfg.target.trust_remote_code,
        )
    elif generating:
        if not cfg.generation.base_url:
            raise EyasError("generation.base_url is not set (or set generation.launch_server: true)")
        server = contextlib.nullcontext(cfg.generation.base_url)
    else:
        server = contextlib.nullcontext("")

    tok_futures: dict[str, Any] = {}
    with server as base_url:
        for name in generating:
            gen_futures[name] = generate_task.submit(config_path, workdir, name, base_url, model)
        if "tokenize" in phases:
            for ds in cfg.datasets:
                fresh = _fresh("tokenize", config_path, workdir, ds.name, layout.prepared_dir(ds.name))
                tok_futures[ds.name] = tokenize_task.with_options(refresh_cache=not fresh).submit(
                    config_path, workdir, ds.name, target_dir,
                    wait_for=[gen_futures[ds.name]] if ds.name in gen_futures else [],
                )
        # The server must outlive every generation request.
        wait(list(gen_futures.values()))

    wait(list(tok_futures.values()))
    failed = [
        f"{phase} {name}: {fut.state.message or fut.state.name}"
        for phase, futs in (("generate", gen_futures), ("tokenize", tok_futures))
        for name, fut in futs.items()
        if not fut.state.is_completed()
    ]
    tokenized = {n: f.result() for n, f in tok_futures.items() if f.state.is_completed()}
    if failed:
        for line in failed:
            logger.error(line)
        raise EyasError(
            f"{len(failed)} dataset phase(s) failed; rerun the flow to retry only those "
            "(finished work is skipped):\n  " + "\n  ".join(failed)
        )

    merge_stats = None
    if "merge" in phases:
        fresh = _fresh("merge", config_path, workdir, None, layout.merged_dir)
        merge_stats = merge_task.with_options(refresh_cache=not fresh).submit(config_path, workdir).result()
    if tokenized:
        publish_prepare_report(cfg.name, tokenized, merge_stats, Path(workdir),
                               cut_answers_policy=cfg.tokenize.cut_answers)
    return merge_stats if merge_stats is not None else tokenized


def _served_name(target_dir: str, launched: bool) -> str:
    if launched:
        from eyas.serve import served_model_name

        return served_model_name(Path(target_dir))
    return target_dir
