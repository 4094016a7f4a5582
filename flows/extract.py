"""The `extract-hidden-states` flow: phase 4, one Prefect task per shard, both splits at once.

    plan train ∥ plan eval (where the data is) -> one disk check for both (markdown artifact;
    refuses before any work) -> one task per shard of every split, submitted at once to a
    bounded thread pool and gated by the host's GPU slot pool (``eyas-gpu-<host>``,
    created with one slot per GPU when missing): the splits run side by side where the host
    has the GPUs -> per split: a progress artifact moving as shards finish, a table of every
    shard's state, actual vs estimated bytes.

A shard whose manifest verifies comes back "Skipped" at once, without waiting for a GPU slot;
``only_failed=True`` does not even submit those (the table still lists them). A failed shard
retries with backoff and jitter (not for configuration or disk errors); the flow then fails,
naming the shards, after publishing every split's artifacts. `extract_splits` is the same
stage inside the `eyas-pipeline` flow.

Several hosts (`host_blocks`) share a split's shards: each shard is placed on one host
(`eyas.extract.placement`: deterministic, weighted by what each host runs at once, recorded in
``hidden/<split>/placement.json`` on the first host, where the run lives and training reads).
Without shared storage the merged split is staged on the other hosts (verified) and each shard
they finish is delivered to the first host (verified against its manifest) and removed there.
With the SGLang backend a host runs one job per engine (``tp_size`` GPUs) for all its shards,
the engine loaded once (`eyas.remote.engines`); each shard keeps its own task and state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.futures import as_completed, wait
from prefect.task_runners import ThreadPoolTaskRunner

from blocks.gpu_host import GpuHost
from eyas import stopping
from eyas.config import PipelineConfig
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
from eyas.layout import SPLITS, RunLayout
from eyas.remote import engines
from eyas.remote.hosts import HostSpec
from eyas.remote.spread import read_placement, write_placement
from tasks.artifacts import artifact_key
from tasks.extract import (
    SHARD_RETRIES,
    SHARD_RETRY_DELAYS,
    disk_task,
    engine_queues,
    gpu_count,
    gpu_spec,
    one_job_per_engine,
    placed_shard_task,
    plan_task,
    shard_task,
    stage_input_task,
)
from tasks.hosts import host_spec, resolve_run, run_lock
from tasks.jobs import cancel_remote_jobs
from tasks.limits import ensure_pool, gpu_pool_name

MAX_WORKERS = 16
"""Threads submitting shards; the GPU slot pool decides how many actually run."""

Split = Literal["train", "eval"]
"""A split of the merged data (``merged/<split>.jsonl`` -> ``hidden/<split>/``)."""


@flow(name="extract-hidden-states", task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS),
      log_prints=True, on_cancellation=[cancel_remote_jobs])
def extract_hidden_states(
    config: PipelineConfig,
    workdir: str,
    host_block: GpuHost | None = None,
    splits: list[Split] | None = None,
    only_failed: bool = False,
    shards: list[int] | None = None,
    retries: int = SHARD_RETRIES,
    retry_delay_seconds: list[float] | None = None,
    host_blocks: list[GpuHost] | None = None,
    shared_storage: bool = False,
) -> dict[str, dict[str, Any]]:
    """Extract the hidden states of ``<workdir>/merged/<split>.jsonl`` into
    ``<workdir>/hidden/<split>/``, one task per shard, every split at once.

    Args:
        config: the pipeline configuration (its ``extract`` section and target); a recipe's
            path is loaded here.
        workdir: the run's folder -- on the host when `host_block` is given.
        host_block: a saved ``GpuHost`` block (picked in the UI, or its name); each shard then runs there as a
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
    any work when the splits do not fit.
    """
    stopping.watch()  # a deployment's run: a cancel's SIGTERM reaches the tasks
    blocks = [b for b in [host_block, *(host_blocks or [])] if b]
    raw_workdir = workdir
    workdir, host = resolve_run(workdir, host_block, config.gpu_env)
    run = (run_hosts(blocks, raw_workdir, workdir, host, config, shared_storage=shared_storage)
           if len(blocks) > 1 else None)
    home, home_workdir = run.home if run else (host, workdir)  # where the run lives
    with run_lock(home_workdir, home, "extract-hidden-states"):
        results, failed = extract_splits(config, workdir, host, splits=splits,
                                         only_failed=only_failed, shards=shards, retries=retries,
                                         retry_delay_seconds=retry_delay_seconds, run=run)
        raise_failed_shards(failed)
        return results


def raise_failed_shards(failed: list[str]) -> None:
    """Log each failed shard and raise EyasError naming them (nothing when none failed)."""
    if not failed:
        return
    logger = get_run_logger()
    for line in failed:
        logger.error(line)
    raise EyasError(f"{len(failed)} shard(s) failed; rerun (or run the `extract-retry-failed` "
                    "deployment) to redo only those, complete shards are kept:\n  "
                    + "\n  ".join(failed))


def extract_splits(cfg: PipelineConfig, workdir: str, host: HostSpec | None, *,
                   splits: list[str] | None = None, only_failed: bool = False,
                   shards: list[int] | None = None, retries: int = SHARD_RETRIES,
                   retry_delay_seconds: list[float] | None = None,
                   wait_for: list[Any] | None = None,
                   run: RunHosts | None = None) -> tuple[dict[str, dict], list[str]]:
    """Phase 4 inside the running flow: plan every split, check the disk for all of them,
    run their shards side by side, publish each split's artifacts.

    With `run` (several hosts), or with the SGLang backend (engine jobs), the shards are
    placed instead (`_extract_split_placed`), one split after the other.

    Returns ``({split: summary}, failures)``; raises DiskSpaceError (from the disk check)
    before any shard runs when the splits do not fit.
    """
    splits = list(dict.fromkeys(splits or SPLITS))
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise ConfigError(f"unknown splits {unknown}; choose from {list(SPLITS)}", where="splits")
    delays = retry_delay_seconds or SHARD_RETRY_DELAYS
    run = run or run_hosts([], workdir, workdir, host, cfg, shared_storage=True)
    if run is not None:
        for spec in run.specs:  # one slot per GPU unless the operator set the limit already
            ensure_pool(gpu_pool_name(spec), max(1, spec.num_gpus))
        placed = placed_shard_task.with_options(retries=retries, retry_delay_seconds=delays)
        results, failed = {}, []
        for split in splits:
            results[split], errors = _extract_split_placed(cfg, run, split, placed,
                                                           only_failed=only_failed, shards=shards,
                                                           wait_for=wait_for)
            failed += errors
        return results, failed
    # One slot per GPU unless the operator set the limit already.
    ensure_pool(gpu_pool_name(gpu_spec(host)), gpu_count(host))
    task = shard_task.with_options(retries=retries, retry_delay_seconds=delays)
    key = artifact_key("extract", cfg.name)
    plan_futures = {s: plan_task.submit(cfg, workdir, s, host, shards, wait_for=wait_for or [])
                    for s in splits}
    plans = {s: f.result() for s, f in plan_futures.items()}
    disk_task(plans, cfg.extract.disk_margin, host.login if host else "local", key)

    logger = get_run_logger()
    futures: dict[Any, tuple[str, dict]] = {}
    progress: dict[str, Any] = {}
    for split, plan in plans.items():
        todo = set(plan["todo"])
        specs = [s for s in plan["specs"] if s["index"] in todo] if only_failed else plan["specs"]
        logger.info("%s: %d shard(s) to submit (%d already complete%s)", split, len(specs),
                    len(plan["specs"]) - len(todo),
                    ", left out" if only_failed else ", reported skipped")
        progress[split] = create_progress_artifact(
            _percent(len(plan["specs"]) - len(todo), len(plan["specs"])),
            key=f"{artifact_key('extract', cfg.name, split)}-progress",
            description=f"Shards of {split} complete")
        for s in specs:
            complete = plan.get("complete", {}).get(str(s["index"]))
            fut = task.submit(cfg, workdir, split, s, plan["model_dir"], host, complete)
            futures[fut] = (split, s)

    done = {s: len(p["specs"]) - len(p["todo"]) for s, p in plans.items()}
    for fut in as_completed(list(futures)):
        split, spec = futures[fut]
        fut.wait()  # its final state, not the server's view of it (which may lag)
        if fut.state.is_completed() and str(spec["index"]) not in plans[split].get("complete", {}):
            done[split] += 1
            update_progress_artifact(progress[split],
                                     _percent(done[split], len(plans[split]["specs"])))
    wait(list(futures))

    results, failed = {}, []
    for split, plan in plans.items():
        mine = {spec["index"]: fut for fut, (s, spec) in futures.items() if s == split}
        summary, errors = _split_summary(cfg, plan, split, mine, host)
        results[split] = summary
        failed += errors
    return results, failed


def _percent(done: int, total: int) -> float:
    return 100.0 * done / total if total else 100.0


def _split_summary(cfg: PipelineConfig, plan: dict, split: str, futures: dict[int, Any],
                   host: HostSpec | None) -> tuple[dict[str, Any], list[str]]:
    """One split's rows (every selected shard: run, skipped, or complete and left out),
    totals and artifacts; returns its summary and the failures."""
    key = artifact_key("extract", cfg.name, split)
    rows, failed = _rows(cfg, plan, split, futures)
    for spec in plan["specs"]:  # complete, left out by only_failed
        if spec["index"] not in futures:
            est = shard_estimate(spec["num_tokens"], spec["num_samples"], plan["hidden_size"],
                                 cfg.extract)
            rows.append({**_row(plan["complete"][str(spec["index"])], est), "status": "complete"})
    rows.sort(key=lambda r: r["shard"])
    where = host.login if host else "local"
    totals = summarize([{**r, "status": "skipped" if r["status"] == "complete" else r["status"]}
                        for r in rows])
    summary = {"split": split, "storage": cfg.extract.storage, "host": where, "out": plan["out"],
               "shards": [r for r in rows if r["status"] != "complete"],
               "left_out_complete": sum(r["status"] == "complete" for r in rows), **totals}
    _publish(summary, rows, key, split)
    return summary, failed


def _row(result: dict, estimated: int) -> dict[str, Any]:
    return {"shard": result["shard"], "samples": result["samples"], "tokens": result["tokens"],
            "status": result["status"], "quarantined": result["quarantined"],
            "bytes": result["bytes"], "estimated_bytes": estimated, "message": ""}


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
            rows.append({**_row(r, est), **{k: r.get(k) for k in extra}})
        else:
            msg = (fut.state.message or fut.state.name).splitlines()[0][:200]
            failed.append(f"{split} shard {index:05d}: {msg}")
            rows.append({"shard": f"shard-{index:05d}", "samples": spec["num_samples"],
                         "tokens": spec["num_tokens"], "status": "failed", "quarantined": 0,
                         "bytes": 0, "estimated_bytes": est, "message": msg,
                         **{k: None for k in extra}})
    return rows, failed


def _publish(summary: dict[str, Any], rows: list[dict[str, Any]], key: str, split: str) -> None:
    """The shards table (`rows`: every shard listed) and the bytes artifact of a split's
    summary."""
    create_table_artifact(rows, key=f"{key}-shards",
                          description=f"Shard states, {split} ({summary['host']})")
    actual, estimated = summary["actual_bytes"], summary["estimated_bytes"]
    create_markdown_artifact(
        f"## Extraction {split}: {len(rows) - summary['failed']}/{len(rows)} shard(s) done\n\n"
        f"| | |\n|---|---|\n| extracted / skipped (complete) / failed | "
        f"{summary['extracted']} / {summary['skipped']} / {summary['failed']} |\n| samples / tokens | "
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
        specs = [s.model_copy(update={"gpu_env": {**s.gpu_env, **cfg.gpu_env}})
                 for s in map(host_spec, blocks)]  # the recipe's gpu_env on every host
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

        host = HostSpec.local(data_root=workdir, num_gpus=torch.cuda.device_count(),
                              gpu_env=cfg.gpu_env)
    return RunHosts([host], [workdir], True)


def _extract_split_placed(cfg: PipelineConfig, run: RunHosts, split: str, task: Any, *,
                          only_failed: bool, shards: list[int] | None,
                          wait_for: list[Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """One split over `run`'s hosts: plan on the home host, placement (recorded there), each
    host made ready (disk, merged input), shard tasks (engine jobs for SGLang); returns its
    summary and the failures."""
    key = artifact_key("extract", cfg.name, split)
    home, home_wd = run.home
    plan = plan_task(cfg, home_wd, split, None if home.kind == "local" else home, shards,
                     wait_for=wait_for or [])
    disk_task({split: plan}, cfg.extract.disk_margin, home.login, key)
    placement = _place(cfg, run, split, plan)
    _ready_hosts(cfg, run, split, plan, placement, key)
    futures, jobs = _run_placed(cfg, run, split, plan, placement, task, key)

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
    _publish(summary, rows, key, split)
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
        out = str(RunLayout(Path(wd)).hidden_dir(split))
        own = {**plan, "todo": indices, "out": out, "needed_bytes": needed,
               "free_bytes": _free_bytes(spec, out)}
        disk_task({split: own}, cfg.extract.disk_margin, spec.login,
                  artifact_key(key, spec.login))
        stage_input_task(home, home_wd, spec, wd, split)


def _run_placed(cfg: PipelineConfig, run: RunHosts, split: str, plan: dict,
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
            futures[index] = task.submit(cfg, split, specs[index], plan["model_dir"],
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
