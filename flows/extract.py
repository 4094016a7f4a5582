"""The `extract-hidden-states` flow: phase 4, one Prefect task per shard, for each split.

    per split (train, then eval): plan (where the data is) -> disk plan + refusal (markdown
    artifact) -> one task per shard, submitted at once to a bounded thread pool and gated by
    the host's GPU concurrency limit (``eyas-gpu-<host>``, created with one slot per GPU when
    missing) -> progress artifact moving as shards finish -> table of shard states + actual vs
    estimated bytes.

A rerun skips every shard whose manifest verifies (the task reports it "skipped");
``only_failed=True`` does not even submit those: only missing, interrupted, corrupted or
stale shards run. A failed shard retries with backoff and jitter (not for configuration or
disk errors); the flow then fails, naming the shards, after publishing every split's table.

Several hosts (`host_blocks`) share a split's shards: each shard is placed on one host
(`eyas.extract.placement`: deterministic, weighted by what each host runs at once, recorded in
``hidden/<split>/placement.json`` on the first host, where the run lives and training reads).
Without shared storage the merged split is staged on the other hosts (verified) and each shard
they finish is delivered to the first host (verified against its manifest) and removed there.
With the SGLang backend a host runs one job per engine (``tp_size`` GPUs) for all its shards,
the engine loaded once (`tasks.engines`); each shard keeps its own task and state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.futures import as_completed, wait
from prefect.task_runners import ThreadPoolTaskRunner

from eyas.config import PipelineConfig, load_config
from eyas.disk import human_bytes
from eyas.errors import ConfigError, EyasError
from eyas.extract.placement import (
    engine_groups,
    place,
    placement_record,
    recorded_placement,
    split_among,
)
from eyas.extract.run import shard_estimate, summarize
from eyas.layout import SPLITS
from eyas.remote.hosts import HostSpec
from tasks import engines
from tasks.artifacts import artifact_key
from tasks.extract import (
    SHARD_RETRIES,
    SHARD_RETRY_DELAYS,
    disk_task,
    engine_queues,
    gpu_count,
    gpu_spec,
    hidden_path,
    one_job_per_engine,
    placed_shard_task,
    plan_task,
    read_placement,
    shard_task,
    stage_input_task,
    write_placement,
)
from tasks.hosts import host_spec, resolve_run
from tasks.jobs import cancel_remote_jobs
from tasks.limits import ensure_limit, gpu_limit_name

MAX_WORKERS = 16
"""Threads submitting shards; the GPU concurrency limit decides how many actually run."""


@flow(name="extract-hidden-states", task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS),
      log_prints=True, on_cancellation=[cancel_remote_jobs])
def extract_hidden_states(
    config_path: str,
    workdir: str,
    host_block: str | None = None,
    splits: list[str] | None = None,
    only_failed: bool = False,
    shards: list[int] | None = None,
    retries: int = SHARD_RETRIES,
    retry_delay_seconds: list[float] | None = None,
    host_blocks: list[str] | None = None,
    shared_storage: bool = False,
) -> dict[str, dict[str, Any]]:
    """Extract the hidden states of ``<workdir>/merged/<split>.jsonl`` into
    ``<workdir>/hidden/<split>/``, one task per shard, for each split.

    Args:
        config_path: the pipeline YAML (its ``extract`` section and target).
        workdir: the run's folder -- on the host when `host_block` is given.
        host_block: name of a saved ``GpuHost`` block; each shard then runs there as a
            detached job with its log streamed here. None: this machine.
        splits: which of ``train`` and ``eval`` (default: both; training evaluates on eval).
        only_failed: submit only shards that are not complete (missing, failed, corrupted).
        shards: only these shard indices, in each split (default: all).
        retries: retries of a failed shard.
        retry_delay_seconds: backoff before each retry (default [30, 120]), with 50 % jitter.
        host_blocks: more saved ``GpuHost`` blocks sharing the shards (after `host_block`, if
            given). The first host of the list is where the run lives: its ``merged/`` is the
            input, its ``hidden/`` receives every shard, training runs there. A relative
            `workdir` is taken under each host's ``data_root``.
        shared_storage: the hosts see the same files at `workdir` (one shared volume): shards
            are written in place, nothing is copied between hosts.

    Returns ``{split: summary}``: per-shard rows, totals, estimated and actual bytes. Raises
    EyasError after the artifacts are published when a shard failed; DiskSpaceError before
    any work of a split that does not fit.
    """
    splits = list(splits or SPLITS)
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise ConfigError(f"unknown splits {unknown}; choose from {list(SPLITS)}", where="splits")
    blocks = [b for b in [host_block, *(host_blocks or [])] if b]
    raw_workdir = workdir
    config_path, workdir, host = resolve_run(config_path, workdir, host_block)
    cfg = load_config(config_path)
    delays = retry_delay_seconds or SHARD_RETRY_DELAYS
    run = run_hosts(blocks, raw_workdir, workdir, host, cfg, shared_storage=shared_storage)
    results, failed = {}, []
    if run is None:
        # One host, one job (or in-process run) per shard holding one GPU slot.
        ensure_limit(gpu_limit_name(gpu_spec(host)), gpu_count(host))
        task = shard_task.with_options(retries=retries, retry_delay_seconds=delays)
        for split in splits:
            results[split], errors = _extract_split(cfg, config_path, workdir, host, split, task,
                                                    only_failed=only_failed, shards=shards)
            failed += errors
    else:
        for spec in run.specs:  # one slot per GPU unless the operator set the limit already
            ensure_limit(gpu_limit_name(spec), max(1, spec.num_gpus))
        task = placed_shard_task.with_options(retries=retries, retry_delay_seconds=delays)
        for split in splits:
            results[split], errors = _extract_split_placed(cfg, config_path, run, split, task,
                                                           only_failed=only_failed, shards=shards)
            failed += errors
    if failed:
        logger = get_run_logger()
        for line in failed:
            logger.error(line)
        raise EyasError(f"{len(failed)} shard(s) failed; rerun with only_failed=True to redo only "
                        "those (complete shards are kept):\n  " + "\n  ".join(failed))
    return results


def _extract_split(cfg: PipelineConfig, config_path: str, workdir: str, host: HostSpec | None,
                   split: str, task: Any, *, only_failed: bool,
                   shards: list[int] | None) -> tuple[dict[str, Any], list[str]]:
    """One split: plan, disk check, its shards; returns its summary and the failures."""
    logger = get_run_logger()
    key = artifact_key("extract", cfg.name, split)
    plan = plan_task(config_path, workdir, split, host, shards)
    disk_task(plan, split, cfg.extract.disk_margin, host.login if host else "local", key)

    todo = set(plan["todo"])
    specs = [s for s in plan["specs"] if s["index"] in todo] if only_failed else plan["specs"]
    logger.info("%s: %d shard(s) to submit (%d already complete%s)", split, len(specs),
                len(plan["specs"]) - len(todo), ", left out" if only_failed else ", will be skipped")

    progress = create_progress_artifact(0.0, key=f"{key}-progress",
                                        description=f"Shards of {split} finished")
    futures = {s["index"]: task.submit(config_path, workdir, split, s, plan["model_dir"], host)
               for s in specs}
    for done, _ in enumerate(as_completed(list(futures.values())), start=1):
        update_progress_artifact(progress, progress=100.0 * done / max(1, len(futures)))
    wait(list(futures.values()))
    if not futures:
        update_progress_artifact(progress, progress=100.0)

    rows, failed = _rows(cfg, plan, split, futures)
    summary = {"split": split, "storage": cfg.extract.storage,
               "host": host.login if host else "local", "out": plan["out"], "shards": rows,
               "left_out_complete": len(plan["specs"]) - len(specs), **summarize(rows)}
    _publish(summary, key, split)
    return summary, failed


def _rows(cfg: PipelineConfig, plan: dict, split: str, futures: dict[int, Any],
          extra: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], list[str]]:
    """The shards table's rows of finished shard tasks (by index), and one line per failure.
    `extra` names more keys of a task's result to keep (``host``)."""
    by_index = {s["index"]: s for s in plan["specs"]}
    rows, failed = [], []
    for index, fut in sorted(futures.items()):
        spec = by_index[index]
        est = shard_estimate(spec["num_tokens"], spec["num_samples"], plan["hidden_size"],
                             cfg.extract)
        if fut.state.is_completed():
            r = fut.result()
            rows.append({"shard": r["shard"], "samples": r["samples"], "tokens": r["tokens"],
                         "status": r["status"], "quarantined": r["quarantined"],
                         "bytes": r["bytes"], "estimated_bytes": est, "message": "",
                         **{k: r.get(k) for k in extra}})
        else:
            msg = (fut.state.message or fut.state.name).splitlines()[0][:200]
            failed.append(f"{split} shard {index:05d}: {msg}")
            rows.append({"shard": f"shard-{index:05d}", "samples": spec["num_samples"],
                         "tokens": spec["num_tokens"], "status": "failed", "quarantined": 0,
                         "bytes": 0, "estimated_bytes": est, "message": msg,
                         **{k: None for k in extra}})
    return rows, failed


