"""Prefect task for the serving benchmark: a thin wrapper over `eyas.evaluate.serving`.

The task takes a `HostSpec` (plain data) and a `ServingConfig`, opens its own connection, and
holds the host's job slot and `tp_size` of its GPU slots while servers run. Its detached jobs
carry the flow run in their ids (`tasks.jobs.flow_job_id`), so a flow's ``on_cancellation``
hook (`tasks.jobs.cancel_remote_jobs`) stops them even when this process is gone. It leaves a
table artifact of the rows with the verdict as its description, and returns the result dict
(``rows``, ``verdict``, ``comparisons``, ``servers``, ``warnings`` ...), also written as JSON
to `out_path` when given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from eyas.evaluate.serving import run_serving_benchmark
from eyas.evaluate.serving_config import ServingConfig
from eyas.io import write_json
from eyas.remote.hosts import HostSpec, connect
from tasks import limits
from tasks.artifacts import artifact_key
from tasks.jobs import flow_job_id


@contextlib.contextmanager
def gpu_slots(spec: HostSpec, gpus: int) -> Iterator[None]:
    """Hold one job slot of the host and `gpus` of its GPU slots (at most all of them)."""
    host_name, gpu_name = limits.host_pool_name(spec), limits.gpu_pool_name(spec)
    total = max(1, spec.num_gpus)
    limits.ensure_pool(host_name, limits.HOST_JOBS)
    limits.ensure_pool(gpu_name, total)
    with limits.hold_slots({host_name: 1}), limits.hold_slots({gpu_name: min(gpus, total)}):
        yield


@task(name="serving-benchmark", retries=0, cache_policy=NO_CACHE)
def serving_benchmark_task(
    spec: HostSpec,
    cfg: ServingConfig,
    model_path: str,
    draft_model_path: str,
    prompts_path: str,
    trust_remote_code: bool = False,
    out_path: str | None = None,
) -> dict:
    """Benchmark SGLang without and with the drafter on the host (paths are on the host).

    Not retried: a second sweep would only repeat a failure that its message explains (a
    missing folder, a server that does not start), at the price of reloading the target.
    """
    logger = get_run_logger()
    with gpu_slots(spec, cfg.tp_size), connect(spec) as host:
        result = run_serving_benchmark(
            host, cfg, model_path=model_path, draft_model_path=draft_model_path,
            prompts_path=prompts_path, trust_remote_code=trust_remote_code,
            job_id=flow_job_id, say=logger.info)
    data = result.to_dict()
    if out_path:
        write_json(out_path, data)
    create_table_artifact(result.rows, key=artifact_key("serving-benchmark"),
                          description=result.verdict)
    for warning in result.warnings:
        logger.warning("%s", warning)
    return data
