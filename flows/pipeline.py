"""The `eyas-pipeline` flow: the whole job, from generation to the verdict, as one run.

    probe-status ─┬─ generate-<ds> ─ tokenize-<ds> ─┐  (every dataset at once)
                  │                  tokenize-<ds> ─┴─ merge ─┐
                  └─ clean (old outputs) ──────────────────────┴─ probe-status (disk re-read)
       ─ preflight (a GPU host given: GO / NO-GO, cached for the same host, recipe and code)
       ─ plan-extraction train ∥ eval ─ check-disk ─ extract shards (both splits at once,
         gated by the host's GPU slots; retried) ─ train-drafter ─ evaluate-drafter
         ─ serving-benchmark (a GPU host and `evaluate.serving`) ─ reports

Every dependency is an explicit ``wait_for`` or a result passed on. The deletion of an old
run's outputs touches paths disjoint from the run's, so it runs beside phases 1-3; the second
probe and the extraction's disk check see the disk as it is after it. Each phase still runs
alone (`eyas prepare / extract / train / evaluate`, the flows of the same stages).

Rerunning costs what changed: a task whose output still holds for the same inputs, settings
and code comes back Cached (`tasks.caching`), work its manifest calls done comes back
"Skipped" before it waits for a GPU slot; after one failed shard, a rerun extracts that shard
and redoes only what depends on it (training, evaluation).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.futures import wait
from prefect.task_runners import ThreadPoolTaskRunner

from blocks.gpu_host import GpuHost
from eyas import stopping
from eyas.config import PipelineConfig
from eyas.errors import EyasError
from flows.evaluate import evaluate_stage
from flows.extract import extract_splits, raise_failed_shards
from flows.preflight import preflight_stage
from flows.prepare import datasets_stage
from flows.train import TrainingData, train_stage
from tasks.artifacts import artifact_key
from tasks.hosts import host_spec, resolve_run, run_lock
from tasks.jobs import cancel_remote_jobs
from tasks.prepare import merge_task
from tasks.remote import clean_task, prepare_on_host_task, status_task
from tasks.report import publish_prepare_report

PipelinePhase = Literal["generate", "tokenize", "merge", "extract", "train", "evaluate"]
"""A phase of the whole job (the serving benchmark belongs to ``evaluate``)."""
PIPELINE_PHASES: tuple[str, ...] = ("generate", "tokenize", "merge", "extract", "train",
                                    "evaluate")


@flow(name="eyas-pipeline", task_runner=ThreadPoolTaskRunner(max_workers=16), log_prints=True,
      on_cancellation=[cancel_remote_jobs])
def run_pipeline(
    config: PipelineConfig,
    workdir: str,
    host_block: GpuHost | None = None,
    phases: list[PipelinePhase] | None = None,
    data: TrainingData = "offline",
    clean_paths: list[str] | None = None,
    confirm_clean: bool = False,
    data_root: str | None = None,
    preflight: bool = True,
) -> dict[str, Any]:
    """Run the whole job (or the `phases` chosen) of a pipeline config into `workdir`.

    Args:
        config: the pipeline configuration (see ``recipes/``); a recipe's path is loaded here.
        workdir: the run's folder (on the host when `host_block` is given).
        host_block: a saved `GpuHost` block; none means this machine. On a host, tokenization
            and the merge run there as detached jobs, and so do extraction, training and
            evaluation (generation is not run there: the answers must already be on the host).
        phases: the phases to run, in their order (default all): ``generate``, ``tokenize``,
            ``merge``, ``extract``, ``train``, ``evaluate`` (with the serving benchmark on a
            GPU host when ``evaluate.serving`` is set). A phase left out must be done already.
        data: what the drafter trains on: ``offline`` (extraction shards) or ``online`` (the
            merged data, the target in the training process; extraction is then not run).
        clean_paths: obsolete outputs to delete meanwhile, e.g. an old run's ``hidden/``
            (under the host's data root only; never the run's own folder).
        confirm_clean: really delete; without it the deletion is a dry run (its report says
            what would go).
        data_root: overrides the host's data root (the only place deletion may touch).
        preflight: with a GPU host and a GPU phase chosen, prove the host first
            (`flows.preflight`; after the merge, whose data it needs): a NO-GO stops the run
            before extraction. False, or ``preflight.enabled: false`` in the recipe, skips it.

    Returns each phase's result (``preflight``, ``prepare``, ``merge``, ``clean``, ``extract``,
    ``train``, ``evaluate``) and both status probes. Raises EyasError naming what failed.
    """
    stopping.watch()  # a deployment's run: a cancel's SIGTERM reaches the tasks
    logger = get_run_logger()
    chosen = [p for p in PIPELINE_PHASES if p in (phases or PIPELINE_PHASES)]
    cfg = config
    workdir, host = resolve_run(workdir, host_block, cfg.gpu_env)
    with run_lock(workdir, host, "eyas-pipeline"):
        spec = host_spec(host_block, data_root)
        timings: dict[str, float] = {}
        result: dict[str, Any] = {"phases": chosen}

        before = status_task.submit(spec, workdir, cfg)
        cleaning = (clean_task.submit(spec, list(clean_paths), [workdir], confirm_clean, cfg.name)
                    if clean_paths else None)

        # -- phases 1-3 ------------------------------------------------------------------------
        t0 = time.monotonic()
        if host is None and {"generate", "tokenize"} & set(chosen):
            result["prepare"] = datasets_stage(cfg, workdir, chosen, wait_for=[before])
        elif host is not None and "tokenize" in chosen:
            if "generate" in chosen and any(d.regenerate for d in cfg.datasets):
                logger.warning("generation is not run on a GPU host: the answers of %s must be in "
                               "%s/generated already", [d.name for d in cfg.datasets if d.regenerate],
                               workdir)
            futures = {d.name: prepare_on_host_task.submit(spec, "tokenize", cfg, workdir, [d.name],
                                                           wait_for=[before])
                       for d in cfg.datasets}
            result["prepare"] = _results(futures, "tokenize")
        merging = None
        if "merge" in chosen:
            merging = (merge_task.submit(cfg, workdir, wait_for=[before]) if host is None
                       else prepare_on_host_task.submit(spec, "merge", cfg, workdir,
                                                        wait_for=[before]))
        side = {k: f for k, f in (("merge", merging), ("clean", cleaning)) if f is not None}
        wait(list(side.values()))
        result.update(_results(side, "phase"))
        timings["generate / tokenize / merge"] = time.monotonic() - t0
        if host is None and result.get("prepare"):
            # The per-dataset statistics table and composition picture, as `prepare-data` shows.
            publish_prepare_report(cfg.name, result["prepare"], result.get("merge"), Path(workdir),
                                   cut_answers_policy=cfg.tokenize.cut_answers)

        # Free space is re-read once the old outputs are gone.
        after = status_task.submit(spec, workdir, cfg, wait_for=list(side.values())).result()
        result["status_before"], result["status_after"] = before.result(), after
        if before.result().get("fits") is False:
            logger.warning("before deletion, the next phase did not fit: %s",
                           before.result().get("refusal"))

        # -- preflight: minutes that prove the host before the days-long phases ------------------
        if (host is not None and preflight and cfg.preflight.enabled
                and {"extract", "train", "evaluate"} & set(chosen)):
            t0 = time.monotonic()
            try:
                result["preflight"] = preflight_stage(cfg, workdir, host)
            finally:
                timings["preflight"] = time.monotonic() - t0

        # -- phase 4 ---------------------------------------------------------------------------
        if "extract" in chosen and data == "offline":
            t0 = time.monotonic()
            result["extract"], failed = extract_splits(cfg, workdir, host)
            timings["extract"] = time.monotonic() - t0
            if failed:
                _publish(cfg, result, timings, failed=f"{len(failed)} shard(s) failed")
            raise_failed_shards(failed)
        elif "extract" in chosen:
            logger.info("training reads the merged data (data=online): no extraction")

        # -- phases 5-6 ------------------------------------------------------------------------
        for phase, stage in (("train", lambda: train_stage(cfg, workdir, host, data)),
                             ("evaluate", lambda: evaluate_stage(cfg, workdir, host))):
            if phase in chosen:
                t0 = time.monotonic()
                try:
                    result[phase] = stage()
                finally:
                    timings[phase] = time.monotonic() - t0
        _publish(cfg, result, timings)
        return result


def _results(futures: dict[str, Any], what: str) -> dict[str, Any]:
    """Each future's result, once all are done; EyasError naming every one that failed."""
    wait(list(futures.values()))
    failed = {k: f.state.message or f.state.name for k, f in futures.items()
              if not f.state.is_completed()}
    if failed:
        raise EyasError("; ".join(f"{what} {k} failed: {m}" for k, m in failed.items()))
    return {k: f.result() for k, f in futures.items()}