def _publish(summary: dict[str, Any], key: str, split: str) -> None:
    """The shards table and the bytes artifact of a split's summary."""
    rows = summary["shards"]
    create_table_artifact(rows, key=f"{key}-shards",
                          description=f"Shard states, {split} ({summary['host']})")
    actual, estimated = summary["actual_bytes"], summary["estimated_bytes"]
    create_markdown_artifact(
        f"## Extraction {split}: {len(rows) - summary['failed']}/{len(rows)} shard(s) done\n\n"
        f"| | |\n|---|---|\n| extracted / skipped / failed | {summary['extracted']} / "
        f"{summary['skipped']} / {summary['failed']} |\n| samples / tokens | "
        f"{summary['samples']:,} / {summary['tokens']:,} |\n"
        f"| actual bytes | {human_bytes(actual)} ({actual:,}) |\n"
        f"| estimated bytes | {human_bytes(estimated)} ({estimated:,}) |\n"
        f"| actual / estimated | {summary['actual_over_estimate']} |\n",
        key=f"{key}-bytes", description=f"Actual vs estimated bytes, {split}")


# -- several hosts, or engine jobs ----------------------------------------------------------
@dataclass(frozen=True)
class RunHosts:
    """The hosts sharing an extraction and the run's folder on each; the first is the run's
    home (its ``merged/`` is the input, its ``hidden/`` receives every shard)."""

    specs: list[HostSpec]
    workdirs: list[str]
    shared: bool
    """The hosts see the same files at their workdirs: shards are written in place."""

    @property
    def home(self) -> tuple[HostSpec, str]:
        return self.specs[0], self.workdirs[0]


