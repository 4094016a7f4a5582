"""Prefect tasks for phase 4 (hidden-state extraction): thin wrappers over `eyas.extract`.

Tasks take the typed `PipelineConfig`, the workdir, the split, a shard's plain `ShardSpec`
dict and a `HostSpec` (plain data) -- never a connection or a model. Each task that touches a
host opens its own connection. A shard the plan found complete comes back "Skipped" at once,
before it waits for a GPU slot. How a shard runs is `eyas.remote.extract_job.ExtractJob`'s
to decide: here in this process; on a host as a detached job (``python -m eyas.extract.run
--shards N``) whose log lines stream into the Prefect logger and which is cancelled when the
task is.

Where the work is done:
- local: ``<workdir>/merged/<split>.jsonl`` -> ``<workdir>/hidden/<split>/``;
- remote (`host` given): the same paths ON THE HOST (`workdir` is a path there), with the
  host's eyas interpreter (``HostSpec.eyas_python``, the venv `eyas.remote.ship` installs
  eyas into); the target model path must be valid on the host too.

Several hosts, or the SGLang backend: `placed_shard_task` runs a shard on the host its
placement chose, in a job of its own (HF) or in its engine's job (`eyas.remote.engines`), and
delivers it to the run's first host when they share no storage (`eyas.remote.spread`, after
`stage_input_task` put the merged split there); the placement record lives beside the shards.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from eyas.config import PipelineConfig
from eyas.devices import DevicePool
from eyas.disk import DiskSpaceError, human_bytes
from eyas.errors import ConfigError, DataError
from eyas.extract.config import ExtractConfig
from eyas.extract.placement import engine_groups
from eyas.extract.plan import check_disk
from eyas.prepare import phases
from eyas.remote import engines, spread
from eyas.remote.extract_job import ExtractJob
from eyas.remote.hosts import HostSpec, connect
from eyas.remote.jobs import OFFLINE_ENV
from tasks.caching import skipped
from tasks.hosts import open_host
from tasks.jobs import flow_job_id
from tasks.limits import gpu_pool_name, hold_slots
from tasks.retries import retry_unless

NOT_RETRIED = (ConfigError, DiskSpaceError)
"""Failures a retry cannot fix (wrong layers, no disk): the shard fails at once."""
SHARD_RETRIES = 2
"""Retries of a failed shard (the flow may ask for another number)."""
SHARD_RETRY_DELAYS = [30, 120]
"""Seconds before each retry of a shard (with 50 % jitter)."""


# -- where things are ---------------------------------------------------------------------
def target_path(cfg: PipelineConfig, host: HostSpec | None) -> str:
    """The target model folder: resolved (and for ``eyas:tiny`` / ``eyas:kimi-replica`` built)
    here when local; taken as written (relative to the YAML) when it lives on a remote host."""
    if host is None or phases.builds_target(cfg.target.model):
        return str(phases.resolve_target(cfg))
    return str(cfg.resolve_path(cfg.target.model))


def gpu_spec(host: HostSpec | None) -> HostSpec:
    """The host whose GPUs a shard holds: `host`, or this machine."""
    return host or HostSpec.local(data_root="/")


def gpu_count(host: HostSpec | None) -> int:
    """GPUs that shards may use at once: the host's (``num_gpus``), here torch's count; >= 1."""
    with open_host(host) as h:
        return max(1, h.gpu_count())


# -- devices --------------------------------------------------------------------------------
_POOLS: dict[str, DevicePool] = {}
_POOLS_LOCK = threading.Lock()


def _pool(host: HostSpec | None) -> DevicePool:
    """The devices of `host` (`eyas.remote.hosts.Host.devices`), one pool per host and process."""
    key = gpu_pool_name(gpu_spec(host))
    with _POOLS_LOCK:
        if key not in _POOLS:
            with open_host(host) as h:
                _POOLS[key] = DevicePool(h.devices())
        return _POOLS[key]


# -- tasks ----------------------------------------------------------------------------------
# No Prefect caching: whether a shard is done is decided by its manifest on disk, which
# survives flow runs, retries and hosts (a cache would not see a shard deleted or corrupted).
@task(name="plan-extraction", task_run_name="plan-extraction-{split}", retries=1,
      retry_delay_seconds=5, cache_policy=NO_CACHE)
def plan_task(cfg: PipelineConfig, workdir: str, split: str, host: HostSpec | None = None,
              shards: list[int] | None = None) -> dict:
    """The shards of `split` and the bytes they need (see `eyas.extract.run.plan_report`),
    computed where the data is. Adds ``model_dir``, ``merged``, ``out``."""
    model = target_path(cfg, host)
    job = ExtractJob.of(cfg, workdir, split, model)
    merged, out = job.merged, job.out
    with open_host(host) as h:
        if not h.exists(merged):
            raise DataError(f"no merged {split} data (run `eyas prepare` first){h.on}",
                            path=merged)
        report = job.plan(h, shards)
    report.update(model_dir=model, merged=merged, out=out)
    get_run_logger().info("%s: %d shard(s), %d to do, %s needed", split, len(report["specs"]),
                          len(report["todo"]), human_bytes(report["needed_bytes"]))
    return report


@task(name="check-disk", cache_policy=NO_CACHE)
def disk_task(plans: dict[str, dict], margin: float, where: str, artifact_key: str) -> int:
    """Publish the estimate of every split to extract (markdown artifact) and refuse
    (DiskSpaceError) unless the output volume holds what is still to do in all of them
    (they may run at the same time) plus `margin`. Returns the free bytes."""
    needed = sum(p["needed_bytes"] for p in plans.values())
    free = min(p["free_bytes"] for p in plans.values())
    rows = []
    for split, plan in plans.items():
        rows += [(f"{split}: shards (selected / to do)", f"{len(plan['specs'])} / {len(plan['todo'])}"),
                 (f"{split}: tokens (selected)", f"{sum(s['num_tokens'] for s in plan['specs']):,}"),
                 (f"{split}: estimated bytes (selected)", human_bytes(plan["estimated_bytes"])),
                 (f"{split}: needed bytes (to do)", human_bytes(plan["needed_bytes"]))]
    first = next(iter(plans.values()))
    rows += [("storage", first["storage"]),
             ("hidden size / aux layers", f"{first['hidden_size']} / {first['aux_layers']}"),
             (f"needed + {margin:.0%} margin", human_bytes(needed * (1 + margin))),
             (f"free on {where}:{first['out']}", human_bytes(free))]
    verdict = "OK" if free >= needed * (1 + margin) else "REFUSED: not enough free space"
    md = (f"## Extraction plan ({', '.join(plans)}): {verdict}\n\n| | |\n|---|---|\n"
          + "".join(f"| {k} | {v} |\n" for k, v in rows))
    create_markdown_artifact(md, key=f"{artifact_key}-plan",
                             description=f"Disk plan, {', '.join(plans)}")
    return check_disk(Path(first["out"]), needed, margin, free=free)


@task(name="extract-shard", task_run_name="extract-{split}-shard-{spec[index]:05d}",
      retries=SHARD_RETRIES, retry_delay_seconds=SHARD_RETRY_DELAYS, retry_jitter_factor=0.5,
      retry_condition_fn=retry_unless(*NOT_RETRIED), cache_policy=NO_CACHE)
def shard_task(cfg: PipelineConfig, workdir: str, split: str, spec: dict, model_dir: str,
               host: HostSpec | None = None, complete: dict | None = None) -> Any:
    """Extract one shard holding one GPU slot of its host; `complete` (the plan's row of a
    shard it found complete) returns a "Skipped" state at once, without waiting for a slot.

    Returns `eyas.extract.shards.extract_shard`'s summary (shard, status, samples, tokens,
    bytes, ...). The slot pool of the host's GPUs (`tasks.limits.gpu_pool_name`) must
    exist (the flow creates it); a missing one is an error, not a warning.
    """
    if complete is not None:
        return skipped(complete, f"{complete['shard']}: complete by its manifest")
    logger = get_run_logger()
    job = ExtractJob.of(cfg, workdir, split, model_dir)
    with hold_slots({gpu_pool_name(gpu_spec(host)): 1}), _pool(host).take() as device, \
            open_host(host) as h:
        result = job.run_shard(h, spec, device, say=lambda line: logger.info("%s", line),
                               warn=lambda line: logger.warning("%s", line), job_id=flow_job_id)
    logger.info("%s: %s (%s samples, %s tokens, %s)", result["shard"], result["status"],
                result["samples"], result["tokens"], human_bytes(result["bytes"]))
    if result["status"] == "skipped":
        return skipped(result, f"{result['shard']}: complete by its manifest")
    return result


# -- several hosts, engine jobs (see flows/extract.py) ---------------------------------------
def one_job_per_engine(cfg: ExtractConfig) -> bool:
    """Whether a host's shards run in engine jobs (`eyas.remote.engines`: one job per engine keeps
    its engine loaded for many shards) -- the SGLang backend -- or one job per shard holding
    one GPU -- the HF backend."""
    return cfg.backend == "sglang"


def engine_queues(host: HostSpec, workdir: str, split: str, model_dir: str, cfg: Any,
                  trust_remote_code: bool, logger: Any, run_name: str) -> list[engines.EngineQueue]:
    """One `EngineQueue` per engine of `host` (`engine_groups`: ``tp_size`` GPUs each), whose
    jobs run ``eyas.extract.run --shards ... --keep-going`` on the split of `workdir`; their
    ids start ``extract-<run_name>-<split>-engine<n>-`` (what a restarted flow re-attaches to:
    one run's engine, never another run's on the same host)."""
    job = ExtractJob(Path(workdir), split, model_dir, cfg, trust_remote_code)
    groups = engine_groups(host.num_gpus, cfg.tp_size, where=host.login)
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", run_name)[:40].strip("-") or "run"

    def command(indices: list[int]) -> str:
        return job.command(host.eyas_python, indices, keep_going=True)

    queues = []
    for n, devices in enumerate(groups):
        env = dict(OFFLINE_ENV)
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = devices
        occupy = len(devices.split(",")) if devices else 1
        queues.append(engines.EngineQueue(
            host, name=f"extract-{slug}-{split}-engine{n}", command=command, env=env,
            uses=[job.out, job.merged], logger=logger, job_id=flow_job_id,
            hold=lambda k=occupy: hold_slots({gpu_pool_name(host): k})))
    return queues


@task(name="stage-input", task_run_name="stage-{split}-on-{host.host}-{host.port}", retries=2,
      retry_delay_seconds=[10, 60], cache_policy=NO_CACHE)
def stage_input_task(home: HostSpec, home_workdir: str, host: HostSpec, workdir: str,
                     split: str) -> str:
    """`eyas.remote.spread.stage_input`: the run's merged `split` on `host`. Returns "present"
    or "copied"."""
    status, sha = spread.stage_input(home, home_workdir, host, workdir, split)
    if status == "copied":
        get_run_logger().info("%s: copied from %s to %s (SHA-256 %s)", split, home.login,
                              host.login, sha[:12])
    return status


@task(name="extract-shard", task_run_name="extract-{split}-shard-{spec[index]:05d}",
      retries=SHARD_RETRIES, retry_delay_seconds=SHARD_RETRY_DELAYS, retry_jitter_factor=0.5,
      retry_condition_fn=retry_unless(*NOT_RETRIED), cache_policy=NO_CACHE)
def placed_shard_task(cfg: PipelineConfig, split: str, spec: dict, model_dir: str,
                      host: HostSpec, workdir: str, engine_key: str | None = None,
                      home: HostSpec | None = None, home_workdir: str | None = None) -> dict:
    """One shard on the host its placement chose (`eyas.extract.placement`).

    With `engine_key` it is extracted in that engine's job (`eyas.remote.engines`); else in a job of
    its own holding one GPU slot of `host`. With `home` (the host where the run lives, when
    the hosts share no storage) it is then delivered there (`deliver_shard`). Returns the row
    of `shard_task` plus ``host`` (and ``delivered_to``).
    """
    logger = get_run_logger()
    if engine_key is not None:
        result = engines.lookup(engine_key).result(spec["index"])
    else:
        job = ExtractJob.of(cfg, workdir, split, model_dir)
        with hold_slots({gpu_pool_name(host): 1}), _pool(host).take() as device, \
                connect(host) as h:
            result = job.run_shard(h, spec, device, say=lambda line: logger.info("%s", line),
                                   job_id=flow_job_id)
    if home is not None:
        spread.deliver_shard(host, workdir, home, home_workdir or workdir, split, result["shard"])
        result["delivered_to"] = home.login
    result["host"] = host.login
    logger.info("%s: %s on %s%s (%s samples, %s tokens, %s)", result["shard"], result["status"],
                host.login, f", delivered to {home.login}" if home is not None else "",
                result["samples"], result["tokens"], human_bytes(result["bytes"]))
    return result
