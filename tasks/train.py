"""Prefect tasks for phase 5 (drafter training): thin wrappers over `eyas.train.run`.

Tasks take the config *path*, the workdir, the data kind and a `HostSpec` (plain data).
Training runs ``train.processes`` processes, by default one per GPU of the host (the block's
``num_gpus``; here, what torch sees), at least one (`eyas.train.launch`):

- here, one process trains in this process (`eyas.train.run.train_drafter`); several run as
  a child (`eyas.train.run.argv`: torchrun's agent and its workers) that dies with this
  process, its output streamed;
- on a host, `eyas.train.run.command` (with the host's eyas interpreter) runs as a detached
  job, re-attached after a flow restart and cancelled with the flow.

Either way the JSON step records of rank 0 come back as readable lines in the Prefect log and
move the progress artifact; other lines (another rank's error) are logged as they are. The run
holds one job slot of its host and a GPU slot per process (`training_slots`), and
resumes from ``<workdir>/drafter/checkpoint`` when one is there: a finished run is not
trained again.

Data (`eyas.train.run.data_paths`, read by `eyas.train.run.open_sources`):
- ``offline``: the extraction shards ``<workdir>/hidden/train`` (and ``hidden/eval`` when it
  holds shards) -- `eyas extract` makes them;
- ``online``: ``<workdir>/merged/train.jsonl`` and ``eval.jsonl``, the target running in the
  training process (small targets).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml
from prefect import get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.concurrency.sync import concurrency

from eyas.config import PipelineConfig, load_config
from eyas.errors import ConfigError, RemoteError
from eyas.io import read_json
from eyas.layout import RunLayout
from eyas.remote.hosts import HostSpec
from eyas.train import run as core
from eyas.train.launch import resolve_processes, run_child
from eyas.train.report import evaluation_rows, summary_markdown, training_picture
from eyas.train.trainer import resolve_device
from tasks import limits
from tasks.extract import OFFLINE_ENV, target_path
from tasks.jobs import last_json_line, run_remote_job
from tasks.progress import ThrottledProgress
from tasks.retries import USER_ERRORS, retry_unless


def _status(summary: dict, steps: int) -> str:
    if summary.get("resumed_from") is not None and summary["resumed_from"] >= steps:
        return "complete"  # found finished: nothing trained, export refreshed
    return "resumed" if summary.get("resumed_from") is not None else "trained"


def processes(cfg: PipelineConfig, host: HostSpec | None) -> int:
    """Training processes for this run: ``train.processes``, else one per GPU of the host
    (the block's ``num_gpus``; here, torch's count), 1 when training runs on the CPU."""
    if cfg.train.device == "cpu":
        gpus = 0
    elif host is None:
        import torch

        gpus = torch.cuda.device_count() if resolve_device(cfg.train.device).type == "cuda" else 0
    else:
        gpus = host.num_gpus
    return resolve_processes(cfg.train.processes, gpus)


@contextlib.contextmanager
def training_slots(spec: HostSpec, n: int) -> Iterator[None]:
    """Hold one job slot of the host and a GPU slot per training process: `n`, or every slot
    of the host's GPU limit when it has fewer (an operator may have lowered it)."""
    host_name, gpu_name = limits.host_limit_name(spec), limits.gpu_limit_name(spec)
    limits.ensure_limit(host_name, limits.HOST_JOBS)
    limits.ensure_limit(gpu_name, max(1, spec.num_gpus, n))
    with get_client(sync_client=True) as client:
        size = client.read_global_concurrency_limit_by_name(gpu_name).limit
    with concurrency(host_name, occupy=1, strict=True), \
            concurrency(gpu_name, occupy=max(1, min(n, size)), strict=True):
        yield


def _config_file(workdir: str) -> str:
    """Where the run's ``train:`` section goes for `eyas.train.run` (``<workdir>/.eyas/``)."""
    return f"{workdir.rstrip('/')}/.eyas/train.yaml"