def run_hosts(blocks: list[str], raw_workdir: str, workdir: str, host: HostSpec | None,
              cfg: PipelineConfig, *, shared_storage: bool) -> RunHosts | None:
    """The hosts of a placed extraction: several blocks, or one host whose shards run in
    engine jobs (the SGLang backend; this machine gets a local host whose jobs live in
    ``<workdir>/.eyas/jobs``). None for the one-host, one-shard-per-GPU path."""
    if len(blocks) > 1:
        specs = [host_spec(b) for b in blocks]
        logins = [s.login for s in specs]
        if len(set(logins)) != len(logins):
            raise ConfigError(f"a host is listed twice: {logins}", where="host_blocks")
        workdirs = [raw_workdir if raw_workdir.startswith("/")
                    else f"{s.data_root.rstrip('/')}/{raw_workdir}" for s in specs]
        return RunHosts(specs, workdirs, shared_storage)
    if not one_job_per_engine(cfg.extract):
        return None
    if host is None:
        import torch

        host = HostSpec.local(data_root=workdir, num_gpus=torch.cuda.device_count())
    return RunHosts([host], [workdir], True)


def _extract_split_placed(cfg: PipelineConfig, config_path: str, run: RunHosts, split: str,
                          task: Any, *, only_failed: bool,
                          shards: list[int] | None) -> tuple[dict[str, Any], list[str]]:
    """One split over `run`'s hosts: plan on the home host, placement (recorded there), each
    host made ready (disk, merged input), shard tasks (engine jobs for SGLang); returns its
    summary and the failures."""
    key = artifact_key("extract", cfg.name, split)
    home, home_wd = run.home
    plan = plan_task(config_path, home_wd, split, None if home.kind == "local" else home, shards)
    disk_task(plan, split, cfg.extract.disk_margin, home.login, key)
    placement = _place(cfg, run, split, plan)
    _ready_hosts(cfg, run, split, plan, placement, key)
    futures, jobs = _run_placed(cfg, config_path, run, split, plan, placement, task, key)

    rows, failed = _rows(cfg, plan, split, futures, extra=("host",))
    if not only_failed:  # complete shards: shown as skipped, nothing run for them
        specs = {s["index"]: s for s in plan["specs"]}
        rows += [{"shard": r["shard"], "samples": r["samples"], "tokens": r["tokens"],
                  "status": "skipped", "quarantined": r["quarantined"], "bytes": r["bytes"],
                  "estimated_bytes": shard_estimate(specs[int(i)]["num_tokens"],
                                                    specs[int(i)]["num_samples"],
                                                    plan["hidden_size"], cfg.extract),
                  "message": "", "host": home.login} for i, r in plan["complete"].items()]
        rows.sort(key=lambda r: r["shard"])
    summary = {"split": split, "storage": cfg.extract.storage, "host": home.login,
               "hosts": [s.login for s in run.specs], "shared_storage": run.shared,
               "out": plan["out"], "shards": rows,
               "placement": {f"{i:05d}": h for i, h in placement.items()},
               "left_out_complete": len(plan["complete"]) if only_failed else 0,
               "engine_jobs": jobs, **summarize(rows)}
    _publish(summary, key, split)
    return summary, failed


