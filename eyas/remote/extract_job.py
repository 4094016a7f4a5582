"""One split's extraction on the run's `Host`: the settings built once (`ExtractJob.of`), the
one command line every way of running it uses, and `run_shard`, which decides how a shard
runs there.

- here: `eyas.extract.shards.extract_shard` in this process, on the device it was given (the
  loaded backend is reused by the next shard; a stop abandons the shard under way and says how
  far it got);
- on a host: ``python -m eyas.extract.run --shards N`` (`eyas.extract.run.command`) as a
  detached job with ``CUDA_VISIBLE_DEVICES`` set to its GPU (`eyas.remote.jobs.run_job`).

The plan (`plan`) goes through `Host.call`, and an SGLang engine's job reads many shards with
the same `command` (`eyas.remote.engines`). Prefect-free: `tasks.extract` adds the slots,
retries and states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eyas import stopping
from eyas.errors import RemoteError
from eyas.extract import run as core
from eyas.extract.config import ExtractConfig
from eyas.extract.shards import ShardSpec, extract_shard
from eyas.layout import RunLayout
from eyas.remote.hosts import Host
from eyas.remote.jobs import OFFLINE_ENV, last_json_line, new_job_id, run_job

if TYPE_CHECKING:
    from eyas.config import PipelineConfig


@dataclass(frozen=True)
class ExtractJob:
    """What the extraction of one split is: its run, split, target and settings."""

    workdir: Path
    """The run's work directory (on the host when remote)."""
    split: str
    model: str
    """The target model folder, where the extraction runs."""
    cfg: ExtractConfig
    trust_remote_code: bool = False

    @classmethod
    def of(cls, cfg: PipelineConfig, workdir: str | Path, split: str, model: str) -> ExtractJob:
        return cls(Path(workdir), split, model, cfg.extract, cfg.target.trust_remote_code)

    @property
    def merged(self) -> str:
        """The merged records it reads (``merged/<split>.jsonl``)."""
        return str(RunLayout(self.workdir).merged(self.split))

    @property
    def out(self) -> str:
        """Where its shards go (``hidden/<split>/``)."""
        return str(RunLayout(self.workdir).hidden_dir(self.split))

    def command(self, python: str, shards: list[int] | None = None, *, plan: bool = False,
                keep_going: bool = False) -> str:
        """``python -m eyas.extract.run`` over `shards` (all: None) with `python` (a host's
        eyas interpreter)."""
        return core.command(python, merged=self.merged, out=self.out, model=self.model,
                            cfg=self.cfg, shards=shards, plan=plan,
                            trust_remote_code=self.trust_remote_code, keep_going=keep_going)

    def plan(self, host: Host, shards: list[int] | None = None) -> dict[str, Any]:
        """`eyas.extract.run.plan_report` where the data is."""
        return host.call(lambda: core.plan_report(Path(self.merged), Path(self.out),
                                                  model_dir=Path(self.model), cfg=self.cfg,
                                                  shards=shards),
                         self.command(host.spec.eyas_python, shards, plan=True),
                         what="planning the extraction", env=OFFLINE_ENV)

    def run_shard(self, host: Host, spec: dict[str, Any], device: str, *,
                  say: Callable[[str], None], warn: Callable[[str], None] | None = None,
                  job_id: Callable[[str], str] = new_job_id) -> dict[str, Any]:
        """Extract shard `spec` (a `ShardSpec` as a dict) on `host`, on `device` (one of
        `Host.devices`); return `extract_shard`'s row. A stop here abandons the shard and
        `warn`s which one and how far it got (then raises `StopRequested`)."""
        if host.spec.kind == "local":
            cfg = self.cfg if self.cfg.device != "auto" else self.cfg.model_copy(
                update={"device": device})
            try:
                return extract_shard(ShardSpec(**spec), Path(self.model), Path(self.out), cfg,
                                     trust_remote_code=self.trust_remote_code)
            except stopping.StopRequested as exc:
                (warn or say)(f"{self.split}: {exc.detail}")
                raise
        env = dict(OFFLINE_ENV)
        if device:
            env["CUDA_VISIBLE_DEVICES"] = device
        prefix = f"extract-{self.split}-{spec['index']:05d}"
        job, lines = run_job(host.spec, self.command(host.spec.eyas_python, [spec["index"]]),
                             prefix=prefix, job_id=job_id(prefix), say=say, env=env,
                             uses=[self.out, self.merged], poll_interval=0.5)
        summary = last_json_line(lines)
        if not summary or not summary.get("shards"):
            raise RemoteError(f"{host.spec.login}: job {job} printed no summary")
        return summary["shards"][0]
