"""Prefect task of preflight: a thin wrapper over `eyas.preflight.run`.

The checks run as one detached job where the run's folder is, on a GPU host or here
(``python -m eyas.preflight.run --config-json ...`` with that host's eyas interpreter and the
recipe's ``gpu_env``; here in ``<workdir>/.eyas/jobs``), re-attached after a flow restart and
cancelled with the flow, and the report comes back as the job's last line. Stopped, the job
unwinds (`eyas.stopping.run_main`): its disk probe and short training leave nothing behind.
The go/no-go table is published as an artifact (``preflight-<run>``).

Caching (`tasks.caching`): keyed by the task's source, the host, the target's config, the
merged training data and the whole recipe with eyas's code version; a hit only while
``<workdir>/preflight`` holds a GO (its manifest is written on GO only) stamped with those very
inputs and settings (``preflight_from.json``). A NO-GO is never reused: the next run checks again.
"""

from __future__ import annotations

import re
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact

from eyas.config import PipelineConfig
from eyas.errors import EyasError, RemoteError
from eyas.layout import RunLayout
from eyas.manifest import code_version
from eyas.preflight.result import summary_lines, table_rows
from eyas.preflight.run import command, preflight_dir
from eyas.remote.hosts import HostSpec
from eyas.remote.jobs import OFFLINE_ENV, last_json_line
from tasks.artifacts import artifact_key
from tasks.caching import Output, VerifiedOutput, stamp
from tasks.extract import target_path
from tasks.hosts import open_host
from tasks.jobs import run_remote_job


def preflight_output(cfg: PipelineConfig, workdir: str, host: HostSpec | None = None) -> Output:
    """What a GO is made from, for the cache: the target's config and the merged training
    data (inputs), the recipe and eyas's code version (settings), on `host`."""
    from pathlib import Path

    pf = preflight_dir(workdir)
    try:
        target = target_path(cfg, host)
    except EyasError:  # not a model folder: no key, and the capture check names the fix
        target = str(cfg.resolve_path(cfg.target.model))
    inputs = {"target_config": f"{target}/config.json",
              "train": str(RunLayout(Path(workdir)).train)}
    settings = {"recipe": cfg.model_dump(mode="json", exclude={"source_dir"}),
                "code": code_version(), "host": host.login if host else "local"}
    return Output(str(pf), inputs, settings, host=host, stamp=str(pf / "preflight_from.json"))


def publish_table(cfg: PipelineConfig, rep: dict[str, Any], where: str) -> None:
    """The go/no-go table artifact ``preflight-<run>``: each check, its verdict, figure, time,
    detail and the fix when it failed."""
    eta = rep.get("eta") or {}
    verdict = "GO" if rep["ok"] else "NO-GO"
    create_table_artifact(table_rows(rep), key=artifact_key("preflight", cfg.name),
                          description=f"Preflight of {cfg.name} on {where}: {verdict}; ETA "
                                      f"extraction {eta.get('extract_s')} s, training "
                                      f"{eta.get('train_s')} s")


@task(name="preflight", persist_result=True,
      cache_policy=VerifiedOutput(output=lambda p: preflight_output(p["cfg"], p["workdir"],
                                                                    p.get("host"))))
def preflight_task(cfg: PipelineConfig, workdir: str, host: HostSpec | None = None) -> dict:
    """Run the preflight checks of `cfg` for the run at `workdir` (a detached job here, or on
    `host`); publish the table; return the report (``ok`` False on NO-GO)."""
    logger = get_run_logger()
    recipe, cfg = cfg, cfg.resolved()  # the cache keys the recipe as given
    # A detached job where the run's folder is: on the host, or here (``<workdir>/.eyas/jobs``).
    spec = host or HostSpec.local(data_root=workdir)
    config_json = f"{preflight_dir(workdir)}/config.json"
    with open_host(host) as h:
        h.write_text(config_json, cfg.model_dump_json())
    prefix = "preflight-" + re.sub(r"[^A-Za-z0-9_.]+", "-", cfg.name)[:40]
    job_id, lines = run_remote_job(
        spec, command(spec.eyas_python, config_json=config_json, workdir=workdir),
        prefix=prefix, logger=logger, env={**OFFLINE_ENV, **cfg.gpu_env},
        uses=[str(preflight_dir(workdir))], refusal_where="preflight")
    rep = last_json_line(lines)
    if rep is None or "checks" not in rep:
        raise RemoteError(f"{spec.login}: preflight job {job_id} printed no report")
    for line in summary_lines(rep):
        logger.info("%s", line)
    publish_table(cfg, rep, host.login if host else "this machine")
    if rep["ok"]:
        stamp(preflight_output(recipe, workdir, host))
    return rep