def _train_yaml(cfg: PipelineConfig) -> str:
    return yaml.safe_dump(cfg.train.model_dump(mode="json"))


def _on_line(progress: ThrottledProgress) -> Callable[[str], str | None]:
    """A training process's line -> the readable line to log instead (None: log it as it is);
    rank 0's step records move `progress`."""

    def on_line(line: str) -> str | None:
        record = core.parse_record(line)
        if record is None:
            return None
        if record["kind"] == "train":
            progress(record["step"])
        return core.format_record(record)

    return on_line


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


def _train_local_processes(config_path: str, workdir: str, data: str, n: int,
                           progress: ThrottledProgress) -> dict:
    """Train with `n` processes here: torchrun's agent as a child of this process."""
    cfg = load_config(config_path)
    logger = get_run_logger()
    out = RunLayout(Path(workdir)).drafter_dir
    train, eval_ = core.data_paths(Path(workdir), data)
    config_file = Path(_config_file(workdir))
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(_train_yaml(cfg))
    argv = core.argv(HostSpec.local().eyas_python, data=data, train=str(train),
                     eval_=str(eval_), model=target_path(config_path, None), out=str(out),
                     config_file=str(config_file), aux_layers=cfg.extract.aux_layers,
                     trust_remote_code=cfg.target.trust_remote_code, processes=n,
                     die_with_parent=True)
    logger.info("training with %d processes here (torchrun): %s", n, " ".join(argv))
    shown = _on_line(progress)
    lines: list[str] = []

    def sink(line: str) -> None:
        lines.append(line)
        readable = shown(line)
        logger.info("%s", line if readable is None else readable)

    code = run_child(argv, env={**os.environ, **OFFLINE_ENV}, on_line=sink)
    if code != 0:
        errors = [x for x in lines if x.startswith("error")] or lines[-20:]
        text = "\n".join(errors[-20:])
        if code == core.USER_ERROR_EXIT:  # a configuration or data error: a retry cannot help
            raise ConfigError(f"training refused its configuration or data:\n{text}",
                              where=config_path)
        raise RuntimeError(f"training ({n} processes) exited with {code}:\n{text}")
    summary = last_json_line(lines)
    if summary is None:
        raise RuntimeError(f"training ({n} processes) printed no summary")
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
    config_file = _config_file(workdir)
    with connect(host) as h:
        h.write_text(config_file, _train_yaml(cfg))
    cmd = core.command(host.eyas_python, data=data, train=str(train), eval_=str(eval_),
                       model=target_path(config_path, host), out=str(out),
                       config_file=config_file, aux_layers=cfg.extract.aux_layers,
                       trust_remote_code=cfg.target.trust_remote_code,
                       processes=processes(cfg, host))
    job_id, lines = run_remote_job(
        host, cmd, prefix=prefix, logger=get_run_logger(), env=OFFLINE_ENV,
        on_line=_on_line(progress), uses=[str(out), str(train), str(eval_)])
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
    records of ``history.json``), ``processes`` and ``out``. `progress_id` is a progress artifact moved as
    steps go by. Raises ConfigError for an unknown `data`, DataError when the data is missing.
    """
    core.check_data_kind(data)
    logger = get_run_logger()
    cfg = load_config(config_path)
    steps, n = cfg.train.steps, processes(cfg, host)
    progress = ThrottledProgress(progress_id, steps, label="Drafter training: step")
    with training_slots(host or HostSpec.local(data_root="/"), n):
        if host is not None:
            summary = _train_remote(host, config_path, workdir, data, progress)
        elif n > 1:
            summary = _train_local_processes(config_path, workdir, data, n, progress)
        else:
            def on_record(record: dict) -> None:
                logger.info("%s", core.format_record(record))
                if record["kind"] == "train":
                    progress(record["step"])

            summary = _train_local(config_path, workdir, data, on_record)
    progress(summary["steps"])
    summary["status"] = _status(summary, steps)
    summary["processes"] = n
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
