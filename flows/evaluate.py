"""The `evaluate-drafter` flow: phase 6, is the trained drafter worth serving?

    offline evaluation (real speculative decoding with the target and the drafter on held-out
    prompts, beside an untrained drafter and prompt lookup; on the host when one is given;
    cached while ``evaluate/`` holds for the same drafter, prompts and settings; skipped
    with ``evaluate.offline: auto`` when the target cannot fit the evaluating device)
    -> serving benchmark on the GPU host (``evaluate.serving`` set and a host given: SGLang
       without and with the drafter at several batch sizes)
    -> report: the HTML page, a markdown artifact with its pictures, a table of τ per dataset,
       a link to the page
    -> the drafter folder's model card (``README.md``: target, data, training, τ per dataset,
       the serving verdict, the SGLang command that serves it).

`eyas evaluate` runs this flow; ``deployments/serve.py`` serves it as the ``evaluate``
deployment. `evaluate_stage` is the same stage inside the `eyas-pipeline` flow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from blocks.gpu_host import GpuHost
from eyas import stopping
from eyas.config import PipelineConfig
from eyas.errors import ConfigError
from eyas.remote.hosts import HostSpec
from tasks.artifacts import artifact_key
from tasks.evaluate import (
    evaluate_task,
    evaluation_report_task,
    model_card_task,
    offline_plan,
    write_serving_only_report,
)
from tasks.hosts import resolve_run, run_lock
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
    ``acceptance_length_ci95``, ``baselines``, ``tokens_per_s``, ``speedup_this_device``,
    ``predicted_speedup`` (serving; None unless the serving benchmark measured the engine's
    costs) with ``predicted_speedup_note``, ``lossless``, the simulated τ of
    training and whether the gap is flagged, ``offline`` ("ran" or "not run: <reason>"),
    SGLang's accept length and whether its gap is flagged, plus ``report`` / ``html`` /
    ``model_card`` (paths), ``host`` and ``serving_verdict``. Raises DataError when the drafter
    or the held-out prompts are missing, ConfigError when neither the offline evaluation nor
    the serving benchmark can run.
    """
    stopping.watch()  # a deployment's run: a cancel's SIGTERM reaches the tasks
    workdir, host = resolve_run(workdir, host_block, config.gpu_env)
    with run_lock(workdir, host, "evaluate-drafter"):
        return evaluate_stage(config, workdir, host)


def evaluate_stage(cfg: PipelineConfig, workdir: str, host: HostSpec | None,
                   wait_for: list[Any] | None = None) -> dict[str, Any]:
    """Phase 6 inside the running flow: the offline evaluation (unless ``evaluate.offline``
    skips it), the serving benchmark (with a GPU host and ``evaluate.serving``), the report.
    Raises ConfigError when neither can run."""
    from eyas.evaluate.run import headline
    from eyas.layout import RunLayout

    logger = get_run_logger()
    key = artifact_key("evaluate", cfg.name)
    serves = host is not None and cfg.evaluate.serving is not None

    # ---- OFFLINE EVALUATION (unless the target cannot fit the evaluating device) -------------
    plan = offline_plan(cfg, host)
    logger.info("%s", plan.reason)
    if plan.run:
        report = evaluate_task.submit(cfg, workdir, host, wait_for=wait_for or []).result()
    elif not serves:
        raise ConfigError(
            f"nothing to evaluate: the offline evaluator does not run ({plan.reason}) and "
            + ("evaluate.serving is not set" if host is not None else
               "the serving benchmark needs a GPU host (--host-block)")
            + "; set evaluate.serving and give a GPU host, or evaluate.offline: true",
            where="evaluate.offline")
    else:
        if wait_for:
            from prefect.futures import wait

            wait(wait_for)
        report = write_serving_only_report(cfg, workdir, host, plan.to_dict())

    # ---- SERVING BENCHMARK --------------------------------------------------------------------
    serving = None
    if serves:
        serving = serving_stage(cfg, workdir, host)
    elif cfg.evaluate.serving is not None:
        logger.info("evaluate.serving is set but no GPU host is given: no serving benchmark "
                    "(SGLang needs the host's GPUs)")
    # --------------------------------------------------------------------------------------------

    published = evaluation_report_task(report, workdir, cfg.name, key, host, serving=serving)
    card = model_card_task(cfg, workdir, host, published["report"])
    result = headline(published["report"])
    result.update(report=str(RunLayout(Path(workdir)).report), html=published["html"],
                  host=host.login if host else "local", mode=report["mode"],
                  draft_tokens=report["draft_tokens"],
                  serving_verdict=(published["report"].get("serving") or {}).get("verdict"),
                  model_card=card)
    if plan.run:
        logger.info("drafter τ %s (95%% %s; baselines %s); speedup on this device %s; "
                    "serving speedup %s; report %s", result["acceptance_length"],
                    result["acceptance_length_ci95"], result["baselines"],
                    result["speedup_this_device"],
                    result["predicted_speedup"] if result["predicted_speedup"] is not None
                    else result["predicted_speedup_note"], result["html"])
    else:
        logger.info("offline evaluation %s; serving: %s; report %s", result["offline"],
                    result["serving_verdict"], result["html"])
    if result["accept_check_flagged"]:
        logger.warning("%s", result["accept_check_note"])
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
