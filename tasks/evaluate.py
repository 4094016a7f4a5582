"""Prefect tasks for phase 6 (the offline evaluator): thin wrappers over `eyas.evaluate`.

`evaluate_task` runs the evaluator where the run's folder is, here or on a GPU host, as one
detached job (``python -m eyas.evaluate.run ...`` with that host's eyas python; here in
``<workdir>/.eyas/jobs``) whose log streams into the Prefect logger: the same command on both.
It holds one GPU slot of its host. `evaluation_report_task` turns the report into the run's
artifacts and the self-contained HTML page.

Inputs under the workdir (`RunLayout`): the exported drafter ``drafter/export`` (or
``evaluate.drafter``), the held-out prompts ``merged/eval.jsonl`` (and ``evaluate.prompt_files``),
``merged/train.jsonl`` (whose prompts are left out). Outputs: ``evaluate/``.

Caching (`tasks.caching`): `evaluate_task` is keyed by its source, the evaluation settings and
the checksums of the drafter, the prompts and the target's config, and hits only while
``evaluate/``'s manifest verifies and ``evaluate/evaluated_from.json`` records that very key's
inputs and settings.
"""

from __future__ import annotations

import base64
import json
import shlex
import tempfile
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.cache_policies import NO_CACHE

from eyas.config import PipelineConfig
from eyas.errors import ConfigError, RemoteError
from eyas.evaluate.job import EvaluateJob, drafter_of
from eyas.layout import RunLayout
from eyas.remote.hosts import HostSpec
from tasks.caching import Output, VerifiedOutput, check, skipped, stamp
from tasks.extract import target_path
from tasks.hosts import eyas_python, open_host
from tasks.jobs import flow_job_id
from tasks.limits import host_slot
from tasks.retries import USER_ERRORS, retry_unless


def drafter_path(cfg: PipelineConfig, workdir: str, host: HostSpec | None) -> str:
    """The drafter folder (`eyas.evaluate.job.drafter_of`) as the machine evaluating reads it."""
    return drafter_of(cfg, workdir, local=host is None)


def evaluation_job(cfg: PipelineConfig, workdir: str, host: HostSpec | None) -> EvaluateJob:
    """The run's evaluation (`eyas.evaluate.job.EvaluateJob`), here or on `host`."""
    return EvaluateJob.of(cfg, workdir, target_path(cfg, host), local=host is None)


# -- does the offline evaluator run? --------------------------------------------------------
def offline_plan(cfg: PipelineConfig, host: HostSpec | None) -> Any:
    """`eyas.evaluate.fit.OfflinePlan` for ``evaluate.offline``: with "auto", the target's size
    (read where it lives: here, or on the host with the host's eyas python) against the
    evaluating device's memory (torch here; nvidia-smi on an SSH host)."""
    from eyas.evaluate.fit import OfflinePlan, facts, plan_offline

    ecfg = cfg.evaluate
    kw = dict(device=ecfg.device, dtype=ecfg.dtype)
    if ecfg.offline != "auto":
        return plan_offline(ecfg.offline, {}, torch_here=True, **kw)
    model = target_path(cfg, host)
    cmd = f"{shlex.quote(eyas_python(host))} -m eyas.evaluate.fit {shlex.quote(model)} --nvidia-smi"
    with open_host(host) as h:
        try:
            found = h.call(lambda: facts(model), cmd, what="reading the target's size",
                           timeout=300)
        except (RemoteError, ValueError) as exc:  # a host's failure, or no JSON line
            return OfflinePlan(True, f"evaluate.offline auto: could not read the target's "
                               f"size{h.on} ({str(exc)[-200:]}); evaluating", "auto")
        return plan_offline("auto", found, torch_here=h.spec.kind == "local", **kw)


