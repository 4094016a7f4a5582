"""Prefect tasks for phase 5 (drafter training): thin wrappers over `eyas.train`.

Tasks take the config *path*, the workdir, the data kind and a `HostSpec` (plain data).
Locally the drafter trains in this process (`eyas.train.run.train_drafter`); on a host it
trains as a detached job (``python -m eyas.train.run ...`` with the host venv's python) whose
log lines stream into the Prefect logger, and which is cancelled when the task is. Either way
the run holds one GPU slot of its host (`tasks.limits.host_slot`) and resumes from
``<workdir>/drafter/checkpoint`` when one is there: a finished run is not trained again.

Data:
- ``offline``: the extraction shards ``<workdir>/hidden/train`` (and ``hidden/eval`` when it
  holds shards) -- `eyas extract` makes them;
- ``online``: ``<workdir>/merged/train.jsonl`` and ``eval.jsonl``, the target running in the
  training process (small targets).
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prefect import get_run_logger, task
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE

from eyas.config import load_config
from eyas.errors import ConfigError, DataError, RemoteError
from eyas.io import read_json
from eyas.layout import RunLayout
from eyas.remote.hosts import HostSpec
from eyas.train.report import evaluation_rows, summary_markdown, training_picture
from tasks.extract import host_python, target_path
from tasks.limits import host_slot
from tasks.retries import USER_ERRORS, retry_unless

DATA_KINDS = ("offline", "online")
PROGRESS_INTERVAL_S = 3.0
"""The progress artifact moves at most this often (every API call costs the server)."""
_STEP_LINE = re.compile(r"^step\s+(\d+)\s")


class ThrottledProgress:
    """Moves a progress artifact to ``100 * step / steps``, at most every `interval` seconds
    (the final step always goes through)."""

    def __init__(self, artifact_id: str | None, steps: int,
                 interval: float = PROGRESS_INTERVAL_S) -> None:
        self.artifact_id = uuid.UUID(artifact_id) if artifact_id else None
        self.steps, self.interval = steps, interval
        self._last = -float("inf")
        self._lock = threading.Lock()
        self.updates = 0

    def __call__(self, step: int) -> None:
        if self.artifact_id is None:
            return
        now = time.monotonic()
        with self._lock:
            if step < self.steps and now - self._last < self.interval:
                return
            self._last = now
            self.updates += 1
        update_progress_artifact(self.artifact_id, min(100.0, 100.0 * step / self.steps),
                                 description=f"Drafter training: step {step} of {self.steps}")


def _format(record: dict) -> str:
    acc = " ".join(f"{a:.2f}" for a in record["acc"])
    if record["kind"] == "train":
        return (f"step {record['step']}  loss {record['loss']:.4f}  lr {record['lr']:.2e}  "
                f"acc [{acc}]  {record.get('tok_s', 0):.0f} tok/s")
    return (f"eval @ {record['step']}  loss {record['loss']:.4f}  acc [{acc}]  "
            f"simulated acceptance length {record['simulated_acceptance_length']:.3f}")


def _status(summary: dict, steps: int) -> str:
    if summary.get("resumed_from") is not None and summary["resumed_from"] >= steps:
        return "complete"  # found finished: nothing trained, export refreshed
    return "resumed" if summary.get("resumed_from") is not None else "trained"


# -- local ----------------------------------------------------------------------------------
def _train_local(config_path: str, workdir: str, data: str,
                 on_record: Callable[[dict], None]) -> dict:
    from eyas.train.data import OfflineSource, OnlineSource
    from eyas.train.run import train_drafter

    cfg = load_config(config_path)
    layout = RunLayout(Path(workdir))
    model = Path(target_path(config_path, None))
    logger = get_run_logger()
    if data == "offline":
        train_source: Any = OfflineSource(layout.hidden_dir("train"))
        eval_dir = layout.hidden_dir("eval")
        has_eval = eval_dir.is_dir() and any(p.name.startswith("shard-") for p in eval_dir.iterdir())
        eval_source = OfflineSource(eval_dir) if has_eval else None
    else:
        kw = dict(storage=cfg.train.storage, aux_layers=cfg.extract.aux_layers,
                  topk=cfg.train.online_topk, device=cfg.train.device,
                  trust_remote_code=cfg.target.trust_remote_code)
        if not layout.train.is_file():
            raise DataError("no merged train data (run `eyas prepare` first)", path=layout.train)
        train_source = OnlineSource(layout.train, model, **kw)
        has_eval = layout.eval.is_file() and layout.eval.stat().st_size > 0
        eval_source = OnlineSource(layout.eval, model, **kw) if has_eval else None
    if eval_source is None:
        logger.warning("no %s eval data: no evaluation; the last weights are exported", data)
    summary = train_drafter(train_source, eval_source, model, layout.drafter_dir, cfg.train,
                            aux_layers=train_source.aux_layers, on_log=on_record)
    history_file = layout.drafter_dir / "history.json"
    summary["history"] = read_json(history_file) if history_file.is_file() else []
    return summary


# -- remote ---------------------------------------------------------------------------------
def _train_command(host: HostSpec, cfg: Any, workdir: str, data: str, model: str,
                   config_file: str, has_eval: bool) -> str:
    layout = RunLayout(Path(workdir))
    q = shlex.quote
    cmd = f"{q(host_python(host))} -m eyas.train.run --model {q(model)} " \
          f"--out {q(str(layout.drafter_dir))} --config {q(config_file)}"
    if data == "offline":
        cmd += f" --shards {q(str(layout.hidden_dir('train')))}"
        if has_eval:
            cmd += f" --eval-shards {q(str(layout.hidden_dir('eval')))}"
    else:
        cmd += f" --train-jsonl {q(str(layout.train))}"
        if has_eval:
            cmd += f" --eval-jsonl {q(str(layout.eval))}"
        if cfg.extract.aux_layers:
            cmd += f" --aux-layers {','.join(str(i) for i in cfg.extract.aux_layers)}"
        if cfg.target.trust_remote_code:
            cmd += " --trust-remote-code"
    return cmd


def _train_remote(host: HostSpec, config_path: str, workdir: str, data: str,
                  progress: ThrottledProgress) -> dict:
    from eyas.remote.hosts import connect
    from tasks.jobs import last_json_line, run_remote_job

    logger = get_run_logger()
    cfg = load_config(config_path)
    # One training per run name and host: a restarted flow re-attaches to the running job.
    prefix = "train-" + re.sub(r"[^A-Za-z0-9_.]+", "-", cfg.name)[:40]
    layout = RunLayout(Path(workdir))
    model = target_path(config_path, host)
    config_file = f"{workdir.rstrip('/')}/.eyas/train.yaml"
    eval_input = layout.hidden_dir("eval") if data == "offline" else layout.eval

    def on_line(line: str) -> None:
        m = _STEP_LINE.match(line)
        if m:
            progress(int(m.group(1)))

    with connect(host) as h:
        h.write_text(config_file, yaml.safe_dump(cfg.train.model_dump(mode="json")))
        has_eval = h.exists(str(eval_input))
    cmd = _train_command(host, cfg, workdir, data, model, config_file, has_eval)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    job_id, lines = run_remote_job(
        host, cmd, prefix=prefix, logger=logger, env=env, on_line=on_line,
        uses=[str(layout.drafter_dir), str(layout.hidden_dir("train")), str(layout.merged_dir)])
    summary = last_json_line(lines)
    if summary is None:
        raise RemoteError(f"{host.login}: training job {job_id} printed no summary")
    history_file = str(layout.drafter_dir / "history.json")
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
    if data not in DATA_KINDS:
        raise ConfigError(f"data must be one of {list(DATA_KINDS)}, not {data!r}", where="data")
    logger = get_run_logger()
    steps = load_config(config_path).train.steps
    progress = ThrottledProgress(progress_id, steps)
    spec = host or HostSpec(kind="local", known_hosts=None, data_root="/")
    with host_slot(spec, gpu=True):
        if host is None:
            def on_record(record: dict) -> None:
                logger.info("%s", _format(record))
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
