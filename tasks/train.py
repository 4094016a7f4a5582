"""Prefect tasks for phase 5 (drafter training): thin wrappers over `eyas.train.run`.

Tasks take the config *path*, the workdir, the data kind and a `HostSpec` (plain data).
Locally the drafter trains in this process (`eyas.train.run.train_drafter`); on a host it
trains as a detached job (`eyas.train.run.command`, with the host's eyas interpreter) whose
log streams into the Prefect logger -- its JSON step records turned back into readable lines
and into progress -- and which is cancelled when the task is. Either way the run holds one GPU
slot of its host (`tasks.limits.host_slot`) and resumes from ``<workdir>/drafter/checkpoint``
when one is there: a finished run is not trained again.

Data (`eyas.train.run.data_paths`, read by `eyas.train.run.open_sources`):
- ``offline``: the extraction shards ``<workdir>/hidden/train`` (and ``hidden/eval`` when it
  holds shards) -- `eyas extract` makes them;
- ``online``: ``<workdir>/merged/train.jsonl`` and ``eval.jsonl``, the target running in the
  training process (small targets).
"""

from __future__ import annotations

import base64
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml
from prefect import get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.cache_policies import NO_CACHE

from eyas.config import load_config
from eyas.errors import RemoteError
from eyas.io import read_json
from eyas.layout import RunLayout
from eyas.remote.hosts import HostSpec
from eyas.train import run as core
from eyas.train.report import evaluation_rows, summary_markdown, training_picture
from tasks.extract import OFFLINE_ENV, target_path
from tasks.jobs import last_json_line, run_remote_job
from tasks.limits import host_slot
from tasks.progress import ThrottledProgress
from tasks.retries import USER_ERRORS, retry_unless


def _status(summary: dict, steps: int) -> str:
    if summary.get("resumed_from") is not None and summary["resumed_from"] >= steps:
        return "complete"  # found finished: nothing trained, export refreshed
    return "resumed" if summary.get("resumed_from") is not None else "trained"


# -- local ----------------------------------------------------------------------------------
def _train_local(config_path: str, workdir: str, data: str,
                 on_record: Callable[[dict], None]) -> dict:
    cfg = load_config(config_path)
    out = RunLayout(Path(workdir)).drafter_dir
    model = Path(target_path(config_path, None))
    train, eval_ = core.data_paths(Path(workdir), data)
    train_source, eval_source = core.open_sources(
        data, train, eval_, model, cfg.train, aux_layers=cfg.extract.aux_layers,
        trust_remote_code=cfg.target.trust_remote_code)
    if eval_source is None:
        get_run_logger().warning("no %s eval data in %s: no evaluation; the last weights are "
                                 "exported", data, eval_)
    summary = core.train_drafter(train_source, eval_source, model, out, cfg.train,
                                 aux_layers=train_source.aux_layers, on_log=on_record)
    history_file = out / "history.json"
    summary["history"] = read_json(history_file) if history_file.is_file() else []
    return summary


# -- remote ---------------------------------------------------------------------------------
def _train_remote(host: HostSpec, config_path: str, workdir: str, data: str,
                  progress: ThrottledProgress) -> dict:
    from eyas.remote.hosts import connect

    cfg = load_config(config_path)
    # One training per run name and host: a restarted flow re-attaches to the running job.
    prefix = "train-" + re.sub(r"[^A-Za-z0-9_.]+", "-", cfg.name)[:40]
    out = RunLayout(Path(workdir)).drafter_dir
    train, eval_ = core.data_paths(Path(workdir), data)
    config_file = f"{workdir.rstrip('/')}/.eyas/train.yaml"
    with connect(host) as h:
        h.write_text(config_file, yaml.safe_dump(cfg.train.model_dump(mode="json")))
    cmd = core.command(host.eyas_python, data=data, train=str(train), eval_=str(eval_),
                       model=target_path(config_path, host), out=str(out),
                       config_file=config_file, aux_layers=cfg.extract.aux_layers,
                       trust_remote_code=cfg.target.trust_remote_code)

    def on_line(line: str) -> str | None:
        record = core.parse_record(line)
        if record is None:
            return None
        if record["kind"] == "train":
            progress(record["step"])
        return core.format_record(record)

    job_id, lines = run_remote_job(
        host, cmd, prefix=prefix, logger=get_run_logger(), env=OFFLINE_ENV, on_line=on_line,
        uses=[str(out), str(train), str(eval_)])
    summary = last_json_line(lines)
    if summary is None:
        raise RemoteError(f"{host.login}: training job {job_id} printed no summary")
    history_file = str(out / "history.json")
    with connect(host) as h:
        summary["history"] = json.loads(h.read_text(history_file)) if h.exists(history_file) else []
    return summary