def write_serving_only_report(cfg: PipelineConfig, workdir: str, host: HostSpec,
                              plan: dict[str, Any]) -> dict[str, Any]:
    """``evaluate/report.json`` without offline figures (`eyas.evaluate.run.serving_only_report`)
    in the run's folder on `host` (the serving benchmark's; ``kind: local`` too); an earlier
    offline evaluation's stamp and manifest go, so that it is never taken for one. The serving
    rows attach there later (`evaluation_report_task`, which writes the manifest)."""
    from eyas.evaluate.run import REPORT, serving_only_report
    from eyas.manifest import MANIFEST_NAME
    from eyas.remote.hosts import connect

    out = evaluate_output(cfg, workdir, host)
    model, drafter = target_path(cfg, host), drafter_path(cfg, workdir, host)
    extra = {"run": cfg.name}

    with connect(host) as h:
        manifest = f"{drafter}/manifest.json"
        metrics = ((json.loads(h.read_text(manifest)).get("counts") or {}).get("metrics")
                   if h.exists(manifest) else None)
        report = serving_only_report(cfg.evaluate, plan, model=model, drafter=drafter,
                                     drafter_metrics=metrics or None, extra=extra)
        h.run(f"rm -f -- {shlex.quote(out.stamp)} {shlex.quote(f'{out.folder}/{MANIFEST_NAME}')}")
        h.write_text(f"{out.folder}/{REPORT}", json.dumps(report, indent=2))
    return report


# -- what an evaluation is made of ------------------------------------------------------------
def evaluate_output(cfg: PipelineConfig, workdir: str, host: HostSpec | None = None, *,
                    job: EvaluateJob | None = None) -> Output:
    """The evaluation's output for the cache: ``evaluate/``, from the drafter's weights and
    config, the held-out prompts (merged eval split, prompt files; built-in demo files count as
    part of eyas), the training split whose prompts are left out and the target's config, with
    the evaluation settings; its stamp ``evaluate/evaluated_from.json``. `job`: the run's
    `evaluation_job` when the caller has built it already."""
    from eyas.prepare.phases import DEMO_PREFIX

    layout = RunLayout(Path(workdir))
    job = job or evaluation_job(cfg, workdir, host)
    inputs = {"drafter/config.json": f"{job.drafter}/config.json",
              "drafter/weights": f"{job.drafter}/*.safetensors",
              "target_config": f"{job.model}/config.json",
              "train": str(layout.train)}
    if cfg.evaluate.merged_eval:
        inputs["eval"] = str(layout.eval)
    for i, (named, found) in enumerate(zip(cfg.evaluate.prompt_files, job.cfg.prompt_files,
                                                  strict=True)):
        if not named.startswith(DEMO_PREFIX):
            inputs[f"prompt_file_{i}"] = found
    if job.chat_template:
        inputs["chat_template"] = job.chat_template
    # `offline` decides whether the evaluator runs, not what it measures: not a setting of it.
    settings = {"evaluate": cfg.evaluate.model_dump(mode="json", exclude={"serving", "offline"}),
                "aux_layers": cfg.extract.aux_layers, "prompt_files": cfg.evaluate.prompt_files,
                "trust_remote_code": cfg.target.trust_remote_code}
    return Output(str(layout.evaluate_dir), inputs, settings, host=host,
                  stamp=str(layout.evaluated_from))


def _read_report(cfg: PipelineConfig, folder: str, host: HostSpec | None) -> dict[str, Any]:
    """``report.json`` of `folder` (`_in_recipe_order`)."""
    with open_host(host) as h:
        return _in_recipe_order(cfg, json.loads(h.read_text(f"{folder}/report.json")))


def _in_recipe_order(cfg: PipelineConfig, report: dict[str, Any]) -> dict[str, Any]:
    """`report` with its baselines in the recipe's order (the file's keys are sorted), as the
    artifacts and the model card list them."""
    order = {m: i for i, m in enumerate(cfg.evaluate.baselines)}
    report["baselines"] = dict(sorted((report.get("baselines") or {}).items(),
                                      key=lambda kv: order.get(kv[0], len(order))))
    return report


def _evaluate_output_or_none(params: dict[str, Any]) -> Output | None:
    try:
        return evaluate_output(params["cfg"], params["workdir"], params.get("host"))
    except (OSError, ConfigError):
        return None  # a missing prompt file: the task runs and says so