def _publish(cfg: PipelineConfig, result: dict[str, Any], timings: dict[str, float],
             failed: str | None = None) -> None:
    """The run's verdict as a markdown artifact ``pipeline-<run>``: each phase's time and
    outcome, the drafter's τ and the serving verdict."""
    lines = [f"# Pipeline {cfg.name}: {'FAILED, ' + failed if failed else 'done'}", "",
             "| phase | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:,.1f} |" for k, v in timings.items()]
    ev, tr = result.get("evaluate") or {}, result.get("train") or {}
    if result.get("preflight"):
        eta = result["preflight"].get("eta") or {}
        lines += ["", f"Preflight: GO; ETA extraction {eta.get('extract_s')} s, training "
                      f"{eta.get('train_s')} s (table `{artifact_key('preflight', cfg.name)}`)."]
    if tr:
        lines += ["", f"Training: {tr.get('status')} at step {tr.get('steps')}; simulated "
                      f"acceptance length {tr.get('simulated_acceptance_length')}; export "
                      f"`{tr.get('export')}`."]
    if ev:
        lines += ["", f"Evaluation: τ {ev.get('acceptance_length')} (95 % "
                      f"{ev.get('acceptance_length_ci95')}; baselines {ev.get('baselines')}), "
                      f"speedup on this device {ev.get('speedup_this_device')}, serving "
                      f"speedup {ev.get('predicted_speedup') or ev.get('predicted_speedup_note')}"
                      f"; report `{ev.get('html')}`."]
        if ev.get("serving_verdict"):
            lines += ["", f"Serving: {ev['serving_verdict']}"]
    create_markdown_artifact("\n".join(lines) + "\n", key=artifact_key("pipeline", cfg.name),
                             description=f"The whole job of {cfg.name}: phases and verdict")
