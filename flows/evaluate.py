"""The `evaluate-drafter` flow: phase 6, is the trained drafter worth serving?

    offline evaluation (real speculative decoding with the target and the drafter on held-out
    prompts, beside an untrained drafter and prompt lookup; on the host when one is given;
    cached while ``evaluate/`` holds for the same drafter, prompts and settings)
    -> serving benchmark on the GPU host (``evaluate.serving`` set and a host given: SGLang
       without and with the drafter at several batch sizes)
    -> report: the HTML page, a markdown artifact with its pictures, a table of τ per dataset,
       a link to the page.

`eyas evaluate` runs this flow; ``deployments/serve.py`` serves it as the ``evaluate``
deployment. `evaluate_stage` is the same stage inside the `eyas-pipeline` flow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from blocks.gpu_host import GpuHost
from eyas.config import PipelineConfig
from eyas.remote.hosts import HostSpec
from tasks.artifacts import artifact_key
from tasks.evaluate import evaluate_task, evaluation_report_task
from tasks.hosts import resolve_run
from tasks.jobs import cancel_remote_jobs


@flow(name="evaluate-drafter", log_prints=True, on_cancellation=[cancel_remote_jobs])
def evaluate_drafter_flow(
    config: PipelineConfig,
    workdir: str,
    host_block: GpuHost | None = None,
) -> dict[str, Any]:
    """Evaluate the run's drafter (``<workdir>/drafter/export`` unless ``evaluate.drafter``)
    into ``<workdir>/evaluate/``.

    Args:
        config: the pipeline configuration (its ``evaluate`` section, the target, ``extract``
            layers); a recipe's path is loaded here.
        workdir: the run's folder -- on the host when `host_block` is given.
        host_block: a saved ``GpuHost`` block (picked in the UI, or its name); the evaluator then runs there as a
            detached job (``python -m eyas.evaluate.run``) with its log streamed here, and the
            serving benchmark runs there when ``evaluate.serving`` is set. None: this machine.

    Returns the headline figures: ``acceptance_length`` (τ, bonus token counted),
    ``baselines``, ``tokens_per_s``, ``predicted_speedup``, ``lossless``, the simulated τ of
    training and whether the gap is flagged, plus ``report`` / ``html`` (paths), ``host`` and
    ``serving_verdict``. Raises DataError when the drafter or the held-out prompts are missing.
    """
    workdir, host = resolve_run(workdir, host_block, config.gpu_env)
    return evaluate_stage(config, workdir, host)


def evaluate_stage(cfg: PipelineConfig, workdir: str, host: HostSpec | None,
                   wait_for: list[Any] | None = None) -> dict[str, Any]:
    """Phase 6 inside the running flow: the offline evaluation, the serving benchmark (with a
    GPU host and ``evaluate.serving``), the report."""
    from eyas.evaluate.run import headline
    from eyas.layout import RunLayout

    logger = get_run_logger()
    key = artifact_key("evaluate", cfg.name)
    report = evaluate_task.submit(cfg, workdir, host, wait_for=wait_for or []).result()

    # ---- SERVING BENCHMARK --------------------------------------------------------------------
    serving = None
    if host is not None and cfg.evaluate.serving is not None:
        serving = serving_stage(cfg, workdir, host)
    elif cfg.evaluate.serving is not None:
        logger.info("evaluate.serving is set but no GPU host is given: no serving benchmark "
                    "(SGLang needs the host's GPUs)")
    # --------------------------------------------------------------------------------------------

    published = evaluation_report_task(report, workdir, cfg.name, key, host, serving=serving)
    result = headline(published["report"])
    out = RunLayout(Path(workdir)).evaluate_dir
    result.update(report=str(out / "report.json"), html=published["html"],
                  host=host.login if host else "local", mode=report["mode"],
                  draft_tokens=report["draft_tokens"],
                  serving_verdict=(published["report"].get("serving") or {}).get("verdict"))
    logger.info("drafter τ %s (baselines %s), predicted speedup %s; report %s",
                result["acceptance_length"], result["baselines"], result["predicted_speedup"],
                result["html"])
    return result


def serving_stage(cfg: PipelineConfig, workdir: str, host: HostSpec) -> dict[str, Any]:
    """The serving benchmark on `host` (`tasks.serving.serving_benchmark_task`) with the run's
    target, drafter (``evaluate.drafter`` when set) and held-out prompts, unless
    ``evaluate.serving`` names others."""
    from tasks.evaluate import drafter_path
    from tasks.extract import target_path
    from tasks.serving import serving_benchmark_task

    scfg = cfg.evaluate.serving
    model, draft, prompts = scfg.host_paths(workdir, target_path(cfg, host))
    if scfg.draft_model_path is None:
        draft = drafter_path(cfg, workdir, host)
    return serving_benchmark_task(host, scfg, model, draft, prompts,
                                  trust_remote_code=cfg.target.trust_remote_code)