# -- tasks ----------------------------------------------------------------------------------
@task(name="evaluate-drafter", task_run_name="evaluate-drafter", retries=1,
      retry_delay_seconds=[30], retry_jitter_factor=0.5,
      retry_condition_fn=retry_unless(*USER_ERRORS), persist_result=True,
      cache_policy=VerifiedOutput(output=_evaluate_output_or_none))
def evaluate_task(cfg: PipelineConfig, workdir: str, host: HostSpec | None = None) -> Any:
    """Speculative decoding of the run's trained drafter against the target on held-out
    prompts, with the baselines; returns ``report.json``'s content (written to
    ``<workdir>/evaluate/``, on the host when remote), as a "Skipped" state when that folder
    already holds the evaluation of these inputs and settings. Raises DataError when the
    drafter or the prompts are missing."""
    logger = get_run_logger()
    job = evaluation_job(cfg, workdir, host)
    out = evaluate_output(cfg, workdir, host, job=job)
    if not check(out)["problems"]:  # evaluated already, with these very inputs and settings
        return skipped(_read_report(cfg, out.folder, host),
                       f"{out.folder}: evaluated already (manifest and inputs verify)")
    spec = host or HostSpec(kind="local", known_hosts=None, data_root="/")
    with host_slot(spec, gpu=True), open_host(host) as h:
        report = _in_recipe_order(cfg, job.run(h, say=lambda line: logger.info("%s", line),
                                               job_id=flow_job_id))
    stamp(out)
    logger.info("τ %.3f (95%% %s) with %d draft tokens; baselines %s; speedup on this device "
                "predicted %s, measured %s", report["acceptance_length"] or 0.0,
                report.get("acceptance_length_ci95"), report["draft_tokens"],
                {m: s["acceptance_length"] for m, s in report["baselines"].items()},
                report.get("predicted_speedup_this_device"), report.get("speedup_measured"))
    return report