def _place(cfg: PipelineConfig, run: RunHosts, split: str, plan: dict) -> dict[int, str]:
    """{shard index: host login} of the shards still to do, weighted by what each host runs
    at once (its GPUs, or its engines); the record on the home host is read, then updated."""
    engine = one_job_per_engine(cfg.extract)
    weights = [(s.login, len(engine_groups(s.num_gpus, cfg.extract.tp_size, where=s.login))
                if engine else max(1, s.num_gpus)) for s in run.specs]
    home, home_wd = run.home
    previous = read_placement(home, home_wd, split)
    placement = place(plan["todo"], weights, recorded_placement(previous))
    write_placement(home, home_wd, split, placement_record(placement, weights, previous))
    counts = {login: list(placement.values()).count(login) for login, _ in weights}
    get_run_logger().info("%s: %d shard(s) to do: %s", split, len(placement),
                          "; ".join(f"{login}: {n}" for login, n in counts.items()))
    return placement


def _ready_hosts(cfg: PipelineConfig, run: RunHosts, split: str, plan: dict,
                 placement: dict[int, str], key: str) -> None:
    """Without shared storage, each other host with shards to do: its disk checked against
    its share of the estimate (artifact ``<key>-<host>-plan``), the merged split staged."""
    home, home_wd = run.home
    if run.shared:
        return
    specs = {s["index"]: s for s in plan["specs"]}
    for spec, wd in zip(run.specs[1:], run.workdirs[1:], strict=True):
        indices = [i for i, login in placement.items() if login == spec.login]
        if not indices:
            continue
        needed = sum(shard_estimate(specs[i]["num_tokens"], specs[i]["num_samples"],
                                    plan["hidden_size"], cfg.extract) for i in indices)
        own = {**plan, "todo": indices, "out": hidden_path(wd, split), "needed_bytes": needed,
               "free_bytes": _free_bytes(spec, hidden_path(wd, split))}
        disk_task(own, split, cfg.extract.disk_margin, spec.login, artifact_key(key, spec.login))
        stage_input_task(home, home_wd, spec, wd, split)


def _run_placed(cfg: PipelineConfig, config_path: str, run: RunHosts, split: str, plan: dict,
                placement: dict[int, str], task: Any, key: str) -> tuple[dict[int, Any], list[str]]:
    """Submit one task per placed shard (engine queues started first for SGLang) and wait for
    them; returns the futures by index and the ids of the engine jobs that ran."""
    home, home_wd = run.home
    by_login = {s.login: (s, wd) for s, wd in zip(run.specs, run.workdirs, strict=True)}
    specs = {s["index"]: s for s in plan["specs"]}
    copy = not run.shared
    queues: list[Any] = []
    engine_keys: dict[int, str] = {}
    futures: dict[int, Any] = {}
    progress = create_progress_artifact(0.0, key=f"{key}-progress",
                                        description=f"Shards of {split} finished")
    try:
        if one_job_per_engine(cfg.extract):
            for login, (spec, wd) in by_login.items():
                indices = [i for i, h in placement.items() if h == login]
                if not indices:
                    continue
                host_queues = engine_queues(spec, wd, split, plan["model_dir"], cfg.extract,
                                            cfg.target.trust_remote_code, get_run_logger(),
                                            cfg.name)
                queues += host_queues
                for q, group in zip(host_queues, split_among(indices, len(host_queues)),
                                    strict=True):
                    qkey = engines.register(q)
                    q.submit(group)
                    engine_keys.update({i: qkey for i in group})
        for index in sorted(placement):
            spec, wd = by_login[placement[index]]
            deliver = copy and spec.login != home.login
            futures[index] = task.submit(config_path, split, specs[index], plan["model_dir"],
                                         spec, wd, engine_keys.get(index),
                                         home if deliver else None, home_wd if deliver else None)
        for done, _ in enumerate(as_completed(list(futures.values())), start=1):
            update_progress_artifact(progress, progress=100.0 * done / max(1, len(futures)))
        wait(list(futures.values()))
    except BaseException:
        for q in queues:  # the flow is failing or being cancelled: stop the engines' jobs
            q.close(cancel_running=True)
        raise
    finally:
        for q in queues:
            q.close()
        for k in set(engine_keys.values()):
            engines.unregister(k)
    if not futures:
        update_progress_artifact(progress, progress=100.0)
    return futures, sorted(j for q in queues for j in q.jobs)


def _free_bytes(spec: HostSpec, path: str) -> int:
    from eyas.remote.hosts import connect

    with connect(spec) as h:
        return h.disk_free(path)