# -- tasks ----------------------------------------------------------------------------------
@task(name="train-drafter", task_run_name="train-drafter-{data}", retries=1,
      retry_delay_seconds=[30], retry_jitter_factor=0.5,
      retry_condition_fn=retry_unless(*USER_ERRORS), cache_policy=NO_CACHE)
def train_task(config_path: str, workdir: str, data: str = "offline",
               host: HostSpec | None = None, progress_id: str | None = None) -> dict:
    """Train (or resume, or find finished) the drafter of `workdir` and export it.

    Returns `train_drafter`'s summary (``steps``, ``resumed_from``, ``export``, ``best``,
    ``draft_vocab_size``) plus ``status`` (trained / resumed / complete), ``history`` (the
    records of ``history.json``) and ``out``. `progress_id` is a progress artifact moved as
    steps go by. Raises ConfigError for an unknown `data`, DataError when the data is missing.
    """
    core.check_data_kind(data)
    logger = get_run_logger()
    steps = load_config(config_path).train.steps
    progress = ThrottledProgress(progress_id, steps, label="Drafter training: step")
    with host_slot(host or HostSpec.local(data_root="/"), gpu=True):
        if host is None:
            def on_record(record: dict) -> None:
                logger.info("%s", core.format_record(record))
                if record["kind"] == "train":
                    progress(record["step"])

            summary = _train_local(config_path, workdir, data, on_record)
        else:
            summary = _train_remote(host, config_path, workdir, data, progress)
    progress(summary["steps"])
    summary["status"] = _status(summary, steps)
    summary["out"] = str(RunLayout(Path(workdir)).drafter_dir)
    logger.info("training %s at step %s; export: %s", summary["status"], summary["steps"],
                summary["export"])
    return summary


@task(name="training-report", cache_policy=NO_CACHE)
def report_task(summary: dict, workdir: str, run_name: str, artifact_key: str,
                host: HostSpec | None = None) -> str:
    """Publish the run's artifacts: the picture of loss and acc_i over steps (PNG in
    ``<workdir>/reports/training.png``, on the host when remote, embedded in a markdown
    artifact), the final evaluation as a table, the export folder as a link.

    Returns the picture's path (on the host when remote).
    """
    history = summary.get("history") or []
    picture = RunLayout(Path(workdir)).workdir / "reports" / "training.png"
    md = summary_markdown(summary, history)
    if history:
        if host is None:
            local = training_picture(history, picture, title=run_name)
            png = local.read_bytes()
        else:
            from eyas.remote.hosts import connect

            with tempfile.TemporaryDirectory() as tmp:
                local = training_picture(history, Path(tmp) / "training.png", title=run_name)
                png = local.read_bytes()
                with connect(host) as h:
                    h.mkdir(str(picture.parent))
                    h.put_file(local, str(picture))
        b64 = base64.b64encode(png).decode()
        md += (f"\n![loss and per-step accuracy](data:image/png;base64,{b64})\n\n"
               f"Picture file: `{picture}`{' on ' + host.login if host else ''}\n")
    else:
        md += "\nNo history to draw (no step was logged).\n"
    create_markdown_artifact(md, key=f"{artifact_key}-summary",
                             description="Drafter training: loss and per-step accuracy")
    best = summary.get("best")
    if best:
        create_table_artifact(evaluation_rows(best), key=f"{artifact_key}-eval",
                              description=f"Final evaluation (step {best['step']}): acc_i and "
                              f"simulated acceptance length "
                              f"{best['simulated_acceptance_length']:.3f}")
    if summary.get("export"):
        export = Path(summary["export"])
        link = (export.resolve().as_uri() if host is None
                else f"sftp://{host.user_name}@{host.host}:{host.port}{export}")
        create_link_artifact(link, link_text=str(export), key=f"{artifact_key}-export",
                             description="Exported SGLang EAGLE-3 drafter folder"
                             + (f" on {host.login}" if host else ""))
    return str(picture)