def dataset_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One table row per dataset (and one for all): prompts and τ of each drafter; none when
    the offline evaluator did not run."""
    if not report.get("prompts"):
        return []
    methods = ["eagle3", *report["baselines"]]
    overall = {"eagle3": report["acceptance_length"]} | {
        m: s["acceptance_length"] for m, s in report["baselines"].items()}
    intervals = {"eagle3": report.get("acceptance_length_ci95")} | {
        m: s.get("ci95") for m, s in report["baselines"].items()}
    rows = [{"dataset": "all", "prompts": report["prompts"]["count"],
             **{f"tau_{m}": _round(overall[m]) for m in methods},
             **{f"ci95_{m}": _interval(intervals.get(m)) for m in methods},
             **{f"eagle3_vs_{m}": s.get("trained_is") for m, s in report["baselines"].items()}}]
    for ds, v in report["per_dataset"].items():
        rows.append({"dataset": ds, "prompts": v["prompts"],
                     **{f"tau_{m}": _round(v.get(m)) for m in methods},
                     **{f"ci95_{m}": _interval((v.get("ci95") or {}).get(m)) for m in methods},
                     **{f"eagle3_vs_{m}": (v.get("trained_is") or {}).get(m)
                        for m in methods[1:]}})
    return rows


def _interval(ci: list[float] | None) -> str | None:
    return None if not ci or None in ci else f"{ci[0]:.3f}–{ci[1]:.3f}"


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


@task(name="evaluation-report", cache_policy=NO_CACHE)
def evaluation_report_task(report: dict[str, Any], workdir: str, run_name: str,
                           artifact_key: str, host: HostSpec | None = None,
                           serving: dict[str, Any] | None = None) -> dict[str, Any]:
    """Publish the evaluation: with `serving` (``{"rows", "verdict"}`` of the serving
    benchmark) first added to ``report.json`` (`eyas.evaluate.run.attach_serving`, on the host
    when remote); the HTML page ``<workdir>/evaluate/report.html`` (drawn here and copied to
    the host when remote); artifacts: a markdown summary with the pictures inline, a table of
    τ per dataset, a link to the page.

    Returns ``{"report": the report, "html": the page's path}`` (on the host when remote).
    """
    from eyas.evaluate.accept_check import accept_check
    from eyas.evaluate.report import markdown_summary, pictures, write_html
    from eyas.evaluate.run import attach_serving_command, check_serving

    layout = RunLayout(Path(workdir))
    out, page = layout.evaluate_dir, layout.report_html
    with tempfile.TemporaryDirectory() as tmp, open_host(host) as h:
        if serving is not None:  # (a GPU host's: serving needs one)
            report = {**report, "serving": check_serving(serving)}
            report["accept_check"] = accept_check(report)
            remote_json = f"{out}/.serving.json"
            h.write_text(remote_json, json.dumps(serving))
            result = h.run(attach_serving_command(h.spec.eyas_python, out=str(out),
                                                  serving_json=remote_json), check=False)
            if not result.ok:
                raise RemoteError(f"{h.spec.login}: attaching the serving rows failed: "
                                  f"{result.stderr.strip()[-500:]}")
        if serving is not None or not h.exists(str(page)):
            h.put_file(write_html(report, Path(tmp) / "report.html"), str(page))
        link, on = h.uri(page), h.on
    pics = pictures(report)
    md = markdown_summary(report, f"{page}{on}")
    for name, alt in (("datasets", "τ per dataset with the baselines"),
                      ("positions", "acceptance by draft position"),
                      ("serving", "served throughput by batch size")):
        if name in pics:
            md += f"\n![{alt}](data:image/png;base64,{base64.b64encode(pics[name]).decode()})\n"
    create_markdown_artifact(md, key=f"{artifact_key}-summary",
                             description="Drafter evaluation: τ, baselines, predicted speedup")
    if dataset_rows(report):
        create_table_artifact(dataset_rows(report), key=f"{artifact_key}-datasets",
                              description=f"Acceptance length τ per dataset ({report['mode']}, "
                              f"{report['draft_tokens']} draft tokens)")
    create_link_artifact(link, link_text=str(page), key=f"{artifact_key}-report",
                         description="The evaluation's self-contained HTML report" + on)
    return {"report": report, "html": str(page)}


# -- the model card ----------------------------------------------------------------------------
@task(name="model-card", cache_policy=NO_CACHE)
def model_card_task(cfg: PipelineConfig, workdir: str, host: HostSpec | None,
                    report: dict[str, Any]) -> str | None:
    """Write the drafter folder's ``README.md`` (`eyas.evaluate.model_card`) from `report`,
    ``merged/stats.json`` and the export's manifest, where the run's folder is; returns its
    path, or None when the drafter is not an exported folder (a training ``best/``)."""
    from eyas.evaluate.model_card import CARD, EXPORT_ARCHITECTURE, model_card
    from eyas.manifest import code_version

    drafter = drafter_path(cfg, workdir, host)
    paths = {"config": f"{drafter}/config.json", "manifest": f"{drafter}/manifest.json",
             "stats": str(RunLayout(Path(workdir)).merged_stats)}

    def card(read) -> str | None:
        found = {name: read(path) for name, path in paths.items()}
        if EXPORT_ARCHITECTURE not in ((found["config"] or {}).get("architectures") or []):
            return None
        scfg = cfg.evaluate.serving
        return model_card(report, run=cfg.name, target=target_path(cfg, host), drafter=drafter,
                          train=cfg.train.model_dump(mode="json"), stats=found["stats"],
                          manifest=found["manifest"], tp_size=scfg.tp_size if scfg else 1,
                          trust_remote_code=cfg.target.trust_remote_code,
                          extra_args=scfg.extra_server_args if scfg else None,
                          code_version=code_version(),
                          rejection_sampling=bool(scfg and scfg.rejection_sampling))

    out = f"{drafter}/{CARD}"
    with open_host(host) as h:
        text = card(lambda p: json.loads(h.read_text(p)) if h.exists(p) else None)
        if text is not None:
            h.write_text(out, text)
    if text is None:
        get_run_logger().info("%s is not an exported drafter folder: no model card", drafter)
        return None
    get_run_logger().info("model card: %s", out)
    return out
