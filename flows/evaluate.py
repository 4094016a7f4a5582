"""The `evaluate-drafter` flow: phase 6, is the trained drafter worth serving?

    offline evaluation (real speculative decoding with the target and the drafter on held-out
    prompts, beside an untrained drafter and prompt lookup; on the host when one is given)
    -> [serving benchmark on the GPU host: marked below, not wired yet]
    -> report: the HTML page, a markdown artifact with its pictures, a table of τ per dataset,
       a link to the page.

`eyas evaluate` runs this flow; ``deployments/serve.py`` serves it as the ``evaluate``
deployment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from eyas.config import load_config
from tasks.artifacts import artifact_key
from tasks.evaluate import evaluate_task, evaluation_report_task
from tasks.hosts import resolve_run
from tasks.jobs import cancel_remote_jobs


@flow(name="evaluate-drafter", log_prints=True, on_cancellation=[cancel_remote_jobs])
def evaluate_drafter_flow(
    config_path: str,
    workdir: str,
    host_block: str | None = None,
) -> dict[str, Any]:
    """Evaluate the run's drafter (``<workdir>/drafter/export`` unless ``evaluate.drafter``)
    into ``<workdir>/evaluate/``.

    Args:
        config_path: the pipeline YAML (its ``evaluate`` section, the target, ``extract`` layers).
        workdir: the run's folder -- on the host when `host_block` is given.
        host_block: name of a saved ``GpuHost`` block; the evaluator then runs there as a
            detached job (``python -m eyas.evaluate.run``) with its log streamed here. None:
            this machine.

    Returns the headline figures: ``acceptance_length`` (τ, bonus token counted),
    ``baselines``, ``tokens_per_s``, ``predicted_speedup``, ``lossless``, the simulated τ of
    training and whether the gap is flagged, plus ``report`` / ``html`` (paths) and ``host``.
    Raises DataError when the drafter or the held-out prompts are missing.
    """
    from eyas.evaluate.run import headline
    from eyas.layout import RunLayout

    logger = get_run_logger()
    config_path, workdir, host = resolve_run(config_path, workdir, host_block)
    cfg = load_config(config_path)
    key = artifact_key("evaluate", cfg.name)
    report = evaluate_task(config_path, workdir, host)

    # ---- SERVING BENCHMARK --------------------------------------------------------------------
    # When a GPU host is configured (`host` is not None) and the config asks for it, the serving
    # benchmark task is called here: it launches SGLang on the host without and with the
    # drafter, drives load at several batch sizes and returns {"rows": [...], "verdict": str}
    # (rows: mode, batch_size, num_steps, eagle_topk, num_draft_tokens, output_tok_s,
    # accept_length). Pass that dict as `serving` below; the report draws it.
    serving = None
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
